//! `coli synth`: writes a synthetic OLMoE-shaped checkpoint in Hugging Face layout
//! (config.json, sharded bf16 safetensors with an index) from a seeded generator, to
//! benchmark models far larger than the expert-cache budget. Defaults are the shape of
//! OLMoE-1B-7B (hidden 2048, 16 layers, 64 experts of intermediate 1024, top-8, vocab
//! 50304: about 13 GB in bf16); `--layers`, `--experts` and friends shrink it.
//! `--shape deepseek-v3` writes a DeepSeek-V3-shaped one instead (MLA, sigmoid router with
//! a correction bias, shared experts, dense first layers: synth_deepseek.rs), and `--fp8`
//! stores the decoder layers' linear weights as the FP8 releases do (e4m3 with a
//! `weight_scale_inv` per block, `quantization_config.quant_method = "fp8"`).
//! `--shape deepseek-v4-flash` writes DeepSeek-V4-Flash's shape (but for `--layers` and
//! `--experts`) in its release's layout: FP8 dense weights with ue8m0 scales, FP4 routed
//! experts, hyper-connections, the three kinds of attention (synth_deepseek_v4.rs).
//!
//! Streams row by row: memory stays a few megabytes whatever the model size. Weights are
//! uniform in ±sqrt(3 / fan_in) (unit-variance outputs for unit-variance inputs), norms
//! are ones, so activations stay finite through every layer. The same seed and shape give
//! the same bytes, however the tensors are sharded.
//!
//! `--routing trained` gives routers whose choices look like a trained model's rather
//! than uniform (docs/benchmarks.md, "Realistic routing"): the first [`CTRL`] coordinates
//! of the hidden state are a control channel that the embedding sets per token and that
//! no attention or expert reads or writes, so it reaches every layer's router unchanged.
//! Each router reads it through per-expert affinities (a bias coordinate for skewed
//! popularity, `--route-skew`; token affinities correlated from layer to layer,
//! `--route-layer-corr`) plus the rest of the hidden state (`--route-context`), which
//! carries the context that attention mixed in. Routing then depends mostly on the token
//! and its context, as in trained models, and consecutive layers choose related experts.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};

use crate::flags::parse_bytes;
use colibri_engine::tensor::e4m3_from_f32;

#[path = "synth_deepseek.rs"]
mod deepseek;
#[path = "synth_deepseek_v4.rs"]
mod deepseek_v4;

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
    /// Routers: random (every expert equally likely, whatever the token) or trained
    /// (skewed popularity, token- and context-dependent, related from layer to layer).
    #[arg(long, value_enum, default_value_t = Routing::Random)]
    pub routing: Routing,
    /// --routing trained: spread of the experts' popularity (the standard deviation of a
    /// per-expert router bias, in units of the token part's).
    #[arg(long, default_value_t = 1.3)]
    pub route_skew: f32,
    /// --routing trained: weight of the context (the hidden state outside the control
    /// channel) in the router logits, against the token's own affinities.
    #[arg(long, default_value_t = 1.0)]
    pub route_context: f32,
    /// --routing trained: correlation of one layer's token affinities with the layer
    /// before's (0: unrelated layers).
    #[arg(long, default_value_t = 0.8)]
    pub route_layer_corr: f32,
    /// Copy tokenizer.json (and tokenizer_config.json) from this model directory, so that
    /// text prompts and `coli bench --text` work; --vocab must cover its ids.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The architecture: OLMoE's, or DeepSeek-V3's (MLA attention with q/k heads of
    /// 128 + 64 and value heads of 128, a sigmoid router with a correction bias, shared
    /// experts, `--first-dense` dense layers of 9 x --intermediate).
    #[arg(long, value_enum, default_value_t = Shape::Olmoe)]
    pub shape: Shape,
    /// Store the decoder layers' linear weights (attention, dense MLPs, experts; not the
    /// router, norms, embedding or output) as block-scaled FP8, as the DeepSeek-V3/Kimi-K2/
    /// GLM-5 releases do: float8_e4m3fn plus a float32 `<name>_scale_inv` per block.
    #[arg(long)]
    pub fp8: bool,
    /// --fp8: the square block of one scale (the releases' 128).
    #[arg(long, default_value_t = 128)]
    pub fp8_block: usize,
    /// --shape deepseek-v3: the leading dense (non-MoE) layers (`first_k_dense_replace`).
    #[arg(long, default_value_t = 1)]
    pub first_dense: usize,
    /// --shape deepseek-v3: shared experts per MoE layer.
    #[arg(long, default_value_t = 1)]
    pub shared_experts: usize,
    /// --shape deepseek-v3: rank of the query's low-rank projection.
    #[arg(long, default_value_t = 1536)]
    pub q_lora_rank: usize,
    /// --shape deepseek-v3: rank of the key/value latent.
    #[arg(long, default_value_t = 512)]
    pub kv_lora_rank: usize,
}

