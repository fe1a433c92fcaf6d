//! The GPU backend against the CPU backend on every transformers fixture: identical
//! greedy tokens (a hard requirement), GPU prefill == GPU token-by-token decode bit for
//! bit, the router lookahead changes nothing but is measured, and a printed ULP report of the teacher-forced logits (run with --nocapture to
//! see it; docs/benchmarks.md records the numbers).
#![cfg(feature = "wgpu")]

use std::path::PathBuf;

use crate::gpu_common::{assert_bits, gpu, ulp_stats};
use colibri_engine::generate::{generate, generate_with, Context, GenerateOptions};
use colibri_engine::gpu::{GpuModel, GpuOptions, GpuSession};
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::{Logits, Model, Session};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn check(name: &str, pool_bytes: Option<u64>, lookahead: usize) {
    let Some(ctx) = gpu() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let model = Model::open_dir(&dir).unwrap();
    let gm = GpuModel::new(&model, ctx, GpuOptions { expert_pool_bytes: pool_bytes, lookahead, ..Default::default() })
        .unwrap();
    let vocab = model.cfg.vocab;

    // Teacher-forced logits of every position in one prefill: GPU vs CPU.
    let tf = ids(&reference["ids"]);
    let cpu = model.forward(&mut model.new_session(), &tf, Logits::All).unwrap();
    let got = gm.forward_blocking(&mut gm.new_session(), &tf, Logits::All).unwrap();
    let (max, mean, differ) = ulp_stats(&got, &cpu);
    eprintln!(
        "ULP {name}: logits of {} positions x {vocab}: max {max} ulp, mean {mean:.4} ulp, {differ} of {} differ (pool {:?})",
        tf.len(),
        got.len(),
        gm.pool_stats()
    );
    for p in 0..tf.len() {
        let (g, c) = (&got[p * vocab..(p + 1) * vocab], &cpu[p * vocab..(p + 1) * vocab]);
        assert_eq!(
            colibri_engine::math::argmax(g),
            colibri_engine::math::argmax(c),
            "{name}: argmax differs at position {p}"
        );
    }
    // The kernels reproduce the CPU's arithmetic: on lavapipe every bit. Another driver
    // may reassociate (WGSL allows it); there the distance is reported and bounded.
    let bound = if gm.ctx.adapter_name.contains("llvmpipe") { 0 } else { 64 };
    assert!(max <= bound, "{name}: GPU logits are {max} ulp from the CPU's on {}", gm.ctx.adapter_name);

    // Token-by-token decode through the GPU KV cache equals the GPU prefill.
    let mut s = gm.new_session();
    for (p, &id) in tf.iter().enumerate().take(12) {
        let step = gm.forward_blocking(&mut s, &[id], Logits::Last).unwrap();
        assert_bits(&format!("{name}: decode step {p} vs prefill"), &step, &got[p * vocab..(p + 1) * vocab]);
    }

    // Greedy continuation: the same tokens as the CPU path and the reference.
    let prompt = ids(&reference["greedy"]["prompt_ids"]);
    let want = ids(&reference["greedy"]["new_ids"]);
    let opts = GenerateOptions {
        max_new_tokens: want.len(),
        sampler: SamplerConfig::default(),
        stop_ids: vec![],
        logprobs: None,
    };
    let (cpu_new, _) = generate(&model, &mut model.new_session(), &prompt, &opts, &mut |_| true).unwrap();
    let mut gs = gm.new_session();
    let (gpu_new, _) = generate_with(
        &mut |ids| gm.forward_blocking(&mut gs, ids, Logits::Last),
        &[],
        &prompt,
        model.cfg.max_positions,
        &opts,
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(gpu_new, cpu_new, "{name}: GPU greedy tokens differ from the CPU's");
    assert_eq!(gpu_new, want, "{name}: greedy continuation differs from transformers");

    // The router lookahead only moves fetches earlier; when on, its guesses are counted.
    let st = gm.lookahead_stats();
    if lookahead > 0 {
        eprintln!("lookahead {name} (top {lookahead}): {st:?}, recall {:?}", st.recall());
        assert!(st.routed > 0 && st.predicted > 0, "{name}: the lookahead never predicted: {st:?}");
        assert!(st.predicted_hits <= st.routed);
    } else {
        assert_eq!(st, Default::default());
    }
}

#[test]
fn mixtral_gpu_matches_cpu() {
    check("mixtral", None, 0);
}

#[test]
fn qwen2_moe_gpu_matches_cpu() {
    check("qwen2_moe", None, 0);
}

#[test]
fn qwen3_moe_gpu_matches_cpu() {
    check("qwen3_moe", None, 2);
}

#[test]
fn olmoe_gpu_matches_cpu() {
    check("olmoe", None, 0);
}

/// Partial RoPE, qkv bias, per-head q/k norm, the sigmoid router with its correction bias
/// and routed scaling, an ungated shared expert, a dense first layer.
#[test]
fn glm4_moe_gpu_matches_cpu() {
    check("glm4_moe", None, 2);
}

/// Attention sinks, sliding windows on alternate layers (the fixture's window of 7 is
/// shorter than its prompts), YaRN, o_proj and router biases, the top-k-then-softmax
/// router, clamped SwiGLU experts with biases; bf16 experts here, MXFP4 below.
#[test]
fn gpt_oss_gpu_matches_cpu() {
    check("gpt_oss", None, 2);
}

/// gpt_oss with its experts in MXFP4 as released (mxfp4_matmul.wgsl).
#[test]
fn gpt_oss_mxfp4_gpu_matches_cpu() {
    check("gpt_oss_mxfp4", None, 0);
}

/// MLA with the compressed cache (latent + rotary key), q LoRA, interleaved rotary pairs,
/// YaRN with mscale; the sigmoid router with group-limited top-k (4 groups, 2 kept) and
/// routed scaling; two ungated shared experts; a dense first layer.
#[test]
fn deepseek_v3_gpu_matches_cpu() {
    check("deepseek_v3", None, 2);
}

/// DeepSeek Sparse Attention (deepseek_v32): the indexer's key in the MLA cache row
/// (layernorm.wgsl, rope.wgsl on its slice), its scores (index_scores.wgsl) read back for
/// the top-6 choice, attention.wgsl over the kept positions; 48 positions, most of them
/// past index_topk.
#[test]
fn deepseek_v32_sparse_attention_gpu_matches_cpu() {
    check("deepseek_v32", None, 0);
}

/// glm_moe_dsa: the indexer's rope slice as interleaved pairs (rope_pairs.wgsl), and a
/// "shared" layer attending to the previous layer's selection.
#[test]
fn glm_moe_dsa_sparse_attention_gpu_matches_cpu() {
    check("glm_moe_dsa", None, 0);
}

/// MLA with a plain q_proj.
#[test]
fn deepseek_v3_noqlora_gpu_matches_cpu() {
    check("deepseek_v3_noqlora", None, 0);
}

#[test]
fn tiny_expert_pool_evicts_and_stays_exact() {
    // A pool that holds about two experts: constant eviction, same answer.
    check("olmoe", Some(2 * 3 * 40 * 72 * 2 + 1), 4);
}

/// Gated DeltaNet layers (causal conv, q/k L2 norm, the gated delta rule, gated RMSNorm)
/// between gated full-attention layers (output gate, partial RoPE, per-head q/k norm of
/// zero-centred weights), a dense layer, the softmax router and a gated shared expert;
/// bf16 in four shards.
#[test]
fn qwen3_next_gpu_matches_cpu() {
    check("qwen3_next", None, 2);
}

/// qwen3_next in f32.
#[test]
fn qwen3_next_f32_gpu_matches_cpu() {
    check("qwen3_next_f32", None, 0);
}

/// qwen3_5_moe (the published image-text layout): separate DeltaNet input projections,
/// taken as stored by the GPU's three matmuls; fused experts; bf16 in four shards.
#[test]
fn qwen3_5_moe_gpu_matches_cpu() {
    check("qwen3_5_moe", None, 2);
}

/// Block-scaled FP8 (e4m3 with f32 scales in blocks of [16, 32]): MLA, the dense layer,
/// shared and routed experts all read FP8 rows through weights.wgsl's decoder (one MoE
/// layer: nothing for the router lookahead to predict).
#[test]
fn deepseek_v3_fp8_gpu_matches_cpu() {
    check("deepseek_v3_fp8", None, 0);
}

/// FP8 and DSA together (GLM-5-FP8's layout): the indexer's FP8 projections on the GPU.
#[test]
fn glm_moe_dsa_fp8_gpu_matches_cpu() {
    check("glm_moe_dsa_fp8", None, 0);
}

/// The recurrent state on the GPU follows the CPU's through a multi-token call (which
/// snapshots), a decode step, truncations that rewind to the snapshot and to the start,
/// and the refeed that follows: every returned logit the CPU's bits.
#[test]
fn qwen3_next_gpu_state_rewinds_like_the_cpu() {
    let Some(ctx) = gpu() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_next");
    let model = Model::open_dir(&dir).unwrap();
    let gm = GpuModel::new(&model, ctx, GpuOptions::default()).unwrap();
    let ids: Vec<u32> = (0..44u32).map(|i| (i * 37 + 5) % model.cfg.vocab as u32).collect();
    let (mut cs, mut gs) = (model.new_session(), gm.new_session());
    let step = |cs: &mut Session, gs: &mut GpuSession, what: &str, keep: Option<usize>, feed: &[u32], which: Logits| {
        if let Some(k) = keep {
            // What the sessions say they can keep is where the truncation lands.
            let (ck, gk) = (Context::keepable(&*cs, k), Context::keepable(&*gs, k));
            cs.truncate(k);
            gs.truncate(k);
            assert_eq!((ck, gk), (cs.cached_len(), gs.cached_len()), "{what}: keepable({k})");
            assert_eq!(gs.cached_len(), cs.cached_len(), "{what}: positions held after truncate({k})");
            assert_eq!(gs.tokens, cs.tokens, "{what}");
        }
        let want = model.forward(cs, feed, which).unwrap();
        let got = gm.forward_blocking(gs, feed, which).unwrap();
        assert_bits(what, &got, &want);
        assert_eq!(gs.tokens, cs.tokens, "{what}");
        assert_eq!(gs.snapshot_bytes(), cs.snapshot_bytes(), "{what}");
    };
    step(&mut cs, &mut gs, "prompt", None, &ids[..8], Logits::Last);
    step(&mut cs, &mut gs, "a second multi-token call (snapshot at 8)", None, &ids[8..12], Logits::All);
    step(&mut cs, &mut gs, "a decode step", None, &ids[12..13], Logits::Last);
    // Back to 10: the state rewinds to its snapshot at 8 and refeeds 2 tokens.
    step(&mut cs, &mut gs, "after truncate(10)", Some(10), &ids[13..16], Logits::All);
    step(&mut cs, &mut gs, "a decode step after the refeed", None, &ids[16..17], Logits::Last);
    // Back to 5: no snapshot that early, so from the start.
    step(&mut cs, &mut gs, "after truncate(5)", Some(5), &ids[17..20], Logits::Last);
    assert_eq!(gs.cached_len(), 8);
    assert!(gs.bytes() > 4 * 8, "the recurrent state counts in the session's bytes");
    // The snapshot at 8 pinned: three more multi-token calls (three more snapshots) leave
    // it, and a truncation before them goes back there.
    cs.pin_snapshot(8);
    gs.pin_snapshot(8);
    step(&mut cs, &mut gs, "pinned at 8", None, &ids[20..23], Logits::Last);
    step(&mut cs, &mut gs, "a multi-token call (snapshot at 11)", None, &ids[23..26], Logits::Last);
    step(&mut cs, &mut gs, "another (snapshot at 14)", None, &ids[26..29], Logits::Last);
    step(&mut cs, &mut gs, "another (snapshot at 17)", None, &ids[29..32], Logits::Last);
    assert_eq!(Context::keepable(&gs, 12), 8);
    assert_eq!(cs.snapshot_bytes(), 3 * model.cfg.recurrent_state_bytes(), "the pinned one and two more");
    step(&mut cs, &mut gs, "after truncate(12): back to the pinned 8", Some(12), &ids[32..36], Logits::Last);
    assert_eq!(gs.cached_len(), 16);
    // A pass that verifies drafts (every position's logits) snapshots its start apart:
    // its rollback goes there, and the kept ones stay.
    step(&mut cs, &mut gs, "a verify pass (transient at 16)", None, &ids[36..40], Logits::All);
    step(&mut cs, &mut gs, "another (transient at 20)", None, &ids[40..42], Logits::All);
    assert_eq!(cs.snapshot_bytes(), 3 * model.cfg.recurrent_state_bytes(), "8, 16 (the prompt's end), 20");
    step(&mut cs, &mut gs, "after truncate(21): back to 20", Some(21), &ids[42..44], Logits::All);
    assert_eq!(Context::keepable(&gs, 19), 16);
}

/// DeepSeek-V4: hyper-connections (3 streams), a sliding layer, CSA (entries every 4
/// positions, the indexer keeping 3) and HCA (every 8) layers with sinks, both hash and
/// learned-router (sqrtsoftplus) MoE layers with the clamped SwiGLU and a shared expert;
/// 48 positions against a window of 6: several compression blocks. With the router
/// lookahead on (its learned-router layers guessed from the layer before; the hash
/// layers' experts are known and need no guess): the same bits.
#[test]
fn deepseek_v4_gpu_matches_cpu() {
    check("deepseek_v4", None, 2);
}

/// DeepSeek-V4 in the release's layout: FP4 routed experts, block-scaled FP8 dense weights.
#[test]
fn deepseek_v4_fp8_gpu_matches_cpu() {
    check("deepseek_v4_fp8", None, 0);
}

/// The deepseek_v4 fixture and its reference's token ids.
fn v4_fixture() -> (Model, Vec<u32>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v4");
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    (Model::open_dir(&dir).unwrap(), ids(&reference["ids"]))
}

/// DeepSeek-V4's GPU state goes back only to a snapshot, like the CPU's: a session
/// truncated before its first one restarts and feeds the kept tokens again, giving the
/// bits of a fresh prefill.
#[test]
fn deepseek_v4_gpu_truncation_restarts_the_state() {
    let Some(ctx) = gpu() else { return };
    let (model, tf) = v4_fixture();
    let gm = GpuModel::new(&model, ctx, GpuOptions::default()).unwrap();
    let vocab = model.cfg.vocab;
    let fresh = gm.forward_blocking(&mut gm.new_session(), &tf[..30], Logits::All).unwrap();
    let mut s = gm.new_session();
    gm.forward_blocking(&mut s, &tf[..23], Logits::Last).unwrap();
    // Back to 13 (inside the state), then on with other tokens than before.
    s.truncate(13);
    assert_eq!(s.len(), 13);
    let got = gm.forward_blocking(&mut s, &tf[13..30], Logits::All).unwrap();
    // The session counts the V4 state's bytes (window, entries, carried rows).
    assert!(s.bytes() > 4 * 30 + 4 * 5 * model.cfg.n_layers * model.cfg.head_dim, "{} bytes", s.bytes());
    assert_bits("deepseek_v4 after truncation", &got, &fresh[13 * vocab..]);
    // And a decode step after it equals the prefill's next position.
    let step = gm.forward_blocking(&mut s, &tf[30..31], Logits::Last).unwrap();
    let more = gm.forward_blocking(&mut gm.new_session(), &tf[..31], Logits::Last).unwrap();
    assert_bits("deepseek_v4 decode after truncation", &step, &more);
}

/// DeepSeek-V4's GPU state keeps snapshots where a multi-token pass began and where one
/// ended: a cut after the prompt's end goes back there (not to the start), a speculative
/// pass's rejected drafts go back to its start, and the logits are those of a fresh
/// prefill, bit for bit.
#[test]
fn deepseek_v4_gpu_goes_back_to_a_snapshot() {
    use colibri_engine::generate::Context;
    let Some(ctx) = gpu() else { return };
    let (model, tf) = v4_fixture();
    let gm = GpuModel::new(&model, ctx, GpuOptions::default()).unwrap();
    let vocab = model.cfg.vocab;
    let fresh = gm.forward_blocking(&mut gm.new_session(), &tf[..48], Logits::All).unwrap();
    let mut s = gm.new_session();
    gm.forward_blocking(&mut s, &tf[..19], Logits::Last).unwrap();
    for t in 19..22 {
        gm.forward_blocking(&mut s, &tf[t..t + 1], Logits::Last).unwrap();
    }
    assert_eq!(s.keepable(21), 19, "back to where the prompt ended");
    assert_eq!(s.keepable(12), 0, "before any snapshot");
    s.truncate(21);
    assert_eq!(s.cached_len(), 19);
    let got = gm.forward_blocking(&mut s, &tf[21..30], Logits::All).unwrap();
    assert_bits("deepseek_v4 back to a snapshot", &got, &fresh[21 * vocab..30 * vocab]);
    // Four positions in one pass, two kept: back to the pass's start, those two fed again.
    gm.forward_blocking(&mut s, &tf[30..34], Logits::All).unwrap();
    s.truncate(32);
    assert_eq!(s.cached_len(), 30, "the speculative pass's start");
    let got = gm.forward_blocking(&mut s, &tf[32..34], Logits::All).unwrap();
    assert_bits("deepseek_v4 after a rolled-back pass", &got, &fresh[32 * vocab..34 * vocab]);
    // The snapshot at 34 pinned: three multi-token passes after it leave it (counted in
    // the session's bytes), and a cut before them goes back there.
    s.pin_snapshot(34);
    let one = s.snapshot_bytes();
    for at in [34, 37, 40] {
        gm.forward_blocking(&mut s, &tf[at..at + 3], Logits::Last).unwrap();
    }
    assert!(one > 0 && s.snapshot_bytes() > one, "{one} {}", s.snapshot_bytes());
    assert_eq!(s.keepable(36), 34);
    s.truncate(36);
    let got = gm.forward_blocking(&mut s, &tf[36..48], Logits::All).unwrap();
    assert_bits("deepseek_v4 back to the pinned snapshot", &got, &fresh[36 * vocab..]);
}
