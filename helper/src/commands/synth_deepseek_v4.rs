//! `coli synth --shape deepseek-v4-flash`: a DeepSeek-V4-Flash-shaped checkpoint in the
//! release's layout (docs/format.md, "The DeepSeek-V4 release layout"): DeepSeek's own
//! tensor names without `model.`, the dense linear weights as `F8_E4M3` with an `F8_E8M0`
//! `X.scale` per 128 x 128 block, the routed experts as packed FP4 (`I8` `[rows, cols / 2]`,
//! random e2m1 nibbles) with an `F8_E8M0` scale per 32 values of a row, the compressors' and
//! indexer's `wkv` / `wgate` / `weights_proj`, the router, embedding and head in BF16, the
//! norms, sinks, `ape`, `gate.bias` and hyper-connection tensors in F32 and `tid2eid` as I64.
//!
//! The sizes are V4-Flash's (tests/hub-configs/deepseek-v4-flash-base: hidden 4096, 64
//! query heads of 512, q-LoRA 1024, `o_groups` 8 of rank 1024, an indexer of 64 heads of 128
//! keeping 512, window 128, compression 4 and 128, `hc_mult` 4, experts of 2048, top-6,
//! vocabulary 129280) but for `--layers` and `--experts` (V4-Flash: 43 and 256). The layers
//! are sliding, then CSA and HCA in turn (V4-Flash has all three kinds of attention only
//! over its full depth), the first three (at most all but one) hash-routed as V4-Flash's.

use anyhow::Result;
use serde_json::{json, Value};

use super::{Dt, Fill, Rng, Spec, SynthArgs};

const HIDDEN: usize = 4096;
const HEADS: usize = 64;
const HEAD_DIM: usize = 512;
const Q_LORA: usize = 1024;
const O_GROUPS: usize = 8;
const O_LORA: usize = 1024;
const INDEX_HEADS: usize = 64;
const INDEX_DIM: usize = 128;
const INTERMEDIATE: usize = 2048;
const TOP_K: usize = 6;
const VOCAB: usize = 129280;
const HC: usize = 4;
const CSA_RATE: usize = 4;
const HCA_RATE: usize = 128;
/// The FP8 block (the release's 128 x 128).
const BLOCK: usize = 128;

/// `layer_types` of `n` layers: sliding first, then CSA and HCA in turn.
fn layer_types(n: usize) -> Vec<&'static str> {
    (0..n)
        .map(|l| match l {
            0 => "sliding_attention",
            l if l % 2 == 1 => "compressed_sparse_attention",
            _ => "heavily_compressed_attention",
        })
        .collect()
}

/// Hash-routed layers: V4-Flash's first three, leaving at least one learned router.
fn hash_layers(n: usize) -> usize {
    3.min(n.saturating_sub(1))
}

pub(super) fn check(a: &SynthArgs) -> Result<()> {
    if a.routing != super::Routing::Random || a.fp8 {
        anyhow::bail!("--shape deepseek-v4-flash is the release's layout (FP8 dense, FP4 experts) with random routers: no --routing trained or --fp8");
    }
    if a.experts < TOP_K {
        anyhow::bail!("--shape deepseek-v4-flash routes to the top {TOP_K}: --experts must be at least {TOP_K}");
    }
    Ok(())
}