/// `--shape`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    Olmoe,
    DeepseekV3,
    /// DeepSeek-V4-Flash's sizes but for --layers and --experts, in the release's layout
    /// (FP8 dense weights, FP4 experts; synth_deepseek_v4.rs).
    DeepseekV4Flash,
}

/// `--routing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Routing {
    Random,
    Trained,
}

/// Coordinates of the control channel of `--routing trained` (see the module docs).
pub const CTRL: usize = 16;

/// One tensor to write: name, shape, the bound of its uniform values (0: all ones), how
/// `--routing trained` changes it, and how it is stored.
struct Spec {
    name: String,
    shape: Vec<usize>,
    bound: f32,
    fill: Fill,
    dtype: Dt,
}

/// How a tensor is stored.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Dt {
    Bf16,
    F32,
    /// float8_e4m3fn bytes: e4m3(u * 448) for the uniform u in [-1, 1) (the weight's
    /// value is that times its block's scale).
    Fp8,
    /// The f32 block scales of an Fp8 weight whose values are bounded by the spec's
    /// `bound`: bound * (1 + u / 4) / 448 per block, so the blocks' ranges differ.
    Fp8Scale,
    /// Packed FP4 (two random e2m1 codes a byte, stored as I8; the shape's last dimension
    /// is the bytes).
    Fp4,
    /// ue8m0 scale bytes (F8_E8M0): the power of two nearest the spec's `bound`.
    E8m0,
    /// I64 expert ids below the given count, distinct along a row (tid2eid).
    Ids(usize),
}

impl Dt {
    fn size(self) -> u64 {
        match self {
            Dt::Bf16 => 2,
            Dt::F32 | Dt::Fp8Scale => 4,
            Dt::Fp8 | Dt::Fp4 | Dt::E8m0 => 1,
            Dt::Ids(_) => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dt::Bf16 => "BF16",
            Dt::F32 | Dt::Fp8Scale => "F32",
            Dt::Fp8 => "F8_E4M3",
            Dt::Fp4 => "I8",
            Dt::E8m0 => "F8_E8M0",
            Dt::Ids(_) => "I64",
        }
    }
}

/// What `--routing trained` does to a tensor's values.
#[derive(Clone, Copy, PartialEq)]
enum Fill {
    /// Uniform values as they are.
    Plain,
    /// Zero the columns of the control channel (a matrix that must not read it).
    NoCtrlIn,
    /// Zero the rows of the control channel (a matrix that must not write it).
    NoCtrlOut,
    /// Token embeddings: the control channel holds the token's control vector.
    Embed,
    /// The router of MoE layer `.0`.
    Router(usize),
}

impl Spec {
    fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size()
    }
}

/// The tensors of the model `a` describes, FP8 where `--fp8` puts them.
fn specs(a: &SynthArgs) -> Vec<Spec> {
    let all = match a.shape {
        Shape::Olmoe => specs_olmoe(a),
        Shape::DeepseekV3 => deepseek::specs(a),
        Shape::DeepseekV4Flash => return deepseek_v4::specs(a),
    };
    if a.fp8 {
        fp8_specs(all, a.fp8_block)
    } else {
        all
    }
}

