//! A GPU session's caches through a cache file (model::kv): read back into the CPU's
//! layout (`GpuModel::session_to_cpu`), written, read, uploaded into a new GPU session
//! (`GpuModel::session_from_cpu`), which then continues with every logit bit of the
//! session that never stopped: one family per kind of cache (GQA with a sliding window
//! and sinks, MLA, MLA with DSA's indexer keys, Gated DeltaNet, DeepSeek-V4's window,
//! compressors and indexer), cut at several points (V4: on and between compression
//! boundaries). On lavapipe, where the GPU computes the CPU's bits, the caches read back
//! are also the CPU session's, byte for byte in the file, and a GPU session uploaded from
//! the CPU's continues with the CPU's bits.
#![cfg(feature = "wgpu")]

use std::path::PathBuf;

use crate::gpu_common::{assert_bits, gpu};
use colibri_engine::gpu::{GpuModel, GpuOptions, GpuSession};
use colibri_engine::model::kv;
use colibri_engine::{Logits, Model};
use serde_json::Value;

/// Feeds `ids` as a multi-token call of the first `chunk`, then one token at a time;
/// every returned logit, in order.
fn feed(gm: &GpuModel<&Model>, s: &mut GpuSession, ids: &[u32], chunk: usize) -> Vec<f32> {
    let (head, tail) = ids.split_at(chunk.min(ids.len()));
    let mut out = Vec::new();
    if !head.is_empty() {
        out.extend(gm.forward_blocking(s, head, Logits::All).unwrap());
    }
    for id in tail {
        out.extend(gm.forward_blocking(s, &[*id], Logits::Last).unwrap());
    }
    out
}

