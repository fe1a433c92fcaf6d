//! `coli pull OWNER/NAME[@REVISION]`: a model from the Hugging Face hub, downloaded,
//! verified and converted shard by shard into the models directory.
//!
//! The checkpoint is staged in `<models>/.pull/<owner>--<name>@<rev>/src`. Every
//! safetensors shard starts there as a placeholder: its real header (two small Range
//! reads) followed by a hole of the shard's size, so the whole checkpoint can be planned and
//! opened at once while only one shard is on disk. Then, shard by shard: download it
//! (resuming its `.part` file, sha256-checked against the hub), run a conversion pass
//! (crate::commands::convert, which writes every item whose tensors are present), and put
//! the placeholder back for each shard that no unwritten item still needs. The disk needed
//! is the container plus about one shard (checked against the free space before anything
//! is written; the hub's sizes are bounded, [`crate::hub::MAX_FILE_BYTES`]). Markers record each shard's state
//! (`.NAME.verified`, `.NAME.converted`) and the conversion journals what it wrote, so a pull
//! killed at any point resumes, and gives the same bytes as `coli convert` of the files.
//! A failed pull keeps its staging directory (named by its `.id` file) for the next run to
//! resume, says so, and `coli list --partial` / `coli rm ID` show and remove it.
//!
//! A repository of GGUF files instead (llama.cpp's format) is pulled by
//! [`super::pull_gguf`]: one chosen file, downloaded and converted as `coli convert
//! FILE.gguf` converts it.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::commands::convert::{convert_pass, ConvertArgs, Partial, Pass, Quant, DATA_FILE, KEPT_FILES};
use crate::commands::info::human;
use crate::commands::list::{allocated_size, PULLS_DIR};
use crate::commands::pull_staging::{create_staging, ensure_room, have, install, marker, touch};
use crate::hub::{Hub, RemoteFile};
use crate::paths::{is_valid_model_id, models_dir};

#[derive(Args)]
pub struct PullArgs {
    /// A Hugging Face model repository, OWNER/NAME, optionally @REVISION (branch, tag or
    /// commit; default main), or a name from `coli pull --list`.
    #[arg(required_unless_present = "list")]
    pub repo: Option<String>,
    /// Print the catalog of known models (their short names work in place of OWNER/NAME).
    #[arg(long)]
    pub list: bool,
    /// Stored type of the attention, expert and dense-MLP weights (as `coli convert`);
    /// default int4 for safetensors, while a GGUF keeps its own types where it can.
    #[arg(long, value_enum)]
    pub quant: Option<Quant>,
    /// Values per f16 scale for int4/int8 (as `coli convert`: default 32, 128 for the
    /// default's int8 attention, dense MLP, embeddings and output).
    #[arg(long)]
    pub group_size: Option<u32>,
    /// Replace an installed model of the same id.
    #[arg(long)]
    pub force: bool,
    /// For a repository of GGUF files: which one, by file name or a part of it such as
    /// its quantization (`--gguf Q4_K_M`). Needed when the repository holds several.
    #[arg(long)]
    pub gguf: Option<String>,
}

/// Largest safetensors header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;
pub(crate) const INDEX: &str = "model.safetensors.index.json";

pub(crate) fn parse_repo(s: &str) -> Result<(&str, &str)> {
    let (repo, rev) = s.split_once('@').unwrap_or((s, "main"));
    if !repo.contains('/') || !is_valid_model_id(repo) {
        bail!("{repo:?} is not a hub repository id (OWNER/NAME, e.g. allenai/OLMoE-1B-7B-0924)");
    }
    let rev_ok = !rev.is_empty()
        && rev.len() <= 256
        && !rev.contains("..")
        && rev.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if !rev_ok {
        bail!("{rev:?} is not a revision (a branch, tag or commit)");
    }
    Ok((repo, rev))
}

/// The tensor names in a safetensors header (the JSON after the 8-byte length).
fn tensor_names(header_json: &[u8], what: &str) -> Result<Vec<String>> {
    let v: serde_json::Value =
        serde_json::from_slice(header_json).with_context(|| format!("{what}: the safetensors header is not JSON"))?;
    let map = v.as_object().with_context(|| format!("{what}: the safetensors header is not an object"))?;
    Ok(map.keys().filter(|k| *k != "__metadata__").cloned().collect())
}