/// Whether `--fp8` stores this tensor as FP8: the 2-D weights of the decoder layers
/// except the router (the releases keep it, the norms, the embedding and the output
/// projection in bf16).
fn is_fp8(s: &Spec) -> bool {
    s.dtype == Dt::Bf16
        && s.shape.len() == 2
        && s.name.starts_with("model.layers.")
        && !s.name.ends_with(".mlp.gate.weight")
}

/// `all` with each FP8 weight stored as e4m3 and followed by its `_scale_inv`
/// `[ceil(rows / block), ceil(cols / block)]`.
fn fp8_specs(all: Vec<Spec>, block: usize) -> Vec<Spec> {
    let mut out = Vec::with_capacity(all.len() * 2);
    for s in all {
        if !is_fp8(&s) {
            out.push(s);
            continue;
        }
        let scale = Spec {
            name: format!("{}_scale_inv", s.name),
            shape: vec![s.shape[0].div_ceil(block), s.shape[1].div_ceil(block)],
            bound: s.bound,
            fill: Fill::Plain,
            dtype: Dt::Fp8Scale,
        };
        out.push(Spec { dtype: Dt::Fp8, ..s });
        out.push(scale);
    }
    out
}

/// The `quantization_config` of `--fp8`.
fn quantization_config(a: &SynthArgs) -> Value {
    json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [a.fp8_block, a.fp8_block]})
}

fn specs_olmoe(a: &SynthArgs) -> Vec<Spec> {
    let (h, i, ne, v) = (a.hidden, a.intermediate, a.experts, a.vocab);
    let trained = a.routing == Routing::Trained;
    let f = |fill: Fill| if trained { fill } else { Fill::Plain };
    let w = |name: String, rows: usize, cols: usize, fill: Fill| Spec {
        name,
        shape: vec![rows, cols],
        bound: (3.0 / cols as f32).sqrt(),
        fill: f(fill),
        dtype: Dt::Bf16,
    };
    let ones = |name: String, n: usize| Spec { name, shape: vec![n], bound: 0.0, fill: Fill::Plain, dtype: Dt::Bf16 };
    let mut out = vec![Spec {
        name: "model.embed_tokens.weight".into(),
        shape: vec![v, h],
        bound: 1.0,
        fill: f(Fill::Embed),
        dtype: Dt::Bf16,
    }];
    for l in 0..a.layers {
        let p = format!("model.layers.{l}");
        out.push(ones(format!("{p}.input_layernorm.weight"), h));
        for proj in ["q_proj", "k_proj", "v_proj"] {
            out.push(w(format!("{p}.self_attn.{proj}.weight"), h, h, Fill::NoCtrlIn));
        }
        out.push(w(format!("{p}.self_attn.o_proj.weight"), h, h, Fill::NoCtrlOut));
        out.push(ones(format!("{p}.self_attn.q_norm.weight"), h));
        out.push(ones(format!("{p}.self_attn.k_norm.weight"), h));
        out.push(ones(format!("{p}.post_attention_layernorm.weight"), h));
        out.push(w(format!("{p}.mlp.gate.weight"), ne, h, Fill::Router(l)));
        for e in 0..ne {
            out.push(w(format!("{p}.mlp.experts.{e}.gate_proj.weight"), i, h, Fill::NoCtrlIn));
            out.push(w(format!("{p}.mlp.experts.{e}.up_proj.weight"), i, h, Fill::NoCtrlIn));
            out.push(w(format!("{p}.mlp.experts.{e}.down_proj.weight"), h, i, Fill::NoCtrlOut));
        }
    }
    out.push(ones("model.norm.weight".into(), h));
    out.push(w("lm_head.weight".into(), v, h, Fill::Plain));
    out
}