pub(super) fn specs(a: &SynthArgs) -> Vec<Spec> {
    let (h, ne) = (HIDDEN, a.experts);
    let spec =
        |name: String, shape: Vec<usize>, bound: f32, dtype: Dt| Spec { name, shape, bound, fill: Fill::Plain, dtype };
    let bf16 =
        |name: String, rows: usize, cols: usize| spec(name, vec![rows, cols], (3.0 / cols as f32).sqrt(), Dt::Bf16);
    let ones = |name: String, n: usize| spec(name, vec![n], 0.0, Dt::F32);
    let f32s = |name: String, shape: Vec<usize>, bound: f32| spec(name, shape, bound, Dt::F32);
    // An FP8 weight (values u * 448) and its ue8m0 scale per block: bound / 448.
    let fp8 = |out: &mut Vec<Spec>, name: &str, rows: usize, cols: usize| {
        let bound = (3.0 / cols as f32).sqrt();
        out.push(spec(format!("{name}.weight"), vec![rows, cols], bound, Dt::Fp8));
        let scale = vec![rows.div_ceil(BLOCK), cols.div_ceil(BLOCK)];
        out.push(spec(format!("{name}.scale"), scale, bound / 448.0, Dt::E8m0));
    };
    // An FP4 expert weight: random e2m1 codes (rms 2.93), one ue8m0 scale per 32 values
    // giving the weights a uniform ±sqrt(3 / cols)'s rms.
    let fp4 = |out: &mut Vec<Spec>, name: &str, rows: usize, cols: usize| {
        let bound = (3.0 / cols as f32).sqrt();
        out.push(spec(format!("{name}.weight"), vec![rows, cols / 2], bound, Dt::Fp4));
        out.push(spec(format!("{name}.scale"), vec![rows, cols / 32], bound / (3f32.sqrt() * 2.93), Dt::E8m0));
    };
    let hyper = |out: &mut Vec<Spec>, p: &str| {
        let m = (2 + HC) * HC;
        out.push(f32s(format!("{p}_fn"), vec![m, HC * h], (3.0 / (HC * h) as f32).sqrt()));
        out.push(f32s(format!("{p}_base"), vec![m], 0.5));
        out.push(ones(format!("{p}_scale"), 3));
    };
    let compressor = |out: &mut Vec<Spec>, p: &str, dim: usize, rate: usize, width: usize| {
        out.push(bf16(format!("{p}.wkv.weight"), width, h));
        out.push(bf16(format!("{p}.wgate.weight"), width, h));
        out.push(f32s(format!("{p}.ape"), vec![rate, width], 0.1));
        out.push(ones(format!("{p}.norm.weight"), dim));
    };
    let mut out = vec![spec("embed.weight".into(), vec![VOCAB, h], 1.0, Dt::Bf16)];
    for (l, kind) in layer_types(a.layers).into_iter().enumerate() {
        let p = format!("layers.{l}");
        out.push(ones(format!("{p}.attn_norm.weight"), h));
        let at = format!("{p}.attn");
        fp8(&mut out, &format!("{at}.wq_a"), Q_LORA, h);
        out.push(ones(format!("{at}.q_norm.weight"), Q_LORA));
        fp8(&mut out, &format!("{at}.wq_b"), HEADS * HEAD_DIM, Q_LORA);
        fp8(&mut out, &format!("{at}.wkv"), HEAD_DIM, h);
        out.push(ones(format!("{at}.norm.weight"), HEAD_DIM));
        fp8(&mut out, &format!("{at}.wo_a"), O_GROUPS * O_LORA, HEADS * HEAD_DIM / O_GROUPS);
        fp8(&mut out, &format!("{at}.wo_b"), h, O_GROUPS * O_LORA);
        out.push(f32s(format!("{at}.attn_sink"), vec![HEADS], 0.5));
        match kind {
            "compressed_sparse_attention" => {
                compressor(&mut out, &format!("{at}.compressor"), HEAD_DIM, CSA_RATE, 2 * HEAD_DIM);
                compressor(&mut out, &format!("{at}.indexer.compressor"), INDEX_DIM, CSA_RATE, 2 * INDEX_DIM);
                fp8(&mut out, &format!("{at}.indexer.wq_b"), INDEX_HEADS * INDEX_DIM, Q_LORA);
                out.push(bf16(format!("{at}.indexer.weights_proj.weight"), INDEX_HEADS, h));
            }
            "heavily_compressed_attention" => {
                compressor(&mut out, &format!("{at}.compressor"), HEAD_DIM, HCA_RATE, HEAD_DIM)
            }
            _ => {}
        }
        out.push(ones(format!("{p}.ffn_norm.weight"), h));
        hyper(&mut out, &format!("{p}.hc_attn"));
        hyper(&mut out, &format!("{p}.hc_ffn"));
        out.push(bf16(format!("{p}.ffn.gate.weight"), ne, h));
        if l < hash_layers(a.layers) {
            out.push(spec(format!("{p}.ffn.gate.tid2eid"), vec![VOCAB, TOP_K], 0.0, Dt::Ids(ne)));
        } else {
            out.push(f32s(format!("{p}.ffn.gate.bias"), vec![ne], 0.05));
        }
        fp8(&mut out, &format!("{p}.ffn.shared_experts.w1"), INTERMEDIATE, h);
        fp8(&mut out, &format!("{p}.ffn.shared_experts.w3"), INTERMEDIATE, h);
        fp8(&mut out, &format!("{p}.ffn.shared_experts.w2"), h, INTERMEDIATE);
        for e in 0..ne {
            fp4(&mut out, &format!("{p}.ffn.experts.{e}.w1"), INTERMEDIATE, h);
            fp4(&mut out, &format!("{p}.ffn.experts.{e}.w3"), INTERMEDIATE, h);
            fp4(&mut out, &format!("{p}.ffn.experts.{e}.w2"), h, INTERMEDIATE);
        }
    }
    out.push(ones("norm.weight".into(), h));
    out.push(bf16("head.weight".into(), VOCAB, h));
    hyper_head(&mut out, h);
    out
}

fn hyper_head(out: &mut Vec<Spec>, h: usize) {
    let f32s = |name: &str, shape: Vec<usize>, bound: f32| Spec {
        name: name.into(),
        shape,
        bound,
        fill: Fill::Plain,
        dtype: Dt::F32,
    };
    out.push(f32s("hc_head_fn", vec![HC, HC * h], (3.0 / (HC * h) as f32).sqrt()));
    out.push(f32s("hc_head_base", vec![HC], 0.5));
    out.push(Spec { bound: 0.0, ..f32s("hc_head_scale", vec![1], 0.0) });
}

