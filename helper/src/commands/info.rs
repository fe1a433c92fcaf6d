//! `coli info PATH`: what a model directory holds (a Hugging Face checkpoint or a colibri
//! container): architecture, shape, quantization, resident versus streamed bytes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::format::is_container;
use colibri_engine::format::tensors::TensorStore;
use colibri_engine::model::open::ModelDir;
use colibri_engine::ModelConfig;
use serde_json::json;

#[derive(Args)]
pub struct InfoArgs {
    /// Model: a directory (Hugging Face checkpoint or converted colibri model) or the id of
    /// an installed model (`coli list`).
    #[arg(required_unless_present = "model")]
    pub path: Option<PathBuf>,
    /// The model, as a flag (same as PATH).
    #[arg(long, conflicts_with = "path")]
    pub model: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Bytes in binary units, e.g. "1.5 GiB".
pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Facts about a model directory, whatever its format.
pub struct Summary {
    pub format: String,
    pub cfg: ModelConfig,
    pub quant: String,
    /// The default stored type in a few characters: "int4/g64", "bf16".
    pub quant_short: String,
    pub resident: u64,
    pub streamed: u64,
    pub n_experts_total: u64,
}

impl Summary {
    pub fn expert_bytes(&self) -> u64 {
        self.streamed.checked_div(self.n_experts_total).unwrap_or(0)
    }