fn config(a: &SynthArgs) -> Value {
    let mut c = match a.shape {
        Shape::Olmoe => config_olmoe(a),
        Shape::DeepseekV3 => deepseek::config(a),
        Shape::DeepseekV4Flash => return deepseek_v4::config(a),
    };
    if a.fp8 {
        c["quantization_config"] = quantization_config(a);
    }
    c
}

fn config_olmoe(a: &SynthArgs) -> Value {
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
        "colibri_synthetic": {"seed": a.seed, "generator": "coli synth", "routing": routing_json(a)},
    })
}

/// Copies the tokenizer files of the model directory `from` next to the synthetic model,
/// refusing a tokenizer whose ids the vocabulary does not cover.
fn copy_tokenizer(from: &std::path::Path, a: &SynthArgs) -> Result<()> {
    let tok = colibri_engine::tokenizer::Tokenizer::from_dir(from)
        .with_context(|| format!("--tokenizer {}", from.display()))?;
    if tok.vocab_size() > a.vocab {
        anyhow::bail!("--tokenizer {}: {} tokens, more than --vocab {}", from.display(), tok.vocab_size(), a.vocab);
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if from.join(f).is_file() {
            std::fs::copy(from.join(f), a.out.join(f)).with_context(|| format!("--tokenizer: copying {f}"))?;
        }
    }
    Ok(())
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

fn routing_json(a: &SynthArgs) -> Value {
    match a.routing {
        Routing::Random => json!("random"),
        Routing::Trained => json!({"kind": "trained", "control_dims": CTRL, "skew": a.route_skew,
            "context": a.route_context, "layer_corr": a.route_layer_corr}),
    }
}

/// A uniform value in [-1, 1) from 16 random bits.
fn unit(bits: u64) -> f32 {
    (bits & 0xFFFF) as f32 / 32768.0 - 1.0
}

/// The router affinities of `--routing trained`: per layer and expert, CTRL values read
/// from the control channel (index 0: the popularity bias; the rest: token affinities of
/// unit variance over tokens, correlated with the layer before's by `layer_corr`).
struct Affinities {
    /// [layer][expert][CTRL]
    a: Vec<Vec<[f32; CTRL]>>,
}

impl Affinities {
    fn new(a: &SynthArgs) -> Self {
        let rho = a.route_layer_corr.clamp(0.0, 1.0);
        let fresh_w = (1.0 - rho * rho).sqrt();
        // unit() has variance 1/3: token affinities of variance 1/(CTRL-1) give the token
        // part of a logit (CTRL-1 unit-variance control values) unit variance.
        let scale = (3.0f32 / (CTRL - 1) as f32).sqrt();
        let mut out: Vec<Vec<[f32; CTRL]>> = Vec::with_capacity(a.layers);
        for l in 0..a.layers {
            let mut rng = Rng(seed_of(a.seed, &format!("routing.affinities.{l}")));
            let mut layer = Vec::with_capacity(a.experts);
            let prev: Vec<[f32; CTRL]> = out.last().cloned().unwrap_or_else(|| vec![[0f32; CTRL]; a.experts]);
            for p in &prev {
                let mut v = [0f32; CTRL];
                // Popularity: a bias of standard deviation `skew` (a sum of 4 uniforms
                // is close enough to a normal).
                let g: f32 = (0..4).map(|_| unit(rng.next())).sum::<f32>() * (3.0f32 / 4.0).sqrt();
                v[0] = a.route_skew * g;
                for (j, x) in v.iter_mut().enumerate().skip(1) {
                    let fresh = unit(rng.next()) * scale;
                    *x = match l {
                        0 => fresh,
                        _ => rho * p[j] + fresh_w * fresh,
                    };
                }
                layer.push(v);
            }
            out.push(layer);
        }
        Affinities { a: out }
    }
}

/// Writes one tensor's values as bf16, a row at a time.
fn write_tensor(
    out: &mut impl Write,
    s: &Spec,
    seed: u64,
    aff: Option<&Affinities>,
    a: &SynthArgs,
) -> std::io::Result<()> {
    let cols = *s.shape.last().unwrap_or(&1);
    let rows = s.shape.iter().product::<usize>() / cols.max(1);
    let size = s.dtype.size() as usize;
    let mut row = vec![0u8; cols * size];
    let mut vals = vec![0f32; cols];
    let mut rng = Rng(seed_of(seed, &s.name));
    if matches!(s.dtype, Dt::Fp4 | Dt::E8m0 | Dt::Ids(_)) {
        for _ in 0..rows {
            deepseek_v4::raw_row(s, &mut rng, &mut row);
            out.write_all(&row)?;
        }
        return Ok(());
    }
    for r in 0..rows {
        for chunk in vals.chunks_mut(4) {
            let bits = rng.next();
            for (k, v) in chunk.iter_mut().enumerate() {
                // 16 random bits -> uniform in [-bound, bound); bound 0 means a norm of ones.
                let u = unit(bits >> (16 * k));
                *v = match s.dtype {
                    Dt::Fp8 => u * 448.0,
                    Dt::Fp8Scale => s.bound * (1.0 + u / 4.0) / 448.0,
                    _ if s.bound == 0.0 => 1.0,
                    _ => u * s.bound,
                };
            }
        }
        let ctrl = CTRL.min(cols);
        match s.fill {
            Fill::Plain => {}
            Fill::NoCtrlIn => vals[..ctrl].fill(0.0),
            Fill::NoCtrlOut if r < CTRL => vals.fill(0.0),
            Fill::NoCtrlOut => {}
            Fill::Embed => {
                // The token's control vector: 1 on the bias coordinate, unit-variance
                // token coordinates.
                vals[0] = 1.0;
                for v in &mut vals[1..ctrl] {
                    *v *= 3f32.sqrt();
                }
            }
            Fill::Router(l) => {
                if let Some(aff) = aff {
                    vals[..ctrl].copy_from_slice(&aff.a[l][r][..ctrl]);
                    // The rest reads the context: unit variance per unit-variance input.
                    for v in &mut vals[ctrl..] {
                        *v *= a.route_context;
                    }
                }
            }
        }
        for (b, v) in row.chunks_exact_mut(size).zip(&vals) {
            match s.dtype {
                Dt::Bf16 => b.copy_from_slice(&bf16_bits(*v).to_le_bytes()),
                Dt::F32 | Dt::Fp8Scale => b.copy_from_slice(&v.to_le_bytes()),
                Dt::Fp8 => b[0] = e4m3_from_f32(*v),
                Dt::Fp4 | Dt::E8m0 | Dt::Ids(_) => {}
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
        || (a.shape == Shape::Olmoe && !a.hidden.is_multiple_of(a.heads))
        || (a.routing == Routing::Trained && a.hidden < 4 * CTRL)
    {
        anyhow::bail!("bad shape: need layers, experts, hidden, heads > 0, top_k <= experts, heads dividing hidden (and hidden >= 64 with --routing trained)");
    }
    if a.fp8 && a.fp8_block == 0 {
        anyhow::bail!("--fp8-block must be positive");
    }
    match a.shape {
        Shape::DeepseekV3 => deepseek::check(&a)?,
        Shape::DeepseekV4Flash => deepseek_v4::check(&a)?,
        Shape::Olmoe => {}
    }
    if a.out.join("config.json").exists() {
        anyhow::bail!("{}: already holds a model", a.out.display());
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("{}: cannot create", a.out.display()))?;
    if let Some(t) = &a.tokenizer {
        copy_tokenizer(t, &a)?;
    }
    let all = specs(&a);
    let aff = (a.routing == Routing::Trained).then(|| Affinities::new(&a));
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
                json!({"dtype": s.dtype.name(), "shape": s.shape, "data_offsets": [off, off + s.bytes()]}),
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
                write_tensor(w, s, a.seed, aff.as_ref(), &a)?;
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