/// The bytes of one row of `s` (a type [`super::write_tensor`] does not make from floats):
/// FP4 codes, ue8m0 scales, or distinct expert ids.
pub(super) fn raw_row(s: &Spec, rng: &mut Rng, row: &mut [u8]) {
    match s.dtype {
        Dt::Fp4 => {
            for chunk in row.chunks_mut(8) {
                let bits = rng.next().to_le_bytes();
                chunk.copy_from_slice(&bits[..chunk.len()]);
            }
        }
        Dt::E8m0 => {
            // The power of two nearest `bound` (a spec's bound is the scale itself here).
            let e = (s.bound.max(f32::MIN_POSITIVE).log2().round() as i32 + 127).clamp(1, 254) as u8;
            row.fill(e);
        }
        Dt::Ids(n) => {
            // top_k distinct experts: consecutive from a random first one.
            let first = (rng.next() % n as u64) as usize;
            for (j, b) in row.chunks_exact_mut(8).enumerate() {
                b.copy_from_slice(&(((first + j) % n) as i64).to_le_bytes());
            }
        }
        _ => {}
    }
}

/// RMS of a uniformly random e2m1 code (for the scale above): sqrt(mean of squares) of
/// e2m1's values by code (the high bit is the sign).
#[cfg(test)]
fn e2m1_rms() -> f32 {
    let e2m1 = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    (e2m1.iter().map(|v| v * v).sum::<f32>() / 8.0).sqrt()
}

pub(super) fn config(a: &SynthArgs) -> Value {
    let n = a.layers;
    let mlp: Vec<&str> = (0..n).map(|l| if l < hash_layers(n) { "hash_moe" } else { "moe" }).collect();
    let mut c = json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "moe_intermediate_size": INTERMEDIATE,
        "num_hidden_layers": n,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "q_lora_rank": Q_LORA,
        "num_experts_per_tok": TOP_K,
        "n_routed_experts": a.experts,
        "n_shared_experts": 1,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": true,
        "routed_scaling_factor": 1.5,
        // 64k positions (V4-Flash: 1M) keep the rope tables small; 32k contexts fit.
        "max_position_embeddings": 65536,
        "rope_theta": 10000.0,
        "layer_types": layer_types(n),
        "mlp_layer_types": mlp,
        "compress_rates": {"compressed_sparse_attention": CSA_RATE, "heavily_compressed_attention": HCA_RATE},
        "compress_rope_theta": 160000.0,
        "hc_mult": HC,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "swiglu_limit": 10.0,
        "sliding_window": 128,
        "o_groups": O_GROUPS,
        "o_lora_rank": O_LORA,
        "index_n_heads": INDEX_HEADS,
        "index_head_dim": INDEX_DIM,
        "index_topk": 512,
        "num_nextn_predict_layers": 0,
    });
    let rest = json!({
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": false,
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
            "compress": {"rope_type": "default", "rope_theta": 160000.0, "partial_rotary_factor": 0.125}
        },
        "partial_rotary_factor": 0.125,
        "qk_rope_head_dim": 64,
        "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
            "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]},
        "dtype": "bfloat16",
        "colibri_synthetic": {"seed": a.seed, "generator": "coli synth", "shape": "deepseek-v4-flash",
            "routing": "random"},
    });
    if let (Some(c), Value::Object(r)) = (c.as_object_mut(), rest) {
        c.extend(r);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes are V4-Flash's as tests/hub-configs has them.
    #[test]
    fn the_sizes_are_v4_flash() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/hub-configs/deepseek-v4-flash-base/config.json");
        let hub: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SynthArgs,
        }
        let argv = ["synth", "-o", "/x", "--shape", "deepseek-v4-flash", "--layers", "3", "--experts", "256"];
        let a = <Cli as clap::Parser>::parse_from(argv).args;
        let c = config(&a);
        for k in [
            "vocab_size",
            "hidden_size",
            "moe_intermediate_size",
            "num_attention_heads",
            "head_dim",
            "q_lora_rank",
            "num_experts_per_tok",
            "n_routed_experts",
            "compress_rates",
            "hc_mult",
            "sliding_window",
            "o_groups",
            "o_lora_rank",
            "index_n_heads",
            "index_head_dim",
            "index_topk",
            "swiglu_limit",
            "compress_rope_theta",
            "partial_rotary_factor",
            "scoring_func",
        ] {
            assert_eq!(c[k], hub[k], "{k}");
        }
        assert_eq!(
            c["layer_types"],
            json!(["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"])
        );
        assert_eq!(c["mlp_layer_types"], json!(["hash_moe", "hash_moe", "moe"]));
        let cfg = colibri_engine::ModelConfig::from_value(&c).unwrap();
        assert_eq!(cfg.v4.as_ref().unwrap().hc_mult, 4);
        assert!((e2m1_rms() - 2.93).abs() < 0.01);
    }
}
