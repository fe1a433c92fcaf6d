//! `coli convert SRC -o DST`: a Hugging Face checkpoint (or a GGUF file: convert_gguf.rs)
//! into a colibri container (docs/format.md), tensor by tensor and expert by expert with
//! bounded memory.
//!
//! Resumable: the layout is fixed before anything is written, so every item has a
//! deterministic offset in `DST/weights.bin.partial`. After an item's bytes are durable
//! its checksum is appended to `DST/convert.journal`; a rerun keeps the journaled items
//! whose bytes still match and redoes the rest, so an interrupted and an uninterrupted
//! conversion give identical bytes. The manifest is written last: a directory with
//! `colibri.json` is complete.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use colibri_engine::format::manifest::checksum;
use colibri_engine::format::manifest::{self, checksum_hex, DensePlan, ExpertLayerPlan, QuantSummary};
use colibri_engine::format::tensors::{is_routed_expert_weight, TensorStore};
use colibri_engine::format::{is_container, MANIFEST_FILE};

use super::convert_gguf;
use super::convert_output::{check_output_dir, read_journal, sync_dir, JOURNAL};
use super::convert_source::{self, encode_rows, read_at, write_at};
use colibri_engine::tensor::{DType, Mat};
use colibri_engine::{Model, ModelConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The data file of a container.
pub const DATA_FILE: &str = "weights.bin";
/// Files kept beside the manifest when the checkpoint has them.
pub const KEPT_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Quant {
    Int4,
    Int8,
    F16,
    Bf16,
    F32,
}

/// Values per f16 scale without `--group-size`: Q4_0's and Q8_0's 32.
pub const GROUP: u32 = 32;

/// Values per f16 scale of the int8 that `--quant int4` picks by default for attention, dense
/// MLP, embeddings and output (without `--group-size`): 128. On the demo model the default's
/// KL moved from 0.0404 (group 32) to 0.0422, top-1 agreement unchanged at 0.955, while
/// those matrices read 4% fewer bytes and their kernels run faster per byte (fewer scales
/// and block sums): decode of bench_peers' default conversion 7% faster at one and two
/// threads on a Zen 1 EPYC (docs/benchmarks.md "int8 group 128 in the default"). int8 asked
/// for by name (`--quant int8`, `--attn int8`, ...) keeps 32: on the random fixtures
/// all-int8 with group 128 had 1.5 to 2.5 times group 32's KL. So does a GGUF's (its Q8_0 is
/// kept exactly in int8/g32).
pub const DEFAULT_INT8_GROUP: u32 = 128;

impl Quant {
    /// The stored type, `group` values per scale for int4/int8 (None: [`GROUP`]).
    fn dtype(self, group: Option<u32>) -> DType {
        match self {
            Quant::Int4 => DType::Int4 { group: group.unwrap_or(GROUP) },
            Quant::Int8 => DType::Int8 { group: group.unwrap_or(GROUP) },
            Quant::F16 => DType::F16,
            Quant::Bf16 => DType::BF16,
            Quant::F32 => DType::F32,
        }
    }
}

#[derive(Args)]
pub struct ConvertArgs {
    /// Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files), or
    /// a GGUF file (llama.cpp's format; docs/gguf.md).
    pub src: PathBuf,
    /// Output directory for the converted model (for a GGUF, default: beside it, named
    /// after the file without .gguf).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Stored type of the attention, expert and dense-MLP weights (default int4; for a
    /// GGUF, default: each tensor in the type that keeps its GGUF values, docs/gguf.md).
    #[arg(long, value_enum)]
    pub quant: Option<Quant>,
    /// Values per f16 scale for int4/int8 (a multiple of 8, at most 1024), along each row
    /// (default 32; 128 for the int8 that --quant int4 picks by default for attention, dense
    /// MLP, embeddings and output).
    #[arg(long)]
    pub group_size: Option<u32>,
    /// Token embeddings (default: int8 with --quant int4, else --quant).
    #[arg(long, value_enum)]
    pub embed: Option<Quant>,
    /// Output projection (default: int8 with --quant int4, else --quant).
    #[arg(long, value_enum)]
    pub lm_head: Option<Quant>,
    /// Attention projections q/k/v/o (default: int8 with --quant int4, else --quant).
    #[arg(long, value_enum)]
    pub attn: Option<Quant>,
    /// Routed experts (default: --quant; an MXFP4 checkpoint's experts stay MXFP4 unless
    /// --experts or --quant is given).
    #[arg(long, value_enum)]
    pub experts: Option<Quant>,
    /// Dense MLP layers and shared experts (default: int8 with --quant int4, else --quant).
    #[arg(long, value_enum)]
    pub mlp: Option<Quant>,
    /// Replace a finished conversion already in the output directory.
    #[arg(long)]
    pub force: bool,
}

/// Tensor classes with their own stored type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Embed,
    LmHead,
    Attn,
    Mlp,
    /// Norms, biases, routers, gates, attention sinks, hyper-connection mixes: always f32
    /// (DeepSeek-V4's tid2eid ids stay bytes).
    Other,
}