/// A shard's header bytes (length prefix included), from the local file or the hub.
fn shard_header(hub: &Hub, repo: &str, rev: &str, f: &RemoteFile, local: Option<&Path>) -> Result<Vec<u8>> {
    let read = |start: u64, len: u64| -> Result<Vec<u8>> {
        match local {
            Some(p) => {
                let mut file = File::open(p)?;
                let mut buf = vec![0u8; (start + len) as usize];
                file.read_exact(&mut buf)?;
                Ok(buf.split_off(start as usize))
            }
            None => hub.read_range(repo, rev, &f.path, start, len),
        }
    };
    if f.size < 8 {
        bail!("{}: too short for a safetensors file ({} bytes)", f.path, f.size);
    }
    let prefix = read(0, 8)?;
    let n = u64::from_le_bytes(prefix[..8].try_into().context("short read")?);
    if n == 0 || n > MAX_HEADER || 8 + n > f.size {
        bail!("{}: invalid safetensors header length {n}", f.path);
    }
    let mut out = prefix;
    out.extend(read(8, n)?);
    Ok(out)
}

/// The shard's placeholder: its header, then a hole up to its full size.
fn write_placeholder(path: &Path, header: &[u8], size: u64) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("{}: cannot create", path.display()))?;
    f.write_all(header)?;
    f.set_len(size)?;
    Ok(())
}

/// Is `name` a file of the repository that conversion needs?
fn wanted(name: &str) -> bool {
    !name.contains('/') && (name.ends_with(".safetensors") || name == INDEX || KEPT_FILES.contains(&name))
}

pub fn pull(a: PullArgs) -> Result<()> {
    if a.list {
        super::catalog::print(models_dir().as_deref());
        return Ok(());
    }
    let models = models_dir().context("no models directory: set COLI_HOME or HOME")?;
    pull_to(&a, &models, Hub::from_env())
}

/// `coli serve`'s `/api/pull`: `repo` (`OWNER/NAME[@REV]`) into `models` as `coli pull`
/// (the GGUF file `gguf` of a GGUF repository), each download's progress told to
/// `progress`; the installed id.
pub fn pull_for_api(repo: &str, gguf: Option<String>, models: &Path, progress: crate::hub::Progress) -> Result<String> {
    let a = PullArgs { repo: Some(repo.to_string()), list: false, quant: None, group_size: None, force: false, gguf };
    pull_to(&a, models, Hub::from_env().with_progress(progress))?;
    Ok(parse_repo(repo)?.0.to_string())
}

fn pull_to(a: &PullArgs, models: &Path, hub: Hub) -> Result<()> {
    let spec = super::catalog::resolve(a.repo.as_deref().unwrap_or_default());
    let (repo, rev) = parse_repo(spec)?;
    let staging = models.join(PULLS_DIR).join(format!("{}@{}", repo.replace('/', "--"), rev.replace('/', "--")));
    let result = pull_into(a, &hub, repo, rev, models, &staging);
    if result.is_err() && staging.is_dir() {
        eprintln!(
            "note: the unfinished pull ({} on disk) is kept in {}: coli pull {} resumes it (coli list --partial lists such pulls, coli rm {repo} removes them)",
            human(allocated_size(&staging)),
            staging.display(),
            spec
        );
    }
    result
}

