//! The models the helper serves: the `--model` directories and every subdirectory of the
//! models directory that has a `config.json` (its id is the directory name), with file
//! lookups confined to each model's directory.

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::paths::is_valid_model_id;

/// One servable model: its id and its canonical directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntry {
    pub id: String,
    pub root: PathBuf,
}

/// Explicit `--model` directories first; then the models directory, scanned on demand so
/// that models installed while the helper runs show up.
#[derive(Debug, Default)]
pub struct Registry {
    explicit: Vec<ModelEntry>,
    models_dir: Option<PathBuf>,
}

/// Most files listed per model (a checkpoint has a few dozen).
const MAX_LISTED_FILES: usize = 4096;
/// Most directory entries looked at while listing one model, or the models directory
/// (a directory of symlinks to itself must not take minutes).
const MAX_SCANNED_ENTRIES: usize = 20_000;

impl Registry {
    /// `models`: resolved model directories. A directory inside the models directory keeps
    /// its installed id (`owner/name` included, as `coli pull` installs it); others are
    /// named by their directory name.
    pub fn new(models: &[PathBuf], models_dir: Option<PathBuf>) -> Result<Self> {
        let mut explicit: Vec<ModelEntry> = Vec::new();
        let installed_root = models_dir.as_ref().and_then(|d| d.canonicalize().ok());
        for m in models {
            let root = m.canonicalize().with_context(|| format!("{}: cannot open the model directory", m.display()))?;
            if !root.join("config.json").is_file() {
                bail!("{}: not a model directory (no config.json)", m.display());
            }
            let installed_id = installed_root
                .as_ref()
                .and_then(|base| root.strip_prefix(base).ok())
                .and_then(|rel| rel.iter().map(|c| c.to_str()).collect::<Option<Vec<_>>>())
                .map(|parts| parts.join("/"))
                .filter(|id| is_valid_model_id(id));
            let id = match installed_id {
                Some(id) => id,
                None => root.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string(),
            };
            if !is_valid_model_id(&id) {
                bail!(
                    "{}: the directory name {id:?} cannot be a model id (use letters, digits, '.', '_', '-')",
                    m.display()
                );
            }
            if explicit.iter().any(|e| e.id == id) {
                bail!("two models are named {id:?}; each --model directory needs its own name");
            }
            explicit.push(ModelEntry { id, root });
        }
        Ok(Registry { explicit, models_dir })
    }

    pub fn models_dir(&self) -> Option<&Path> {
        self.models_dir.as_deref()
    }

    pub fn get(&self, id: &str) -> Option<ModelEntry> {
        if let Some(e) = self.explicit.iter().find(|e| e.id == id) {
            return Some(e.clone());
        }
        if !is_valid_model_id(id) {
            return None;
        }
        let dir = self.models_dir.as_ref()?.join(id);
        let root = dir.canonicalize().ok()?;
        root.join("config.json").is_file().then(|| ModelEntry { id: id.to_string(), root })
    }

    /// Every model, explicit ones first, then the models directory by id.
    pub fn list(&self) -> Vec<ModelEntry> {
        let mut out = self.explicit.clone();
        let installed = self.models_dir.as_deref().map(crate::paths::installed_models).unwrap_or_default();
        for (id, _) in installed {
            if !out.iter().any(|m| m.id == id) {
                if let Some(m) = self.get(&id) {
                    out.push(m);
                }
            }
        }
        out
    }

    /// The model that a `/models/...` path names and the file path inside it: the first
    /// segment when it is a model id, else the first two (`owner/name`).
    pub fn split_file_path(&self, path: &str) -> Option<(ModelEntry, String)> {
        let (first, rest) = path.split_once('/')?;
        if let Some(m) = self.get(first) {
            return Some((m, rest.to_string()));
        }
        let (second, rest) = rest.split_once('/')?;
        self.get(&format!("{first}/{second}")).map(|m| (m, rest.to_string()))
    }
}

/// Why a file request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum PathError {
    /// Not a plain relative path: `..`, `.`, empty components, backslashes, NUL, too long.
    Invalid,
    /// No such file inside the model directory (including symlinks that lead outside).
    NotFound,
}

/// Files a client may not fetch: the usage file and its lock and temporary files.
fn is_private(name: &str) -> bool {
    name.starts_with("usage.json")
}