fn class_of(name: &str, shape: &[usize]) -> Class {
    // The last part of the name: DeepSeek-V4's hyper-connection mixes (`hc_attn_fn`,
    // `hc_head_fn`, `hc_fn`, ...) and compressor position biases (`ape`) are small and set
    // every residual and compressed entry.
    let leaf = name.rsplit('.').next().unwrap_or(name);
    if shape.len() != 2
        || leaf.starts_with("hc_")
        || leaf == "ape"
        || leaf == "tid2eid"
        || name.contains("norm")
        || name.ends_with("_bias")
        || name.ends_with(".gate.weight")
        || name.ends_with(".router.weight")
        || name.ends_with("shared_expert_gate.weight")
        // Gated DeltaNet's beta/decay projection: small, and it sets every step's decay
        // (qwen3_next's fused in_proj_ba, qwen3_5_moe's in_proj_b and in_proj_a).
        || name.ends_with("linear_attn.in_proj_ba.weight")
        || name.ends_with("linear_attn.in_proj_b.weight")
        || name.ends_with("linear_attn.in_proj_a.weight")
    {
        Class::Other
    } else if name == "lm_head.weight" || name == "head.weight" || name.ends_with(".shared_head.head.weight") {
        // ("head.weight", "embed.weight": DeepSeek-V4's release names.)
        Class::LmHead
    } else if name.ends_with("embed_tokens.weight") || name == "embed.weight" {
        Class::Embed
    } else if name.contains(".self_attn.") || name.contains(".linear_attn.") || name.contains(".attn.") {
        Class::Attn
    } else {
        Class::Mlp
    }
}

/// Sort key that orders "layers.2" before "layers.10".
fn natural_key(s: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut n = c.to_digit(10).unwrap_or(0) as u64;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(d as u64);
                chars.next();
            }
            out.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    out.push((text, u64::MAX));
    out
}

/// One unit of work: a dense tensor or a routed expert.
enum Item {
    /// (source tensor name, stored type); index into the manifest's dense list.
    Dense {
        src: String,
        dtype: DType,
        index: usize,
    },
    Expert {
        layer: usize,
        moe_index: usize,
        expert: usize,
    },
}

struct Job {
    src_dir: PathBuf,
    /// Files written beside the manifest instead of copied from the source (GGUF).
    generated: Vec<(String, Vec<u8>)>,
    out: PathBuf,
    store: TensorStore,
    model: Model,
    /// A GGUF source converts its tensors on demand; `store` and `model` are then stubs
    /// with the planned types and shapes.
    gguf: Option<convert_gguf::Lazy>,
    manifest: manifest::Manifest,
    items: Vec<Item>,
    /// (offset, length) of each item.
    ranges: Vec<(u64, u64)>,
}