fn check(name: &str, cuts: &[usize], more: usize) {
    let Some(ctx) = gpu() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids: Vec<u32> =
        reference["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
    let model = Model::open_dir(&dir).unwrap();
    let gm = GpuModel::new(&model, ctx, GpuOptions::default()).unwrap();
    let lavapipe = gm.ctx.adapter_name.contains("llvmpipe");
    for &cut in cuts {
        assert!(cut + more <= ids.len(), "{name}: the fixture has {} ids", ids.len());
        let what = format!("{name} cut at {cut}");
        // A prefill and decode steps up to the cut.
        let mut gs = gm.new_session();
        feed(&gm, &mut gs, &ids[..cut], cut - 3);
        let back = gm.session_to_cpu_blocking(&gs).unwrap();
        assert_eq!(back.tokens, ids[..cut], "{what}: tokens read back");
        let file = kv::encode(&back, "fp").unwrap();
        // Reading back only what positions k.. added gives the record of k.. that the
        // whole read-back gives (what a turn appends to its conversation's file).
        for k in [0, 1, cut / 2, cut - 1, cut] {
            let part = gm.session_to_cpu_from_blocking(&gs, k).unwrap();
            let (got, want) = (kv::encode_record(&part, "fp", k).unwrap(), kv::encode_record(&back, "fp", k).unwrap());
            assert!(got == want, "{what}: the record of {k}.. read back from {k}");
        }
        if lavapipe {
            let mut cs = model.new_session();
            model.forward(&mut cs, &ids[..cut - 3], Logits::Last).unwrap();
            for id in &ids[cut - 3..cut] {
                model.forward(&mut cs, &[*id], Logits::Last).unwrap();
            }
            // The same bytes: caches, states, and the snapshot where the prefill ended (both
            // split the record there).
            assert!(kv::encode(&cs, "fp").unwrap() == file, "{what}: the GPU's caches are not the CPU's");
        }
        // Written, read, uploaded: the continuation (a multi-token call, then decode
        // steps) gives the uninterrupted session's bits.
        let read = kv::decode(&file, "fp", &model.cfg).unwrap();
        let mut restored = gm.session_from_cpu(&read).unwrap();
        assert_eq!(restored.tokens, ids[..cut], "{what}: tokens uploaded");
        // The file's snapshot (where the prefill ended) came along: cut back past it, the
        // uploaded session goes back to it, as the file's session does.
        let (mut up, mut cpu) = (gm.session_from_cpu(&read).unwrap(), read.clone());
        up.truncate(cut - 1);
        cpu.truncate(cut - 1);
        assert_eq!(up.cached_len(), cpu.cached_len(), "{what}: uploaded snapshots");
        let rest = &ids[cut..cut + more];
        let want = feed(&gm, &mut gs, rest, 2);
        let got = feed(&gm, &mut restored, rest, 2);
        assert_bits(&format!("{what}: continued after a restore"), &got, &want);
        // And once more from the continued session: a restored state read back again.
        let again = gm.session_to_cpu_blocking(&restored).unwrap();
        let cont = gm.session_to_cpu_blocking(&gs).unwrap();
        assert!(kv::encode(&again, "fp").unwrap() == kv::encode(&cont, "fp").unwrap(), "{what}: read back twice");
        // A file cut back to a shorter prefix (the helper's store keeps what a new prompt
        // shares): a recurrent or V4 state cannot go back, so it holds fewer positions
        // than its tokens, and the GPU feeds the rest again, as the CPU does.
        let mut short = kv::decode(&file, "fp", &model.cfg).unwrap();
        short.truncate(cut - 2);
        let mut restored = gm.session_from_cpu(&short).unwrap();
        assert_eq!(restored.tokens, ids[..cut - 2], "{what}: tokens of the cut file");
        assert_eq!(restored.cached_len(), short.cached_len(), "{what}: positions held after the cut");
        let mut fresh = gm.new_session();
        let want = feed(&gm, &mut fresh, &ids[..cut + 1], cut + 1);
        let got = feed(&gm, &mut restored, &ids[cut - 2..cut + 1], 3);
        assert_bits(&format!("{what}: cut back to {}", cut - 2), &got, &want[(cut - 2) * model.cfg.vocab..]);
    }
}

/// Grouped-query attention, every layer's keys and values.
#[test]
fn olmoe_gpu_cache_survives_a_file() {
    check("olmoe", &[5, 12], 6);
}

/// A sliding window on alternate layers and attention sinks.
#[test]
fn gpt_oss_gpu_cache_survives_a_file() {
    check("gpt_oss", &[9], 6);
}

/// MLA: the latent and the rotary key, one GPU row, two CPU parts.
#[test]
fn deepseek_v3_gpu_cache_survives_a_file() {
    check("deepseek_v3", &[7], 5);
}

/// MLA with DeepSeek Sparse Attention: the indexer's keys in the rows of its layers.
#[test]
fn glm_moe_dsa_gpu_cache_survives_a_file() {
    check("glm_moe_dsa", &[9], 5);
}

/// Gated DeltaNet's recurrent state beside GQA layers.
#[test]
fn qwen3_next_gpu_cache_survives_a_file() {
    check("qwen3_next", &[6, 11], 6);
}

/// DeepSeek-V4: a window of 6, CSA every 4 (overlapping windows, carried Ca halves, the
/// indexer's own compressor) and HCA every 8: cut on a boundary of both (16), just after
/// one (17: the carried rows, kept across a pass that completes no window) and mid-way
/// (22), each continued across more boundaries.
#[test]
fn deepseek_v4_gpu_cache_survives_a_file() {
    check("deepseek_v4", &[16, 17, 22], 12);
}

/// A session that does not fit the model (another model's, or one whose parts were cut
/// short) is an error when uploaded, never a panic or a wrong continuation.
#[test]
fn a_session_of_another_shape_is_refused() {
    let Some(ctx) = gpu() else { return };
    let open = |name: &str| {
        Model::open_dir(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)).unwrap()
    };
    let (olmoe, next, v4) = (open("olmoe"), open("qwen3_next"), open("deepseek_v4"));
    let ids: Vec<u32> = (1..20).collect();
    let fed = |m: &Model| {
        let mut s = m.new_session();
        m.forward(&mut s, &ids, Logits::Last).unwrap();
        s
    };
    let gm = GpuModel::new(&olmoe, ctx.clone(), GpuOptions::default()).unwrap();
    assert!(gm.session_from_cpu(&fed(&next)).is_err(), "another model's layers");
    let mut short = fed(&olmoe);
    short.caches[1].k.truncate(5);
    assert!(gm.session_from_cpu(&short).is_err(), "keys cut short");
    let gm = GpuModel::new(&next, ctx.clone(), GpuOptions::default()).unwrap();
    let mut s = fed(&next);
    let r = s.caches.iter_mut().find_map(|c| c.recurrent.as_mut()).unwrap();
    r.s.pop();
    assert!(gm.session_from_cpu(&s).is_err(), "a recurrent state of another size");
    let gm = GpuModel::new(&v4, ctx, GpuOptions::default()).unwrap();
    let mut s = fed(&v4);
    s.v4.as_mut().unwrap().layers[0].window.pop();
    assert!(gm.session_from_cpu(&s).is_err(), "a V4 window of a partial key");
    let mut s = fed(&v4);
    let l = s.v4.as_mut().unwrap().layers.iter_mut().find(|l| !l.comp.entries.is_empty()).unwrap();
    l.comp.entries.pop();
    assert!(gm.session_from_cpu(&s).is_err(), "V4 entries of a partial row");
    let mut s = fed(&v4);
    s.v4.as_mut().unwrap().layers.pop();
    assert!(gm.session_from_cpu(&s).is_err(), "a V4 state of fewer layers");
}