/// Resolves `rel` (already percent-decoded) inside `root` (canonical). Rejects anything
/// but plain relative components, then canonicalizes and checks that the result is a
/// regular file under `root`, so neither `..`, absolute paths nor symlinks can escape.
pub fn resolve_file(root: &Path, rel: &str) -> Result<PathBuf, PathError> {
    if rel.is_empty() || rel.len() > 1024 || rel.contains('\\') || rel.contains('\0') {
        return Err(PathError::Invalid);
    }
    let mut path = root.to_path_buf();
    for part in rel.split('/') {
        let mut comps = Path::new(part).components();
        match (comps.next(), comps.next()) {
            (Some(Component::Normal(c)), None) if c == part && !part.starts_with('.') => path.push(c),
            _ => return Err(PathError::Invalid),
        }
    }
    if path.file_name().and_then(|n| n.to_str()).is_some_and(is_private) {
        return Err(PathError::NotFound);
    }
    let real = path.canonicalize().map_err(|_| PathError::NotFound)?;
    if !real.starts_with(root) || !real.is_file() {
        return Err(PathError::NotFound);
    }
    Ok(real)
}

/// Regular files under `root` as (relative path, size), sorted; symlinks are followed
/// only when they stay inside `root`; hidden and private files are skipped.
pub fn list_files(root: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new(), 0usize)];
    // Each directory is listed once, however many symlinks lead to it.
    let mut seen = std::collections::HashSet::from([root.to_path_buf()]);
    let mut budget = MAX_SCANNED_ENTRIES;
    while let Some((dir, prefix, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
            if name.starts_with('.') || is_private(&name) {
                continue;
            }
            let rel = format!("{prefix}{name}");
            let Ok(real) = e.path().canonicalize() else { continue };
            if !real.starts_with(root) {
                continue;
            }
            if real.is_dir() {
                if depth < 4 && seen.insert(real.clone()) {
                    stack.push((real, format!("{rel}/"), depth + 1));
                }
            } else if let Ok(md) = real.metadata() {
                if md.is_file() && out.len() < MAX_LISTED_FILES {
                    out.push((rel, md.len()));
                }
            }
        }
    }
    out.sort();
    out
}

/// Layer and expert counts from config.json, for bounds checks of usage reports.
/// A model that [`check`] finds broken has none.
pub fn expert_shape(root: &Path) -> Result<(usize, usize)> {
    let cfg = check(root)?;
    Ok((cfg.n_layers, cfg.router.n_experts))
}

/// The model's config.json, parsed and bounded.
pub fn read_config(root: &Path) -> Result<colibri_engine::ModelConfig> {
    let path = root.join("config.json");
    let bytes = colibri_engine::fsio::read_limited(&path, colibri_engine::fsio::MAX_JSON_BYTES)?;
    colibri_engine::ModelConfig::from_json_bytes(&bytes).with_context(|| "config.json".to_string())
}

/// Tensor names and shapes that a model directory holds, without reading any weights:
/// the manifest of a converted model, else the safetensors headers.
fn tensor_shapes(root: &Path) -> Result<std::collections::HashMap<String, Vec<u64>>> {
    let mut out = std::collections::HashMap::new();
    if colibri_engine::format::is_container(root) {
        let dir = colibri_engine::model::open::ModelDir::open(root, false)?;
        let (c, _) = dir.container().context("not a converted model")?;
        let m = &c.manifest;
        for t in &m.dense.tensors {
            out.insert(t.name.clone(), t.shape.clone());
        }
        for l in &m.experts.layers {
            out.insert(format!("experts of layer {}", l.layer), vec![l.experts.len() as u64]);
        }
        return Ok(out);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .take(MAX_LISTED_FILES)
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no *.safetensors files and no colibri.json");
    }
    for f in files {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let header = safetensors_header(&f).with_context(|| name.clone())?;
        let obj = header.as_object().context(format!("{name}: the header is not a JSON object"))?;
        for (k, v) in obj {
            if k == "__metadata__" {
                continue;
            }
            // A multimodal checkpoint's text tower under the text model's names, as the
            // engine reads it.
            let Some(k) = colibri_engine::format::tensors::text_tower_name(k.clone()) else { continue };
            let shape = v.get("shape").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_u64).collect());
            out.insert(k, shape.unwrap_or_default());
        }
    }
    Ok(out)
}