fn parse_config(src: &Path) -> Result<(serde_json::Value, ModelConfig)> {
    let p = src.join("config.json");
    let bytes = std::fs::read(&p).with_context(|| format!("{}: cannot read", p.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{}: invalid JSON", p.display()))?;
    let cfg = ModelConfig::from_value(&v).with_context(|| p.display().to_string())?;
    Ok((v, cfg))
}

fn plan_job(a: &ConvertArgs, out: &Path) -> Result<Job> {
    let g = a.group_size;
    let gguf = convert_gguf::is_gguf(&a.src);
    // A block-scaled FP8 checkpoint (format::fp8) is opened before the plan: without
    // --quant it keeps every tensor's own type (FP8 stays FP8, exact), like a GGUF.
    let hf = if gguf { None } else { Some(parse_config(&a.src)?) };
    let hf_store = if gguf { None } else { Some(TensorStore::open_dir_unread(&a.src)?) };
    let fp8 = hf_store.as_ref().is_some_and(TensorStore::has_fp8);
    // A GGUF without --quant keeps each tensor's own type where it can (None below).
    let keep = (gguf || fp8) && a.quant.is_none();
    let quant = a.quant.unwrap_or(Quant::Int4);
    let q = |c: Option<Quant>, dflt: DType| match c {
        Some(c) => Some(c.dtype(g)),
        None if keep => None,
        None => Some(dflt),
    };
    // With int4, only the routed experts (the bulk of the bytes) are int4 by default: int8
    // attention and dense MLP cut the demo model's KL by a third (docs/benchmarks.md), in
    // groups of 128 unless --group-size says otherwise (DEFAULT_INT8_GROUP).
    // A GGUF's Q8_0 and Q4_0 are blocks of 32: kept exactly only in int8/g32.
    let small = match quant {
        Quant::Int4 if !gguf => DType::Int8 { group: g.unwrap_or(DEFAULT_INT8_GROUP) },
        Quant::Int4 => Quant::Int8.dtype(g),
        q => q.dtype(g),
    };
    let (embed_t, head_t, attn_t, mlp_t, exp_t) =
        (q(a.embed, small), q(a.lm_head, small), q(a.attn, small), q(a.mlp, small), q(a.experts, quant.dtype(g)));
    let target = |c: Class| match c {
        Class::Embed => embed_t,
        Class::LmHead => head_t,
        Class::Attn => attn_t,
        Class::Mlp => mlp_t,
        Class::Other => Some(DType::F32),
    };
    let (config, cfg, store, generated, source, lazy) = if gguf {
        let src = convert_gguf::open(&a.src, |name, shape| {
            if is_routed_expert_weight(name) {
                exp_t
            } else {
                target(class_of(name, shape))
            }
        })?;
        let cfg = ModelConfig::from_value(&src.config).with_context(|| format!("{}: config", a.src.display()))?;
        (src.config, cfg, src.stub, src.files, Some(src.provenance), Some(src.lazy))
    } else {
        let (config, cfg) = hf.context("the checkpoint's config")?;
        (config, cfg, hf_store.context("the checkpoint's tensors")?, Vec::new(), None, None)
    };
    let model = match Model::from_store(cfg.clone(), &convert_source::planning_store(&cfg, &store)?) {
        Err(e) if gguf => bail!("{}: the GGUF lacks a tensor of this model: {e}", a.src.display()),
        m => m?,
    };
    // A checkpoint whose routed experts are MXFP4 (gpt-oss) keeps them in that format,
    // bytes unchanged, unless --experts or --quant asks for another type.
    let first_moe = (0..cfg.n_layers).find(|&l| cfg.moe_layers[l]);
    let mxfp4_experts = match first_moe {
        Some(l) if !gguf => model.experts.expert(l, 0)?.gate.dtype == DType::Mxfp4,
        _ => false,
    };
    let exp_t = if mxfp4_experts && a.experts.is_none() && a.quant.is_none() { Some(DType::Mxfp4) } else { exp_t };

    // The first MTP layer is kept where the engine runs it (`--draft mtp`); others are left out.
    let mtp = match cfg.family.is_qwen_hybrid() {
        true => "mtp.".to_string(),
        false => format!("{}.", cfg.layer_prefix(cfg.n_layers)),
    };
    let keep_mtp = |n: &str| model.has_mtp() && n.starts_with(&mtp);
    let mut names: Vec<&String> =
        store.names().filter(|n| !is_routed_expert_weight(n) && (!cfg.is_mtp_tensor(n) || keep_mtp(n))).collect();
    names.sort_by_cached_key(|n| natural_key(n));
    let mut dense: Vec<(String, String, DType, Vec<usize>)> = Vec::new(); // (stored name, source name, dtype, shape)
    for n in names {
        let t = store.get(n)?;
        // Raw bytes (DeepSeek-V4's tid2eid expert ids) are kept as they are.
        let dt = match t.dtype {
            DType::U8 => DType::U8,
            _ => target(class_of(n, &t.shape)).unwrap_or(t.dtype),
        };
        dense.push((n.clone(), n.clone(), dt, t.shape.clone()));
    }
    let embed_name = "model.embed_tokens.weight";
    if cfg.tie_word_embeddings && !store.contains("lm_head.weight") && head_t != embed_t {
        let t = store.get(embed_name)?;
        dense.push(("lm_head.weight".into(), embed_name.into(), head_t.unwrap_or(t.dtype), t.shape.clone()));
    }

    let (h, i) = (cfg.hidden as u64, cfg.expert_intermediate as u64);
    let mut moe_layers: Vec<usize> = (0..cfg.n_layers).filter(|&l| cfg.moe_layers[l]).collect();
    if model.mtp.as_ref().is_some_and(|m| matches!(m.layer.ffn, colibri_engine::model::Ffn::Moe(_))) {
        moe_layers.push(cfg.n_layers);
    }
    let expert_plans: Vec<ExpertLayerPlan> = moe_layers
        .iter()
        .map(|&l| {
            // Without a target (a GGUF kept as is) each part keeps its stored type.
            let x = model.experts.expert(l, 0)?;
            let t = |m: &Mat| exp_t.unwrap_or(m.dtype);
            Ok(ExpertLayerPlan {
                layer: l as u32,
                count: cfg.router.n_experts,
                parts: [(t(&x.gate), [i, h]), (t(&x.up), [i, h]), (t(&x.down), [h, i])],
            })
        })
        .collect::<Result<_>>()?;
    let files: Vec<String> = if gguf {
        generated.iter().map(|(n, _)| n.clone()).collect()
    } else {
        KEPT_FILES.iter().filter(|f| a.src.join(f).is_file()).map(|f| f.to_string()).collect()
    };
    let mut classes = std::collections::BTreeMap::new();
    if keep {
        // The types really stored, per class ("f16+int8/g32" where a class mixes them).
        let mut seen: std::collections::BTreeMap<&str, std::collections::BTreeSet<String>> = Default::default();
        for (n, _, dt, shape) in &dense {
            let c = match class_of(n, shape) {
                Class::Embed => "embed",
                Class::LmHead => "lm_head",
                Class::Attn => "attn",
                Class::Mlp => "mlp",
                Class::Other => "other",
            };
            seen.entry(c).or_default().insert(dt.to_string());
        }
        for l in &expert_plans {
            seen.entry("experts").or_default().extend(l.parts.iter().map(|p| p.0.to_string()));
        }
        for (k, v) in seen {
            classes.insert(k.to_string(), v.into_iter().collect::<Vec<_>>().join("+"));
        }
    } else {
        for (k, v) in [
            ("embed", embed_t),
            ("lm_head", head_t),
            ("attn", attn_t),
            ("mlp", mlp_t),
            ("experts", exp_t),
            ("other", Some(DType::F32)),
        ] {
            classes.insert(k.to_string(), v.map(|v| v.to_string()).unwrap_or_default());
        }
    }
    let default = match (keep, gguf) {
        (true, true) => "gguf".to_string(),
        (true, false) => "fp8".to_string(),
        _ => format!("{quant:?}").to_lowercase(),
    };
    // The group of the main type (each class names its own: "int8/g128").
    let group_size = match quant.dtype(g) {
        DType::Int4 { group } | DType::Int8 { group } => group,
        _ => g.unwrap_or(GROUP),
    };
    let summary = QuantSummary { default, group_size, classes };
    let dense_plans: Vec<DensePlan> = dense
        .iter()
        .map(|(n, _, dt, shape)| DensePlan {
            name: n.clone(),
            dtype: *dt,
            shape: shape.iter().map(|&d| d as u64).collect(),
        })
        .collect();
    let mut manifest = manifest::plan(DATA_FILE, summary, config, files, &dense_plans, &expert_plans)?;
    manifest.source = source;

    let mut items = Vec::new();
    let mut ranges = Vec::new();
    for (k, (_, src, dt, _)) in dense.into_iter().enumerate() {
        let t = &manifest.dense.tensors[k];
        ranges.push((t.offset, t.length));
        items.push(Item::Dense { src, dtype: dt, index: k });
    }
    for (m, &l) in moe_layers.iter().enumerate() {
        for (e, x) in manifest.experts.layers[m].experts.iter().enumerate() {
            ranges.push((x.offset, x.length));
            items.push(Item::Expert { layer: l, moe_index: m, expert: e });
        }
    }
    Ok(Job {
        src_dir: a.src.clone(),
        generated,
        out: out.to_path_buf(),
        store,
        model,
        gguf: lazy,
        manifest,
        items,
        ranges,
    })
}

impl Job {
    /// Writes item `k` at its offset; returns its checksum.
    fn write_item(&self, k: usize, f: &File, progress: &ProgressBar) -> Result<u64> {
        let (offset, length) = self.ranges[k];
        match &self.items[k] {
            Item::Dense { src, dtype, index } => {
                let shards = self.store.reader();
                let mat = match &self.gguf {
                    Some(g) => g.mat(src, *dtype)?,
                    None => {
                        let t = self.store.get(src)?;
                        let cols = t.shape.last().copied().unwrap_or(1);
                        let rows = if t.shape.is_empty() { 1 } else { t.shape[..t.shape.len() - 1].iter().product() };
                        let m = Mat::new(rows, cols, t.dtype, t.bytes.clone())?;
                        // An FP8 pair is read into FP8 rows here (format::fp8).
                        match (m.bytes.is_elsewhere(), self.store.reader()) {
                            (true, Some(r)) => r.read_mat(&m)?,
                            _ => m,
                        }
                    }
                };
                let (rows, cols) = (mat.rows, mat.cols);
                let rb = dtype.row_bytes(cols).context("bad stored type")?.max(1);
                let per_chunk = ((8 << 20) / rb).max(1);
                let mut hasher = xxhash_rust::xxh3::Xxh3::new();
                let mut buf = Vec::new();
                let mut r = 0;
                while r < rows {
                    let n = per_chunk.min(rows - r);
                    buf.clear();
                    buf.resize(n * rb, 0);
                    let name = || format!("tensor {}", self.manifest.dense.tensors[*index].name);
                    let rows = convert_source::resolve(mat.row_block(r, n)?, shards.as_ref()).with_context(name)?;
                    encode_rows(&rows, 0, *dtype, &mut buf).with_context(name)?;
                    write_at(f, &buf, offset + (r * rb) as u64)?;
                    hasher.update(&buf);
                    progress.inc(buf.len() as u64);
                    r += n;
                }
                Ok(hasher.digest())
            }
            Item::Expert { layer, moe_index, expert } => {
                let parts = &self.manifest.experts.layers[*moe_index].parts;
                let mats = match &self.gguf {
                    Some(g) => g.expert(*layer, *expert, [parts[0].dtype()?, parts[1].dtype()?, parts[2].dtype()?])?,
                    None => {
                        let x = self.model.experts.expert(*layer, *expert)?;
                        let sh = self.store.reader();
                        let read = |m: &Mat| convert_source::resolve(m.clone(), sh.as_ref());
                        [read(&x.gate)?, read(&x.up)?, read(&x.down)?]
                    }
                };
                let mut buf = vec![0u8; length as usize];
                for (p, m) in parts.iter().zip(&mats) {
                    let dst = &mut buf[p.offset as usize..(p.offset + p.length) as usize];
                    encode_rows(m, 0, p.dtype()?, dst)
                        .with_context(|| format!("expert {expert} of layer {layer}, {}", p.name))?;
                }
                write_at(f, &buf, offset)?;
                progress.inc(length);
                Ok(checksum(&buf))
            }
        }
    }

    /// A fingerprint of what this conversion will write: the layout, the options and the
    /// source files (names, sizes, modification times) and this program's version.
    fn fingerprint(&self, source_id: Option<&str>) -> Result<String> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.manifest.to_json());
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        if let Some(id) = source_id {
            h.update(id.as_bytes());
            return Ok(checksum_hex(h.digest()));
        }
        let mut files: Vec<_> = if let Some(g) = &self.gguf {
            g.paths().to_vec()
        } else if self.src_dir.is_file() {
            vec![self.src_dir.clone()]
        } else {
            std::fs::read_dir(&self.src_dir)?.filter_map(|e| e.ok()).map(|e| e.path()).collect()
        };
        files.sort();
        for p in files {
            if p.extension().is_some_and(|x| x == "safetensors" || x == "json") || self.gguf.is_some() {
                let md = std::fs::metadata(&p)?;
                let mtime =
                    md.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
                h.update(format!("{}\0{}\0{}\0", p.display(), md.len(), mtime.as_nanos()).as_bytes());
            }
        }
        Ok(checksum_hex(h.digest()))
    }
}

