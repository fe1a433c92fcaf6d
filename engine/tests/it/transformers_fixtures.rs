//! The native CPU path against Hugging Face transformers, on the tiny random checkpoints
//! in tests/fixtures (made by tools/make_fixtures.py; see tests/fixtures/README.md).
//! Checks: max |logit difference| / std(logits) <= 1e-3, argmax agreement wherever the
//! reference's top-2 gap exceeds 1e-3, the greedy continuation token for token through
//! the KV cache, and prefill == token-by-token decode bit for bit.

use std::path::PathBuf;

use colibri_engine::generate::{generate, GenerateOptions};
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::{Logits, Model};
use serde_json::Value;

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn check(name: &str) {
    let dir = fixture_dir(name);
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let model = Model::open_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = model.cfg.vocab;
    assert_eq!(vocab as u64, reference["vocab_size"].as_u64().unwrap());

    // Teacher-forced logits, all positions in one prefill.
    let tf_ids = ids(&reference["ids"]);
    let want: Vec<f32> = std::fs::read(dir.join(reference["logits_file"].as_str().unwrap()))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(want.len(), tf_ids.len() * vocab);
    let mut session = model.new_session();
    let got = model.forward(&mut session, &tf_ids, Logits::All).unwrap();
    let mean = want.iter().map(|v| *v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let (mut worst, mut at) = (0.0f64, 0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = (*g as f64 - *w as f64).abs();
        if d > worst {
            worst = d;
            at = i;
        }
    }
    let rel = worst / std;
    eprintln!("{name}: max |diff| {worst:.3e} at [{}, {}] = {rel:.3e} of std {std:.3}", at / vocab, at % vocab);
    assert!(
        rel <= 1e-3,
        "{name}: max |diff| / std = {rel:.3e} > 1e-3 (at position {}, token {})",
        at / vocab,
        at % vocab
    );

    let mut checked = 0;
    for p in 0..tf_ids.len() {
        let w = &want[p * vocab..(p + 1) * vocab];
        let g = &got[p * vocab..(p + 1) * vocab];
        let mut sorted = w.to_vec();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        if sorted[0] - sorted[1] > 1e-3 {
            checked += 1;
            assert_eq!(
                colibri_engine::math::argmax(g),
                colibri_engine::math::argmax(w),
                "{name}: argmax differs at position {p}"
            );
        }
    }
    assert!(checked > tf_ids.len() / 2, "{name}: too few positions with a clear argmax ({checked})");

    // Token-by-token decode through the KV cache gives the same bits as the prefill.
    let mut s2 = model.new_session();
    for (p, &id) in tf_ids.iter().enumerate() {
        let step = model.forward(&mut s2, &[id], Logits::Last).unwrap();
        assert!(
            step.iter().zip(&got[p * vocab..(p + 1) * vocab]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: incremental logits differ from prefill at position {p}"
        );
    }

    // A rollback to a prefix (a chat turn that shares it) and a prefill of the rest give
    // the same bits again: the cache keeps exactly the prefix's entries.
    let half = tf_ids.len() / 2;
    s2.truncate(half);
    let rest = model.forward(&mut s2, &tf_ids[half..], Logits::All).unwrap();
    assert!(
        rest.iter().zip(&got[half * vocab..]).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{name}: logits after a rollback to position {half} differ from the prefill"
    );

    // Greedy continuation, token for token.
    let prompt = ids(&reference["greedy"]["prompt_ids"]);
    let want_new = ids(&reference["greedy"]["new_ids"]);
    let opts = GenerateOptions {
        max_new_tokens: want_new.len(),
        sampler: SamplerConfig::default(),
        stop_ids: vec![],
        logprobs: None,
    };
    let mut s3 = model.new_session();
    let (new, _) = generate(&model, &mut s3, &prompt, &opts, &mut |_| true).unwrap();
    assert_eq!(new, want_new, "{name}: greedy continuation differs");

    // transformers' logits of each greedy step through its own cache (qwen3_next: the
    // chunked delta rule in the prefill, the recurrent one per step), against the
    // prompt's prefill and then one decode step per token.
    if let Some(file) = reference["greedy"]["logits_file"].as_str() {
        let want = read_f32(&dir.join(file));
        assert_eq!(want.len(), want_new.len() * vocab);
        let mut s4 = model.new_session();
        let mut got = model.forward(&mut s4, &prompt, Logits::Last).unwrap();
        let mut worst = 0.0f64;
        for (i, row) in want.chunks_exact(vocab).enumerate() {
            worst = worst.max(max_rel(&got, row));
            got = model.forward(&mut s4, &want_new[i..i + 1], Logits::Last).unwrap();
        }
        eprintln!("{name}: decode steps max |diff| / std {worst:.3e}");
        assert!(worst <= 1e-3, "{name}: decode-step logits: max |diff| / std = {worst:.3e} > 1e-3");
    }
}

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// max |got - want| / std(want).
fn max_rel(got: &[f32], want: &[f32]) -> f64 {
    let mean = want.iter().map(|v| *v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).abs()).fold(0.0, f64::max) / std
}

#[test]
fn mixtral_matches_transformers() {
    check("mixtral");
}

#[test]
fn qwen2_moe_matches_transformers() {
    check("qwen2_moe");
}

#[test]
fn qwen3_moe_matches_transformers() {
    check("qwen3_moe");
}

#[test]
fn olmoe_matches_transformers() {
    check("olmoe");
}

#[test]
fn deepseek_v3_matches_transformers() {
    check("deepseek_v3");
}

#[test]
fn deepseek_v32_sparse_attention_matches_transformers() {
    check("deepseek_v32");
}

#[test]
fn glm_moe_dsa_sparse_attention_matches_transformers() {
    check("glm_moe_dsa");
}

#[test]
fn glm4_moe_matches_transformers() {
    check("glm4_moe");
}

#[test]
fn deepseek_v3_without_q_lora_matches_transformers() {
    check("deepseek_v3_noqlora");
}

#[test]
fn gpt_oss_matches_transformers() {
    check("gpt_oss");
}

/// The released layout: experts as MXFP4 blocks + e8m0 scales, computed in that format
/// (qdot::mxfp4, int16 activations); transformers dequantizes them on load.
#[test]
fn gpt_oss_mxfp4_matches_transformers() {
    check("gpt_oss_mxfp4");
}

/// qwen3_next: Gated DeltaNet layers around a gated full-attention layer, zero-centred
/// norms, partial rotary, a shared expert with its gate; bf16 in 4 shards.
#[test]
fn qwen3_next_matches_transformers() {
    check("qwen3_next");
}

/// qwen3_next with full attention first, attention biases, one value head per key head,
/// a 2-tap conv, no top-k renormalisation, tied embeddings; f32.
#[test]
fn qwen3_next_f32_matches_transformers() {
    check("qwen3_next_f32");
}

/// qwen3_5_moe as published: the image-text checkpoint (text tower under
/// `model.language_model.`, a vision tower the engine leaves out, `text_config`), separate
/// DeltaNet input projections, every layer MoE with fused expert tensors, M-RoPE sections on
/// the partial rotary dims; 80 ids (transformers' chunked delta rule runs two chunks); bf16
/// in 4 shards.
#[test]
fn qwen3_5_moe_matches_transformers() {
    check("qwen3_5_moe");
}

/// A block-scaled FP8 deepseek_v3 checkpoint read as it is (tools/fixtures_fp8.py): e4m3
/// linear weights with `weight_scale_inv` in blocks of [16, 32] on dims that are not
/// multiples of them, against transformers on exactly the dequantized weights.
/// DeepSeek-V4: hyper-connection streams, sliding / CSA / HCA attention with sinks, the
/// indexer's top-k, hash-routed and sqrtsoftplus-routed experts (tools/fixtures_v4.py).
#[test]
fn deepseek_v4_matches_transformers() {
    check("deepseek_v4");
}

#[test]
fn deepseek_v3_fp8_matches_transformers() {
    check("deepseek_v3_fp8");
    // Every FP8 weight is read as FP8 rows (1 byte per weight plus its block scales), the
    // routed experts too.
    let model = Model::open_dir(&fixture_dir("deepseek_v3_fp8")).unwrap();
    let fp8 = colibri_engine::tensor::DType::Fp8 { block: 32 };
    let colibri_engine::model::Ffn::Dense(mlp) = &model.layers[0].ffn else { panic!("layer 0 is dense") };
    assert_eq!((mlp.gate.dtype, mlp.gate.rows, mlp.gate.cols), (fp8, 36, 40));
    let x = model.experts.expert(1, 3).unwrap();
    assert_eq!((x.gate.dtype, x.down.dtype, x.down.byte_len()), (fp8, fp8, 40 * (4 + 20)));
    assert_eq!(model.embed.dtype, colibri_engine::tensor::DType::BF16);
}

/// DeepSeek-V4 as the release is published (tools/fixtures_v4_fp8.py): its own tensor
/// names, FP8 e4m3 dense weights with `.scale` ue8m0 block scales, FP4 routed experts
/// (e2m1 pairs as I8 + one ue8m0 scale per 32), against transformers on exactly the
/// dequantized weights. The experts are MXFP4 rows and the dense weights FP8 rows, read as
/// stored: nothing is widened.
#[test]
fn deepseek_v4_fp8_matches_transformers() {
    check("deepseek_v4_fp8");
    let model = Model::open_dir(&fixture_dir("deepseek_v4_fp8")).unwrap();
    use colibri_engine::tensor::DType;
    let fp8 = DType::Fp8 { block: 32 };
    let x = model.experts.expert(2, 5).unwrap();
    assert_eq!((x.gate.dtype, x.up.dtype, x.down.dtype), (DType::Mxfp4, DType::Mxfp4, DType::Mxfp4));
    assert_eq!((x.gate.rows, x.gate.cols, x.down.rows, x.down.cols), (32, 64, 64, 32));
    assert_eq!(x.gate.byte_len(), 32 * (4 + 32), "1 byte per 2 weights plus a scale per 32");
    assert_eq!(x.down.byte_len(), 64 * (4 + 16));
    let w = model.v4.as_ref().unwrap();
    let l = &w.layers[1];
    assert_eq!((l.attn.q_a.dtype, l.attn.kv.dtype, l.attn.o_b.dtype, l.shared.down.dtype), (fp8, fp8, fp8, fp8));
    assert_eq!(l.attn.o_a[1].dtype, fp8);
    assert_eq!(l.attn.indexer.as_ref().unwrap().q_b.dtype, fp8);
    assert_eq!(model.embed.dtype, DType::BF16);
}

/// GLM-5's FP8 release layout (tools/fixtures_fp8_dsa.py): DSA past index_topk with FP8
/// MLA, indexer (`wq_b`, `wk`), dense MLP and experts; the indexer's `weights_proj` and
/// the router in bf16, as transformers' FP8 integration loads them.
#[test]
fn glm_moe_dsa_fp8_matches_transformers() {
    check("glm_moe_dsa_fp8");
    let model = Model::open_dir(&fixture_dir("glm_moe_dsa_fp8")).unwrap();
    let fp8 = colibri_engine::tensor::DType::Fp8 { block: 32 };
    let colibri_engine::model::AttnWeights::Mla(mla) = &model.layers[2].attn else { panic!("layer 2 is MLA") };
    let ix = mla.indexer.as_ref().expect("layer 2 runs its indexer");
    assert_eq!((ix.wq_b.dtype, ix.wk.dtype), (fp8, fp8));
    assert_eq!(ix.weights_proj.dtype, colibri_engine::tensor::DType::BF16);
    assert_eq!(mla.kv_b.dtype, fp8);
    let x = model.experts.expert(1, 5).unwrap();
    // [64, 16] in blocks of 32 columns: one scale and 16 bytes per row.
    assert_eq!((x.gate.dtype, x.down.dtype, x.down.byte_len()), (fp8, fp8, 64 * (4 + 16)));
}