/// The JSON header of a safetensors file (8-byte little-endian length, then the JSON).
fn safetensors_header(path: &Path) -> Result<Value> {
    use std::io::Read;
    let f = colibri_engine::fsio::open_regular(path)?;
    let len = f.metadata()?.len();
    let mut r = f.take(len);
    let mut n = [0u8; 8];
    r.read_exact(&mut n).context("too short to hold a header (truncated?)")?;
    let n = u64::from_le_bytes(n);
    // The limit of the safetensors crate.
    if n > 100_000_000 || n + 8 > len {
        bail!("header length {n} does not fit the file of {len} bytes (truncated?)");
    }
    let mut buf = vec![0u8; n as usize];
    r.read_exact(&mut buf)?;
    serde_json::from_slice(&buf).context("the header is not valid JSON")
}

/// Whether the model in `root` can be loaded, as far as that can be told without reading
/// its weights: config.json within bounds, the manifest (or safetensors headers) valid,
/// and the sizes of the config matching the tensors actually there. The error is one line.
pub fn check(root: &Path) -> Result<colibri_engine::ModelConfig> {
    let cfg = read_config(root)?;
    let shapes = tensor_shapes(root)?;
    let want = |name: &str, shape: &[usize]| -> Result<()> {
        match shapes.get(name) {
            None => bail!("tensor {name} is missing (config.json says {} layers)", cfg.n_layers),
            Some(s) if s.iter().map(|&d| d as usize).ne(shape.iter().copied()) => {
                bail!("tensor {name} has shape {s:?}, config.json implies {shape:?}")
            }
            Some(_) => Ok(()),
        }
    };
    want("model.embed_tokens.weight", &[cfg.vocab, cfg.hidden])?;
    want("model.norm.weight", &[cfg.hidden])?;
    for l in [0, cfg.n_layers - 1] {
        want(&format!("model.layers.{l}.input_layernorm.weight"), &[cfg.hidden])?;
        let linear = cfg.linear_attn.as_ref().filter(|la| la.layers[l]);
        match (&cfg.mla, linear) {
            (_, Some(la)) if la.split_in_proj => {
                want(&format!("model.layers.{l}.linear_attn.in_proj_qkv.weight"), &[la.conv_dim(), cfg.hidden])?
            }
            (_, Some(la)) => want(
                &format!("model.layers.{l}.linear_attn.in_proj_qkvz.weight"),
                &[2 * la.key_dim() + 2 * la.value_dim(), cfg.hidden],
            )?,
            (Some(m), None) => want(
                &format!("model.layers.{l}.self_attn.kv_a_proj_with_mqa.weight"),
                &[m.kv_lora_rank + m.qk_rope_head_dim, cfg.hidden],
            )?,
            (None, None) => {
                // With an output gate, q_proj also yields a gate per query value.
                let q = if cfg.attn_output_gate { 2 * cfg.q_dim() } else { cfg.q_dim() };
                want(&format!("model.layers.{l}.self_attn.q_proj.weight"), &[q, cfg.hidden])?
            }
        }
    }
    if shapes.contains_key(&format!("model.layers.{}.input_layernorm.weight", cfg.n_layers + cfg.mtp_layers)) {
        bail!("the weights have more layers than config.json's {}", cfg.n_layers);
    }
    Ok(cfg)
}