impl Job {
    /// The source tensors that item `k` reads: a dense tensor, or every tensor of its
    /// layer's experts that belongs to its expert (`...experts.{e}.*`, or a stacked
    /// `...experts.gate_up_proj` that holds them all).
    fn item_tensors(
        &self,
        k: usize,
        experts_by_layer: &std::collections::HashMap<usize, Vec<(Option<usize>, String)>>,
    ) -> Vec<String> {
        let names: Vec<String> = match &self.items[k] {
            Item::Dense { src, .. } => vec![src.clone()],
            Item::Expert { layer, expert, .. } => experts_by_layer
                .get(layer)
                .map(|v| v.iter().filter(|(e, _)| e.is_none_or(|e| e == *expert)).map(|(_, n)| n.clone()).collect())
                .unwrap_or_default(),
        };
        // An FP8 weight (or DeepSeek-V4's packed FP4 expert) needs its scale tensor too
        // (format::fp8; it may be in another shard).
        let scales: Vec<String> = names.iter().filter_map(|n| self.store.scale_of(n)).collect();
        names.into_iter().chain(scales).collect()
    }

    /// Expert tensors of the checkpoint by layer, with the expert index in their name.
    fn experts_by_layer(&self) -> std::collections::HashMap<usize, Vec<(Option<usize>, String)>> {
        let mut out: std::collections::HashMap<usize, Vec<(Option<usize>, String)>> = Default::default();
        for n in self.store.names().filter(|n| is_routed_expert_weight(n)) {
            // (DeepSeek-V4's release names its layers without "model.".)
            let Some(rest) = n.strip_prefix("model.layers.").or_else(|| n.strip_prefix("layers.")) else { continue };
            let Some((layer, rest)) = rest.split_once('.') else { continue };
            // ".experts.", not "experts.": deepseek_v3's "mlp.shared_experts.*" are dense.
            let (Ok(layer), Some((_, after))) = (layer.parse::<usize>(), rest.split_once(".experts.")) else {
                continue;
            };
            let expert = after.split('.').next().and_then(|e| e.parse::<usize>().ok());
            out.entry(layer).or_default().push((expert, n.clone()));
        }
        out
    }
}

