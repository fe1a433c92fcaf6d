//! The multi-token-prediction layer against a torch reference (tools/fixtures_mtp.py:
//! deepseek_v3_mtp, glm4_moe_mtp, glm_moe_dsa_mtp, qwen3_5_moe_mtp), and speculative decoding with its drafts: greedy and
//! sampled output equal the output without speculation, token for token.

use std::path::PathBuf;

use colibri_engine::generate::{
    drive_drafted, forward_recording, generate, Drafter, GenerateOptions, Generator, MtpDrafter, SpecStats,
};
use colibri_engine::model::attention::LayerCache;
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::{Logits, Model};
use serde_json::Value;

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn read_f32(p: &std::path::Path) -> Vec<f32> {
    std::fs::read(p).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn reference_ids(dir: &std::path::Path) -> Vec<u32> {
    let r: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    r["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The MTP logits of every position equal the torch reference's to 1e-3 of their
/// spread, with the same argmax wherever the reference's top two are apart; one position
/// at a time through the MTP cache gives the same bits as all at once.
fn check_logits(name: &str) {
    let dir = fixture_dir(name);
    let model = Model::open_dir(&dir).unwrap();
    assert!(model.has_mtp(), "{name}: no MTP layer loaded");
    let (h, vocab) = (model.cfg.hidden, model.cfg.vocab);
    let ids = reference_ids(&dir);
    let m = ids.len() - 1;
    let mut s = model.new_session();
    let (_, hidden) = model.forward_hidden(&mut s, &ids, Logits::Last).unwrap();
    assert_eq!(hidden.len(), ids.len() * h);
    let mut cache = LayerCache::default();
    let (got, _) = model.mtp_forward(&mut cache, 0, &hidden[..m * h], &ids[1..], Logits::All).unwrap();
    let want = read_f32(&dir.join("mtp_logits.bin"));
    assert_eq!((got.len(), want.len()), (m * vocab, m * vocab));
    let mean = want.iter().map(|v| *v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let (worst, at) = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (*g as f64 - *w as f64).abs())
        .enumerate()
        .fold((0.0f64, 0), |(b, bi), (i, d)| if d > b { (d, i) } else { (b, bi) });
    eprintln!(
        "{name}: MTP max |diff| {worst:.3e} = {:.3e} of std {std:.3} at [{}, {}]",
        worst / std,
        at / vocab,
        at % vocab
    );
    assert!(worst / std <= 1e-3, "{name}: MTP logits differ by {:.3e} of std at position {}", worst / std, at / vocab);
    let mut checked = 0;
    for p in 0..m {
        let w = &want[p * vocab..(p + 1) * vocab];
        let mut sorted = w.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 1e-3 {
            checked += 1;
            let g = &got[p * vocab..(p + 1) * vocab];
            assert_eq!(colibri_engine::math::argmax(g), colibri_engine::math::argmax(w), "{name}: position {p}");
        }
    }
    assert!(checked > m / 2, "{name}: too few clear positions ({checked})");
    // Position by position through the cache: the same bits.
    let mut cache = LayerCache::default();
    for p in 0..m {
        let (row, _) =
            model.mtp_forward(&mut cache, p, &hidden[p * h..(p + 1) * h], &ids[p + 1..p + 2], Logits::Last).unwrap();
        assert!(
            row.iter().zip(&got[p * vocab..(p + 1) * vocab]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: position {p} one at a time differs from the batch"
        );
    }
}

#[test]
fn deepseek_v3_mtp_logits_match_torch() {
    check_logits("deepseek_v3_mtp");
}

#[test]
fn glm4_moe_mtp_logits_match_torch() {
    check_logits("glm4_moe_mtp");
}

/// GLM-5's layout: a DSA model (sequences past its index_topk) whose MTP layer carries an
/// indexer; the layer attends densely, as its reference does.
#[test]
fn glm_moe_dsa_mtp_logits_match_torch() {
    check_logits("glm_moe_dsa_mtp");
}

/// Qwen3.5's `mtp.*` module (a full-attention layer after a Gated DeltaNet stack).
#[test]
fn qwen3_5_moe_mtp_logits_match_torch() {
    check_logits("qwen3_5_moe_mtp");
}

/// Generates with MTP drafts (`k` per step) and returns the ids and what speculation did.
fn generate_mtp(model: &Model, prompt: &[u32], opts: &GenerateOptions, k: usize) -> (Vec<u32>, SpecStats) {
    let mut drafter = MtpDrafter::new(model).unwrap();
    let log = drafter.log();
    let mut session = model.new_session();
    let mut g = Generator::new(&[], prompt, model.cfg.max_positions, opts).unwrap().with_external_drafts(k);
    drive_drafted(
        &mut |keep, ids, which| forward_recording(model, &mut session, &log, keep, ids, which),
        0,
        &mut g,
        Some(&mut drafter),
        &mut |_| true,
    )
    .unwrap();
    (g.produced().to_vec(), g.spec_stats())
}

#[test]
fn mtp_speculation_gives_the_output_without_it() {
    for name in ["deepseek_v3_mtp", "glm4_moe_mtp", "glm_moe_dsa_mtp", "qwen3_5_moe_mtp"] {
        let dir = fixture_dir(name);
        let model = Model::open_dir(&dir).unwrap();
        let prompt = &reference_ids(&dir)[..8];
        for sampler in [
            SamplerConfig::default(),
            SamplerConfig { temperature: 0.9, top_p: 0.95, seed: 7, ..SamplerConfig::default() },
        ] {
            let opts = GenerateOptions { max_new_tokens: 40, sampler, stop_ids: vec![], logprobs: None };
            let mut s = model.new_session();
            let (want, _) = generate(&model, &mut s, prompt, &opts, &mut |_| true).unwrap();
            for k in [1, 3] {
                let (got, st) = generate_mtp(&model, prompt, &opts, k);
                assert_eq!(got, want, "{name}: k={k} temperature {}", opts.sampler.temperature);
                // A random MTP layer's drafts are (nearly) never accepted: every pass verifies.
                assert!(st.drafted > 0 && st.forwards <= 40 && st.produced == 40, "{name}: {st:?}");
                eprintln!(
                    "{name} k={k} t={}: acceptance {:.2}, {:.2} tokens per forward",
                    opts.sampler.temperature,
                    st.acceptance_rate(),
                    st.tokens_per_forward()
                );
            }
        }
    }
}

/// Drafts proposed after contexts that grew by several tokens at once (as after accepted
/// drafts) and that were cut back (rejected ones) are the drafts of a fresh drafter over
/// the same context: the MTP cache keeps exactly the positions that stay valid.
#[test]
fn incremental_drafts_equal_drafts_from_scratch() {
    let model = Model::open_dir(&fixture_dir("glm4_moe_mtp")).unwrap();
    let ids = reference_ids(&fixture_dir("glm4_moe_mtp"));
    let mut d = MtpDrafter::new(&model).unwrap();
    let log = d.log();
    let mut s = model.new_session();
    let mut fed = 0;
    // Context lengths as a speculative run meets them; then another context that shares
    // only its first 10 tokens with the last one.
    let other: Vec<u32> = ids[..10].iter().chain(ids[30..].iter()).copied().collect();
    let steps = [3usize, 4, 7, 8, 12, 13, 16, 22, 23, 27].map(|l| (&ids[..l], l)).into_iter().chain([(&other[..], 14)]);
    for (src, len) in steps {
        let ctx = &src[..len];
        // The target cut back to what it shares with this context, fed the rest but the
        // last token, and two rejected drafts after (the log keeps their rows).
        let keep = if len == 14 { 10 } else { fed };
        let feed: Vec<u32> = ctx[keep..len - 1].iter().chain(&[1, 2]).copied().collect();
        forward_recording(&model, &mut s, &log, keep, &feed, Logits::Last).unwrap();
        fed = len - 1;
        let got = d.propose(ctx, 3).unwrap();
        let mut fresh = MtpDrafter::new(&model).unwrap();
        let mut s2 = model.new_session();
        forward_recording(&model, &mut s2, &fresh.log(), 0, &ctx[..len - 1], Logits::Last).unwrap();
        assert_eq!(got, fresh.propose(ctx, 3).unwrap(), "context of {len}");
        assert_eq!(got.len(), 3);
    }
}

#[test]
fn a_model_without_mtp_refuses_the_drafter() {
    let model = Model::open_dir(&fixture_dir("deepseek_v3")).unwrap();
    assert!(!model.has_mtp());
    let e = MtpDrafter::new(&model).err().expect("no MTP layer");
    assert!(e.to_string().contains("no MTP layer"), "{e}");
}