    /// Upper bound on the bytes one decode step touches: the resident set plus top-k
    /// experts of every MoE layer.
    pub fn per_token(&self) -> u64 {
        let moe = self.cfg.moe_layers.iter().filter(|m| **m).count() as u64;
        self.resident + moe * self.cfg.router.top_k as u64 * self.expert_bytes()
    }
}

fn read_config(dir: &Path) -> Result<ModelConfig> {
    let p = dir.join("config.json");
    let bytes = std::fs::read(&p).with_context(|| format!("{}: cannot read", p.display()))?;
    ModelConfig::from_json_bytes(&bytes).with_context(|| p.display().to_string())
}

/// A GGUF file, read as `coli convert` would convert it.
fn summarize_gguf(path: &Path) -> Result<Summary> {
    let p = super::convert_gguf::parse(path)?;
    let cfg = ModelConfig::from_value(&p.imported.config).with_context(|| path.display().to_string())?;
    let (mut resident, mut streamed) = (0u64, 0u64);
    for t in &p.gguf.tensors {
        if t.name.contains("_exps.") || t.name.starts_with("blk.") && t.name.matches('.').count() == 4 {
            streamed += t.size;
        } else {
            resident += t.size;
        }
    }
    let types: Vec<String> = p.imported.source_types.iter().map(|(k, n)| format!("{k} x {n}")).collect();
    let moe = cfg.moe_layers.iter().filter(|m| **m).count() as u64;
    Ok(Summary {
        format: format!(
            "GGUF v{} (llama.cpp architecture {}; `coli convert` makes a colibri model of it)",
            p.gguf.version, p.imported.arch
        ),
        quant: match super::convert_gguf::converted_types(&p).as_slice() {
            [] => format!("GGUF tensors {}; `coli convert` keeps every value exactly", types.join(", ")),
            conv => format!(
                "GGUF tensors {}; `coli convert` keeps every value exactly but those of {}: the container has no such format",
                types.join(", "),
                conv.join(", ")
            ),
        },
        quant_short: "gguf".into(),
        resident,
        streamed,
        n_experts_total: moe * cfg.router.n_experts as u64,
        cfg,
    })
}

pub fn summarize(dir: &Path) -> Result<Summary> {
    if super::convert_gguf::is_gguf(dir) {
        return summarize_gguf(dir);
    }
    if !dir.is_dir() {
        bail!("{}: no such model directory", dir.display());
    }
    if is_container(dir) {
        let (c, _) = ModelDir::open(dir, false)?.into_container()?;
        let (m, cfg) = (&c.manifest, c.cfg.clone());
        let (resident, streamed) = m.byte_totals();
        let classes: Vec<String> = m.quant.classes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        return Ok(Summary {
            format: match super::convert_gguf::describe_source(m.source.as_ref()) {
                Some(src) => {
                    format!("colibri container v{} ({}, {}), {src}", m.version, m.data_file, human(m.data_size))
                }
                None => format!("colibri container v{} ({}, {})", m.version, m.data_file, human(m.data_size)),
            },
            cfg,
            quant: match m.quant.default.as_str() {
                // An FP8 checkpoint kept as it is: the classes carry their blocks (fp8/b128).
                "fp8" => format!("fp8, as the checkpoint stores it: {}", classes.join(", ")),
                // A GGUF import without --quant: each tensor in the type that keeps its values
                // (the classes carry their groups; a q4_k row has none).
                "gguf" => format!("gguf, each tensor as the file stores it: {}", classes.join(", ")),
                d => format!("{d} (group {}): {}", m.quant.group_size, classes.join(", ")),
            },
            quant_short: match m.quant.default.as_str() {
                q @ ("int4" | "int8") => format!("{q}/g{}", m.quant.group_size),
                q => q.to_string(),
            },
            resident,
            streamed,
            n_experts_total: m.experts.layers.iter().map(|l| l.experts.len() as u64).sum(),
        });
    }
    let cfg = read_config(dir)?;
    // Only names, dtypes and sizes are needed: a large checkpoint is not even mapped.
    let store = TensorStore::open_dir_streamed(dir)?;
    let (mut resident, mut streamed) = (0u64, 0u64);
    let mut dtypes = BTreeSet::new();
    for n in store.names() {
        let t = store.get(n)?;
        // An MXFP4 checkpoint's experts are u8 blocks and scales: name what they encode.
        let mxfp4 = n.ends_with("_blocks") || n.ends_with("_scales");
        dtypes.insert(if mxfp4 && t.dtype == colibri_engine::tensor::DType::U8 { "mxfp4" } else { t.dtype.name() });
        if colibri_engine::format::tensors::is_routed_expert_weight(n) {
            streamed += t.bytes.len() as u64;
        } else {
            resident += t.bytes.len() as u64;
        }
    }
    let moe = cfg.moe_layers.iter().filter(|m| **m).count() as u64;
    let dtypes = dtypes.into_iter().collect::<Vec<_>>().join(",");
    Ok(Summary {
        format: "Hugging Face checkpoint (safetensors)".into(),
        quant: if dtypes.contains("mxfp4") && dtypes.contains("fp8") {
            format!("FP4 experts read as MXFP4 rows, FP8 block-scaled e4m3 dense weights ({dtypes})")
        } else if dtypes.contains("mxfp4") {
            format!("MXFP4 experts ({dtypes})")
        } else if dtypes.contains("fp8") {
            format!("FP8 block-scaled e4m3, read as FP8 rows ({dtypes})")
        } else {
            format!("none ({dtypes})")
        },
        quant_short: dtypes,
        resident,
        streamed,
        n_experts_total: moe * cfg.router.n_experts as u64,
        cfg,
    })
}

pub fn info(a: InfoArgs) -> Result<()> {
    let arg = a.path.or(a.model).context("no model given")?;
    let path = crate::paths::resolve_model(&arg, None)?;
    let s = summarize(&path)?;
    let c = &s.cfg;
    let moe = c.moe_layers.iter().filter(|m| **m).count();
    if a.json {
        let v = json!({
            "path": path.display().to_string(),
            "format": s.format,
            "model_type": c.model_type,
            "layers": c.n_layers,
            "moe_layers": moe,
            "hidden": c.hidden,
            "heads": c.n_heads,
            "kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim,
            "vocab": c.vocab,
            "context": c.max_positions,
            "experts_per_layer": c.router.n_experts,
            "top_k": c.router.top_k,
            "expert_intermediate": c.expert_intermediate,
            "shared_expert_intermediate": c.shared_expert_intermediate,
            "attention": c.attention_kind(),
            "kv_cache_bytes_per_token": c.kv_cache_bytes_per_token(),
            "recurrent_state_bytes": c.recurrent_state_bytes(),
            "quantization": s.quant,
            "resident_bytes": s.resident,
            "streamed_bytes": s.streamed,
            "experts": s.n_experts_total,
            "expert_bytes": s.expert_bytes(),
            "per_token_bytes": s.per_token(),
        });
        println!("{v}");
        return Ok(());
    }
    println!("model         {}", path.display());
    println!("format        {}", s.format);
    println!(
        "architecture  {}: {} layers ({moe} MoE), hidden {}, {} heads ({} kv) x {}, vocab {}, context {}",
        c.model_type, c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab, c.max_positions
    );
    let kv = c.cache_floats_per_layer();
    if let Some(v4) = &c.v4 {
        let count = |k: colibri_engine::model::config::V4Attn| v4.layers.iter().filter(|&&x| x == k).count();
        use colibri_engine::model::config::V4Attn::{Csa, Hca, Sliding};
        println!(
            "attention     DeepSeek-V4: a window of {} keys on every layer; {} sliding-only, {} CSA (an entry per {} positions, top {} by the indexer), {} HCA (an entry per {}); the cache grows by {} bytes per token",
            v4.window,
            count(Sliding),
            count(Csa),
            v4.csa_rate,
            v4.index_topk,
            count(Hca),
            v4.hca_rate,
            c.kv_cache_bytes_per_token()
        );
    } else {
        match &c.mla {
        Some(m) => match &m.dsa {
            None => println!(
                "attention     MLA: latent {} + rope key {} = {kv} floats cached per token and layer",
                m.kv_lora_rank, m.qk_rope_head_dim
            ),
            Some(d) => println!(
                "attention     MLA with DeepSeek Sparse Attention (top {} positions per query, indexer on {} of {} layers): latent {} + rope key {} + indexer key {} = {kv} floats cached per token and indexer layer",
                d.topk,
                d.full.iter().filter(|f| **f).count(),
                c.n_layers,
                m.kv_lora_rank,
                m.qk_rope_head_dim,
                d.head_dim
            ),
        },
        None if c.linear_attn.is_some() => println!(
            "attention     GQA on {} of {} layers: {kv} floats cached per token and attention layer",
            c.attention_layers(),
            c.n_layers
        ),
        None => println!("attention     GQA: {kv} floats cached per token and layer"),
    }
    }
    if let Some(la) = &c.linear_attn {
        println!(
            "linear attn   Gated DeltaNet on {} of {} layers: {} floats of recurrent state each, whatever the length",
            c.n_layers - c.attention_layers(),
            c.n_layers,
            la.state_floats()
        );
    }
    let shared = c.shared_expert_intermediate.map(|i| format!(", shared expert {i}")).unwrap_or_default();
    println!(
        "experts       {} per MoE layer, top-{}, intermediate {}{shared}",
        c.router.n_experts, c.router.top_k, c.expert_intermediate
    );
    println!("quantization  {}", s.quant);
    println!("resident      {} (embeddings, attention, norms, routers, dense/shared MLPs)", human(s.resident));
    println!(
        "streamed      {} ({} routed experts of {} each)",
        human(s.streamed),
        s.n_experts_total,
        human(s.expert_bytes())
    );
    println!(
        "per token     {} at most (resident + top-{} experts x {moe} layers)",
        human(s.per_token()),
        c.router.top_k
    );
    Ok(())
}