/// A conversion that runs while the checkpoint arrives (`coli pull`): only the items whose
/// source tensors are all in `available` are written; the others wait for a later pass.
/// Passes share the journal, so each one resumes the last, and the finished container is
/// byte-identical to a conversion of the complete checkpoint.
pub struct Partial<'a> {
    /// Tensors whose bytes are present (the other shards are placeholders).
    pub available: &'a std::collections::HashSet<String>,
    /// Identifies the source instead of file names and times (the shards' sha256).
    pub source_id: &'a str,
    /// Items (and checksums) written or verified by an earlier pass of this process; not
    /// read back again.
    pub known: &'a mut std::collections::HashMap<usize, u64>,
}

/// What a conversion pass left to do.
pub enum Pass {
    /// The container is complete.
    Finished,
    /// These source tensors are still needed by items not yet written.
    Pending { needed: std::collections::HashSet<String> },
}

pub fn convert(a: ConvertArgs) -> Result<()> {
    convert_pass(&a, None).map(|_| ())
}

/// One conversion pass: everything, or with `partial` the items whose tensors are there.
pub fn convert_pass(a: &ConvertArgs, mut partial: Option<Partial>) -> Result<Pass> {
    if let Some(g) = a.group_size.filter(|&g| g == 0 || !g.is_multiple_of(8) || g > 1024) {
        bail!("--group-size must be a positive multiple of 8 (at most 1024), got {g}");
    }
    let gguf = convert_gguf::is_gguf(&a.src);
    if !a.src.is_dir() && !gguf {
        bail!("{}: no such model directory or GGUF file", a.src.display());
    }
    if is_container(&a.src) {
        bail!("{}: already a converted colibri model", a.src.display());
    }
    let out = match (&a.out, gguf) {
        (Some(o), _) => o.clone(),
        (None, true) => a.src.with_extension(""),
        (None, false) => bail!("no output directory: pass -o DIR"),
    };
    check_output_dir(&a.src, &out, a.force)?;
    if is_container(&out) {
        if !a.force {
            bail!("{}: already holds a converted model (pass --force to replace it)", out.display());
        }
        for f in [MANIFEST_FILE, DATA_FILE, JOURNAL] {
            let _ = std::fs::remove_file(out.join(f));
        }
    }
    let created = !out.exists();
    std::fs::create_dir_all(&out).with_context(|| format!("{}: cannot create", out.display()))?;
    let start = Instant::now();
    let mut job = match plan_job(a, &out) {
        Ok(job) => job,
        Err(e) => {
            // A source refused before anything is written leaves no directory behind.
            if created {
                let _ = std::fs::remove_dir(&out);
            }
            return Err(e);
        }
    };
    let header = format!("colibri-convert-journal 1 {}", job.fingerprint(partial.as_ref().map(|p| p.source_id))?);
    let journal_path = job.out.join(JOURNAL);
    let partial_path = job.out.join(format!("{DATA_FILE}.partial"));
    let previous = read_journal(&journal_path, &header);
    if previous.is_empty() {
        let _ = std::fs::remove_file(&partial_path);
        let mut j =
            File::create(&journal_path).with_context(|| format!("{}: cannot create", journal_path.display()))?;
        writeln!(j, "{header}")?;
        j.sync_all()?;
    }
    let data = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&partial_path)
        .with_context(|| format!("{}: cannot open", partial_path.display()))?;
    data.set_len(job.manifest.data_size)?;
    let mut journal = OpenOptions::new().append(true).open(&journal_path)?;

    // Keep what a previous run finished, if its bytes still check out.
    let n = job.items.len();
    let mut sums: Vec<Option<u64>> = vec![None; n];
    for (k, sum) in previous {
        if partial.as_ref().is_some_and(|p| p.known.get(&k) == Some(&sum)) {
            sums[k] = Some(sum);
        } else if k < n {
            let (off, len) = job.ranges[k];
            let mut buf = vec![0u8; len as usize];
            if read_at(&data, &mut buf, off).is_ok() && checksum(&buf) == sum {
                sums[k] = Some(sum);
            }
        }
    }
    let total: u64 = job.ranges.iter().map(|r| r.1).sum();
    let kept = sums.iter().filter(|s| s.is_some()).count();
    let progress = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    if kept > 0 && partial.is_none() {
        eprintln!("resuming: {kept} of {n} items already converted");
        progress.inc(job.ranges.iter().zip(&sums).filter(|(_, s)| s.is_some()).map(|(r, _)| r.1).sum());
    }
    progress.set_message("converting");

    // Test hooks: exit hard after N items of this run (before journaling the Nth), or
    // sleep after each item so that a test can kill the process midway.
    let abort_after: Option<usize> = std::env::var("COLI_CONVERT_ABORT_AFTER").ok().and_then(|v| v.parse().ok());
    let delay =
        std::env::var("COLI_CONVERT_ITEM_DELAY_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    let mut pending: Vec<(usize, u64)> = Vec::new();
    let (mut pending_bytes, mut last_commit, mut written) = (0u64, Instant::now(), 0usize);
    let mut commit = |pending: &mut Vec<(usize, u64)>| -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        data.sync_data()?;
        let mut lines = String::new();
        for (k, s) in pending.drain(..) {
            lines.push_str(&format!("{k} {}\n", checksum_hex(s)));
        }
        journal.write_all(lines.as_bytes())?;
        journal.sync_data()?;
        Ok(())
    };
    let by_layer = if partial.is_some() { job.experts_by_layer() } else { Default::default() };
    let mut needed = std::collections::HashSet::new();
    for (k, sum) in sums.iter_mut().enumerate() {
        if sum.is_some() {
            continue;
        }
        if let Some(p) = &partial {
            let tensors = job.item_tensors(k, &by_layer);
            if !tensors.iter().all(|t| p.available.contains(t)) {
                needed.extend(tensors);
                continue;
            }
        }
        let s = job.write_item(k, &data, &progress)?;
        *sum = Some(s);
        written += 1;
        if abort_after == Some(written) {
            std::process::exit(75);
        }
        pending.push((k, s));
        pending_bytes += job.ranges[k].1;
        if abort_after.is_some() || pending_bytes >= 64 << 20 || last_commit.elapsed() >= Duration::from_millis(250) {
            commit(&mut pending)?;
            (pending_bytes, last_commit) = (0, Instant::now());
        }
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    }
    commit(&mut pending)?;
    progress.finish_and_clear();
    if let Some(p) = &mut partial {
        p.known.extend(sums.iter().enumerate().filter_map(|(k, s)| s.map(|s| (k, s))));
        if sums.iter().any(Option::is_none) {
            return Ok(Pass::Pending { needed });
        }
    }

    // Fill in the checksums; the manifest goes last.
    let mut k = 0;
    for t in &mut job.manifest.dense.tensors {
        t.xxh3 = checksum_hex(sums[k].unwrap_or(0));
        k += 1;
    }
    for l in &mut job.manifest.experts.layers {
        for e in &mut l.experts {
            e.xxh3 = checksum_hex(sums[k].unwrap_or(0));
            k += 1;
        }
    }
    for f in &job.manifest.files {
        let to = job.out.join(f);
        if let Some((_, bytes)) = job.generated.iter().find(|(n, _)| n == f) {
            std::fs::write(&to, bytes).with_context(|| format!("{}: cannot write", to.display()))?;
            continue;
        }
        let from = job.src_dir.join(f);
        std::fs::copy(&from, &to).with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    }
    drop(data);
    std::fs::rename(&partial_path, job.out.join(DATA_FILE))?;
    let tmp = job.out.join(format!("{MANIFEST_FILE}.partial"));
    let mut mf = File::create(&tmp)?;
    mf.write_all(&job.manifest.to_json())?;
    mf.sync_all()?;
    std::fs::rename(&tmp, job.out.join(MANIFEST_FILE))?;
    sync_dir(&job.out);
    let _ = std::fs::remove_file(&journal_path);
    let (dense, experts) = job.manifest.byte_totals();
    eprintln!(
        "converted {} to {} in {:.1}s: {} resident + {} in {} experts",
        a.src.display(),
        out.display(),
        start.elapsed().as_secs_f64(),
        crate::commands::info::human(dense),
        crate::commands::info::human(experts),
        job.manifest.experts.layers.iter().map(|l| l.experts.len()).sum::<usize>()
    );
    Ok(Pass::Finished)
}