/// The `/api/models` entry of one model. A model that cannot be loaded is listed with
/// `"supported": false` and its reason in `"error"`.
pub fn describe(m: &ModelEntry) -> Value {
    let raw: Value =
        colibri_engine::fsio::read_limited(&m.root.join("config.json"), colibri_engine::fsio::MAX_JSON_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
    let checked = check(&m.root).map_err(|e| format!("{e:#}"));
    let parsed = checked.as_ref().ok();
    let files = list_files(&m.root);
    let total: u64 = files.iter().map(|(_, s)| s).sum();
    let format = if m.root.join(colibri_engine::format::MANIFEST_FILE).is_file() { "colibri" } else { "huggingface" };
    json!({
        "id": m.id,
        "object": "model",
        "model_type": raw.get("model_type").cloned().unwrap_or(Value::Null),
        "format": format,
        "supported": parsed.is_some(),
        "error": checked.as_ref().err(),
        "n_layers": parsed.map(|c| c.n_layers),
        "n_experts": parsed.map(|c| c.router.n_experts),
        "experts_per_token": parsed.map(|c| c.router.top_k),
        "context_length": parsed.map(|c| c.max_positions),
        "size": total,
        "files": files.iter().map(|(p, s)| json!({"path": p, "size": s, "url": format!("/models/{}/{p}", m.id.replace('/', "%2F"))})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name).canonicalize().unwrap()
    }

    #[test]
    fn paths_stay_inside_the_model_directory() {
        let root = fixture("olmoe");
        assert_eq!(resolve_file(&root, "config.json").unwrap(), root.join("config.json"));
        for bad in [
            "",
            "..",
            "../olmoe/config.json",
            "./config.json",
            "a//b",
            "/etc/passwd",
            "config.json/",
            "a\\b",
            ".hidden",
            "x\0",
        ] {
            assert_eq!(resolve_file(&root, bad), Err(PathError::Invalid), "{bad:?}");
        }
        assert_eq!(resolve_file(&root, "missing.bin"), Err(PathError::NotFound));
        assert_eq!(resolve_file(&root, "usage.json"), Err(PathError::NotFound));
    }

    #[test]
    fn registry_finds_explicit_and_installed_models() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let reg = Registry::new(&[fixtures.join("olmoe")], Some(fixtures.clone())).unwrap();
        let ids: Vec<String> = reg.list().into_iter().map(|m| m.id).collect();
        assert_eq!(
            ids,
            [
                "olmoe",
                "deepseek_v3",
                "deepseek_v32",
                "deepseek_v3_fp8",
                "deepseek_v3_mtp",
                "deepseek_v3_noqlora",
                "deepseek_v4",
                "deepseek_v4_fp8",
                "glm4_moe",
                "glm4_moe_mtp",
                "glm_moe_dsa",
                "glm_moe_dsa_fp8",
                "glm_moe_dsa_mtp",
                "gpt_oss",
                "gpt_oss_mxfp4",
                "mixtral",
                "qwen2_moe",
                "qwen3_5_moe",
                "qwen3_5_moe_mtp",
                "qwen3_moe",
                "qwen3_next",
                "qwen3_next_f32"
            ]
        );
        // gpt-oss's MXFP4 release layout (quantization_config mxfp4) is a supported model.
        let d = describe(&reg.get("gpt_oss_mxfp4").unwrap());
        assert_eq!((&d["supported"], &d["model_type"]), (&json!(true), &json!("gpt_oss")), "{d}");
        for mla in ["deepseek_v3", "deepseek_v3_noqlora", "deepseek_v3_mtp"] {
            let d = describe(&reg.get(mla).unwrap());
            assert_eq!((&d["supported"], &d["model_type"]), (&json!(true), &json!("deepseek_v3")), "{d}");
        }
        // Linear layers (qwen3_next: last layer) and gated full attention (qwen3_next_f32: first).
        for hybrid in ["qwen3_next", "qwen3_next_f32"] {
            let d = describe(&reg.get(hybrid).unwrap());
            assert_eq!((&d["supported"], &d["model_type"]), (&json!(true), &json!("qwen3_next")), "{d}");
        }
        assert!(reg.get("qwen3_moe").is_some());
        assert!(reg.get("..").is_none());
        assert!(reg.get("nope").is_none());
        let d = describe(&reg.get("olmoe").unwrap());
        assert_eq!(d["model_type"], "olmoe");
        assert_eq!(d["supported"], true, "{d}");
        assert!(d["error"].is_null());
        assert!(d["files"].as_array().unwrap().iter().any(|f| f["path"] == "model.safetensors"));
        assert!(Registry::new(&[fixtures.join("olmoe"), fixtures.join("olmoe")], None).is_err());
    }

    #[test]
    fn an_installed_owner_name_model_keeps_its_id() {
        // `coli serve --model acme/tiny-moe` used to serve it as "tiny-moe" (and list it a
        // second time as "acme/tiny-moe" from the models directory).
        let dir = std::env::temp_dir().join(format!("colibri-registry-{}", std::process::id()));
        let model = dir.join("acme").join("tiny-moe");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        let reg = Registry::new(std::slice::from_ref(&model), Some(dir.clone())).unwrap();
        let ids: Vec<String> = reg.list().into_iter().map(|m| m.id).collect();
        assert_eq!(ids, ["acme/tiny-moe"]);
        assert!(reg.get("acme/tiny-moe").is_some());
        // Outside the models directory a model is named by its directory.
        let reg = Registry::new(&[model], None).unwrap();
        assert_eq!(reg.list()[0].id, "tiny-moe");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
