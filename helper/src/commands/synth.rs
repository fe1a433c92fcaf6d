//! `coli synth`: writes a synthetic OLMoE-shaped checkpoint in Hugging Face layout
//! (config.json, sharded bf16 safetensors with an index) from a seeded generator, to
//! benchmark models far larger than the expert-cache budget. Defaults are the shape of
//! OLMoE-1B-7B (hidden 2048, 16 layers, 64 experts of intermediate 1024, top-8, vocab
//! 50304: about 13 GB in bf16); `--layers`, `--experts` and friends shrink it.
//!
//! Streams row by row: memory stays a few megabytes whatever the model size. Weights are
//! uniform in ±sqrt(3 / fan_in) (unit-variance outputs for unit-variance inputs), norms
//! are ones, so activations stay finite through every layer. The same seed and shape give
//! the same bytes, however the tensors are sharded.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};

use crate::flags::parse_bytes;

#[derive(Args)]
pub struct SynthArgs {
    /// Output directory (created; must not hold a model already).
    #[arg(short, long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 16)]
    pub layers: usize,
    #[arg(long, default_value_t = 64)]
    pub experts: usize,
    #[arg(long, default_value_t = 8)]
    pub top_k: usize,
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    /// Intermediate size of each expert.
    #[arg(long, default_value_t = 1024)]
    pub intermediate: usize,
    #[arg(long, default_value_t = 16)]
    pub heads: usize,
    #[arg(long, default_value_t = 50304)]
    pub vocab: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Largest shard file (suffixes K, M, G).
    #[arg(long, default_value = "2G", value_parser = parse_bytes)]
    pub shard_size: u64,
}

/// One tensor to write: name, shape, and the bound of its uniform values (0: all ones).
struct Spec {
    name: String,
    shape: Vec<usize>,
    bound: f32,
}

impl Spec {
    fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * 2
    }
}

fn specs(a: &SynthArgs) -> Vec<Spec> {
    let (h, i, ne, v) = (a.hidden, a.intermediate, a.experts, a.vocab);
    let w = |name: String, rows: usize, cols: usize| Spec {
        name,
        shape: vec![rows, cols],
        bound: (3.0 / cols as f32).sqrt(),
    };
    let ones = |name: String, n: usize| Spec { name, shape: vec![n], bound: 0.0 };
    let mut out = vec![Spec { name: "model.embed_tokens.weight".into(), shape: vec![v, h], bound: 1.0 }];
    for l in 0..a.layers {
        let p = format!("model.layers.{l}");
        out.push(ones(format!("{p}.input_layernorm.weight"), h));
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            out.push(w(format!("{p}.self_attn.{proj}.weight"), h, h));
        }
        out.push(ones(format!("{p}.self_attn.q_norm.weight"), h));
        out.push(ones(format!("{p}.self_attn.k_norm.weight"), h));
        out.push(ones(format!("{p}.post_attention_layernorm.weight"), h));
        out.push(w(format!("{p}.mlp.gate.weight"), ne, h));
        for e in 0..ne {
            out.push(w(format!("{p}.mlp.experts.{e}.gate_proj.weight"), i, h));
            out.push(w(format!("{p}.mlp.experts.{e}.up_proj.weight"), i, h));
            out.push(w(format!("{p}.mlp.experts.{e}.down_proj.weight"), h, i));
        }
    }
    out.push(ones("model.norm.weight".into(), h));
    out.push(w("lm_head.weight".into(), v, h));
    out
}

fn config(a: &SynthArgs) -> Value {
    json!({
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "num_experts": a.experts,
        "num_experts_per_tok": a.top_k,
        "norm_topk_prob": false,
        "vocab_size": a.vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "clip_qkv": null,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "dtype": "bfloat16",
        "eos_token_id": 1,
        "colibri_synthetic": {"seed": a.seed, "generator": "coli synth"},
    })
}

/// splitmix64: a fast, well-mixed stream per tensor.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn seed_of(seed: u64, name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), seed)
}

/// f32 -> bf16, rounding to nearest even (finite values only).
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Writes one tensor's values as bf16, a row at a time.
fn write_tensor(out: &mut impl Write, s: &Spec, seed: u64) -> std::io::Result<()> {
    let cols = *s.shape.last().unwrap_or(&1);
    let rows = s.shape.iter().product::<usize>() / cols.max(1);
    let mut row = vec![0u8; cols * 2];
    let mut rng = Rng(seed_of(seed, &s.name));
    for _ in 0..rows {
        for chunk in row.chunks_mut(8) {
            let r = rng.next();
            for (k, b) in chunk.chunks_exact_mut(2).enumerate() {
                // 16 random bits -> uniform in [-bound, bound); bound 0 means a norm of ones.
                let v =
                    if s.bound == 0.0 { 1.0 } else { (((r >> (16 * k)) & 0xFFFF) as f32 / 32768.0 - 1.0) * s.bound };
                b.copy_from_slice(&bf16_bits(v).to_le_bytes());
            }
        }
        out.write_all(&row)?;
    }
    Ok(())
}

pub fn run(a: SynthArgs) -> Result<()> {
    if a.layers == 0
        || a.experts == 0
        || a.top_k == 0
        || a.top_k > a.experts
        || a.hidden == 0
        || a.heads == 0
        || !a.hidden.is_multiple_of(a.heads)
    {
        anyhow::bail!("bad shape: need layers, experts, hidden, heads > 0, top_k <= experts, heads dividing hidden");
    }
    if a.out.join("config.json").exists() {
        anyhow::bail!("{}: already holds a model", a.out.display());
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("{}: cannot create", a.out.display()))?;
    let all = specs(&a);
    // Shards: consecutive tensors up to the size limit.
    let mut shards: Vec<Vec<&Spec>> = vec![Vec::new()];
    let mut size = 0u64;
    for s in &all {
        if size > 0 && size + s.bytes() > a.shard_size {
            shards.push(Vec::new());
            size = 0;
        }
        size += s.bytes();
        if let Some(last) = shards.last_mut() {
            last.push(s);
        }
    }
    let n = shards.len();
    let total: u64 = all.iter().map(Spec::bytes).sum();
    let mut weight_map = Map::new();
    for (k, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        let mut header = Map::new();
        let mut off = 0u64;
        for s in shard {
            header.insert(
                s.name.clone(),
                json!({"dtype": "BF16", "shape": s.shape, "data_offsets": [off, off + s.bytes()]}),
            );
            off += s.bytes();
            weight_map.insert(s.name.clone(), json!(file));
        }
        let mut h = serde_json::to_vec(&Value::Object(header))?;
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let path = a.out.join(&file);
        let mut w = BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&path).with_context(|| format!("{}: cannot create", path.display()))?,
        );
        let write = |w: &mut BufWriter<std::fs::File>| -> std::io::Result<()> {
            w.write_all(&(h.len() as u64).to_le_bytes())?;
            w.write_all(&h)?;
            for s in shard {
                write_tensor(w, s, a.seed)?;
            }
            w.flush()
        };
        write(&mut w).with_context(|| format!("{}: cannot write", path.display()))?;
        eprintln!("coli synth: wrote {file} ({:.2} GB)", off as f64 / 1e9);
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(a.out.join("model.safetensors.index.json"), serde_json::to_vec_pretty(&index)?)?;
    std::fs::write(a.out.join("config.json"), serde_json::to_vec_pretty(&config(&a))?)?;
    println!("{}", json!({"out": a.out.display().to_string(), "shards": n, "bytes": total, "config": config(&a)}));
    Ok(())
}