fn pull_into(a: &PullArgs, hub: &Hub, repo: &str, rev: &str, models: &Path, staging: &Path) -> Result<()> {
    let dest = models.join(repo);
    if dest.join("config.json").is_file() && !a.force {
        bail!("{repo} is already installed in {} (coli rm {repo} first, or pass --force)", dest.display());
    }
    let listed = hub.list_files(repo, rev)?;
    let names: Vec<String> = listed.iter().map(|f| f.path.clone()).filter(|p| wanted(p)).collect();
    let has_safetensors = names.iter().any(|n| n.ends_with(".safetensors"));
    if a.gguf.is_some() || (!has_safetensors && listed.iter().any(|f| super::pull_gguf::is_gguf_name(&f.path))) {
        return super::pull_gguf::pull_gguf(
            hub,
            repo,
            rev,
            &listed,
            (a.gguf.as_deref(), a.quant, a.group_size),
            staging,
            &dest,
        );
    }
    if !names.iter().any(|n| n == "config.json") {
        bail!("{repo}@{rev} has no config.json: not a transformers model repository");
    }
    if !has_safetensors {
        bail!("{repo}@{rev} has no *.safetensors weights (nor *.gguf files)");
    }
    let files: Vec<RemoteFile> = names.iter().map(|n| hub.stat(repo, rev, n)).collect::<Result<_>>()?;
    let (shards, small): (Vec<&RemoteFile>, Vec<&RemoteFile>) =
        files.iter().partition(|f| f.path.ends_with(".safetensors"));
    let total: u64 = files.iter().map(|f| f.size).sum();
    let largest = shards.iter().map(|f| f.size).max().unwrap_or(0);
    eprintln!(
        "pulling {repo}@{rev} from {}: {} files, {} ({} shards, the largest {})",
        hub.endpoint(),
        files.len(),
        human(total),
        shards.len(),
        human(largest)
    );

    // The small files and the largest shard are on disk at once (the other shards are
    // placeholders that hold only their header).
    let (src, out) = (staging.join("src"), staging.join("out"));
    let left = |f: &RemoteFile| f.size - have(&src.join(&f.path), f.size);
    let converted_or_verified =
        |f: &RemoteFile| marker(&src, &f.path, "verified").exists() || marker(&src, &f.path, "converted").exists();
    let need = small.iter().map(|f| left(f)).sum::<u64>()
        + shards.iter().filter(|f| !converted_or_verified(f)).map(|f| left(f)).max().unwrap_or(0);
    ensure_room(models, need, &format!("{repo} (its largest shard {})", human(largest)))?;
    create_staging(staging, repo, rev)?;
    for f in &small {
        let p = src.join(&f.path);
        if std::fs::metadata(&p).ok().map(|m| m.len()) != Some(f.size) {
            hub.download(repo, rev, f, &p)?;
        }
    }

    // Placeholders for the shards not on disk; the tensor names of each.
    let mut verified = Vec::new();
    let mut converted = Vec::new();
    let mut tensors: Vec<Vec<String>> = Vec::new();
    for f in &shards {
        let path = src.join(&f.path);
        let v = marker(&src, &f.path, "verified").exists();
        let c = marker(&src, &f.path, "converted").exists();
        let header = shard_header(hub, repo, rev, f, v.then_some(path.as_path()))?;
        if !v {
            write_placeholder(&path, &header, f.size)?;
        }
        tensors.push(tensor_names(&header[8..], &f.path)?);
        verified.push(v && !c);
        converted.push(c);
    }

    let mut source_id = format!("{repo}@{rev}\n");
    for f in &shards {
        source_id.push_str(&format!("{} {} {}\n", f.path, f.size, f.sha256.as_deref().unwrap_or("-")));
    }
    let args = ConvertArgs {
        src: src.clone(),
        out: Some(out.clone()),
        // Without --quant: int4 as `coli convert` (an FP8 checkpoint: kept FP8, as there).
        quant: a.quant,
        group_size: a.group_size,
        embed: None,
        lm_head: None,
        attn: None,
        experts: None,
        mlp: None,
        force: false,
    };
    // A run killed between the data file's rename and the manifest: undo the rename.
    if out.join(DATA_FILE).is_file() && !out.join(colibri_engine::format::MANIFEST_FILE).is_file() {
        std::fs::rename(out.join(DATA_FILE), out.join(format!("{DATA_FILE}.partial")))?;
    }
    let mut known = HashMap::new();
    let mut finished = colibri_engine::format::is_container(&out);
    let mut i = 0;
    while !finished {
        if i < shards.len() && !converted[i] && !verified[i] {
            let f = shards[i];
            hub.download(repo, rev, f, &src.join(&f.path))?;
            touch(&marker(&src, &f.path, "verified"))?;
            verified[i] = true;
        }
        let available: HashSet<String> =
            (0..shards.len()).filter(|&j| verified[j]).flat_map(|j| tensors[j].iter().cloned()).collect();
        let partial = Partial { available: &available, source_id: &source_id, known: &mut known };
        match convert_pass(&args, Some(partial))? {
            Pass::Finished => finished = true,
            Pass::Pending { needed } => {
                for j in 0..shards.len() {
                    if verified[j] && tensors[j].iter().all(|t| !needed.contains(t)) {
                        // Converted: the shard's bytes are no longer needed.
                        let f = shards[j];
                        touch(&marker(&src, &f.path, "converted"))?;
                        let header = shard_header(hub, repo, rev, f, Some(&src.join(&f.path)))?;
                        write_placeholder(&src.join(&f.path), &header, f.size)?;
                        let _ = std::fs::remove_file(marker(&src, &f.path, "verified"));
                        (verified[j], converted[j]) = (false, true);
                    }
                }
                if i >= shards.len() {
                    bail!("{repo}: every shard is converted but tensors are still missing: {:?}", needed.iter().next());
                }
            }
        }
        i += 1;
    }

    install(repo, &out, staging, models)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_ids_and_revisions() {
        assert_eq!(parse_repo("acme/tiny").unwrap(), ("acme/tiny", "main"));
        assert_eq!(parse_repo("acme/tiny@refs/pr/1").unwrap(), ("acme/tiny", "refs/pr/1"));
        for bad in ["tiny", "acme/tiny/x", "../x", "acme/tiny@", "acme/tiny@a b", "acme/tiny@../../x"] {
            assert!(parse_repo(bad).is_err(), "{bad}");
        }
    }
}
