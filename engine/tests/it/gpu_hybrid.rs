//! Hybrid expert placement (gpu/hybrid.rs): with a GPU pool too small for a layer's
//! experts, experts missing from the pool run on the CPU while the GPU computes the
//! others, and the logits keep every bit: the same as the CPU path and as hybrid off, in
//! a prefill and token by token, for routers and FFNs of several families (softmax,
//! sigmoid with groups, a gated and an ungated shared expert, expert biases).
#![cfg(feature = "wgpu")]

use std::path::PathBuf;

use crate::gpu_common::{assert_bits, gpu, ulp_stats};
use colibri_engine::gpu::{GpuModel, GpuOptions, Hybrid};
use colibri_engine::{Logits, Model};
use serde_json::Value;

/// Bytes of one routed expert of the model's first MoE layer.
fn expert_bytes(model: &Model) -> u64 {
    (0..model.cfg.n_layers)
        .find_map(|l| model.experts.expert(l, 0).ok())
        .map(|e| [&e.gate, &e.up, &e.down].iter().map(|m| m.bytes.as_ref().len() as u64).sum())
        .expect("a MoE layer")
}

fn check(name: &str) {
    let Some(ctx) = gpu() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids: Vec<u32> =
        reference["ids"].as_array().unwrap().iter().take(16).map(|x| x.as_u64().unwrap() as u32).collect();
    let model = Model::open_dir(&dir).unwrap();
    let vocab = model.cfg.vocab;
    let cpu = model.forward(&mut model.new_session(), &ids, Logits::All).unwrap();
    // Room for two experts: the first layer fills it, every later miss is a candidate.
    let pool = 2 * expert_bytes(&model) + 64;
    let exact = ctx.adapter_name.contains("llvmpipe");
    let mut off: Option<Vec<f32>> = None;
    for mode in [Hybrid::Off, Hybrid::On, Hybrid::Auto] {
        let opts = GpuOptions { expert_pool_bytes: Some(pool), hybrid: mode, ..Default::default() };
        let gm = GpuModel::new(&model, ctx.clone(), opts).unwrap();
        let got = gm.forward_blocking(&mut gm.new_session(), &ids, Logits::All).unwrap();
        let mut s = gm.new_session();
        for (p, &id) in ids.iter().enumerate().take(6) {
            let step = gm.forward_blocking(&mut s, &[id], Logits::Last).unwrap();
            assert_bits(
                &format!("{name} {mode:?}: decode step {p} vs prefill"),
                &step,
                &got[p * vocab..(p + 1) * vocab],
            );
        }
        let h = gm.hybrid_stats();
        // Per expert, where it ran: the uses add up to the counts.
        let placed = gm.take_placement().unwrap();
        assert_eq!(placed.iter().map(|p| p.cpu).sum::<u64>(), h.cpu_experts, "{name} {mode:?}: CPU uses");
        assert_eq!(placed.iter().map(|p| p.gpu).sum::<u64>(), h.gpu_experts, "{name} {mode:?}: GPU uses");
        assert!(gm.take_placement().unwrap().is_empty(), "{name}: taken twice");
        eprintln!("{name} {mode:?}: {h:?} pool {:?}", gm.pool_stats());
        match mode {
            Hybrid::Off => assert_eq!(h.cpu_experts, 0, "{name}: hybrid off ran experts on the CPU"),
            // On: every miss that does not fit runs on the CPU; Auto: at least one per
            // layer with candidates until both costs are measured.
            _ => assert!(h.cpu_experts > 0 && h.gpu_experts > 0, "{name} {mode:?}: {h:?}"),
        }
        if exact {
            assert_bits(&format!("{name} {mode:?}: GPU vs CPU"), &got, &cpu);
        } else {
            let (max, _, _) = ulp_stats(&got, &cpu);
            assert!(max <= 64, "{name} {mode:?}: {max} ulp from the CPU on {}", gm.ctx.adapter_name);
        }
        match &off {
            None => off = Some(got),
            // Where each expert ran changes no bit on lavapipe (elsewhere the GPU's own
            // kernels may differ from the CPU's within the bound above).
            Some(o) if exact => assert_bits(&format!("{name} {mode:?}: hybrid vs off"), &got, o),
            Some(_) => {}
        }
    }
}

#[test]
fn olmoe_hybrid_is_exact() {
    check("olmoe");
}

#[test]
fn qwen2_moe_hybrid_is_exact() {
    // A shared expert with a sigmoid gate, added after the routed experts.
    check("qwen2_moe");
}

#[test]
fn deepseek_v3_hybrid_is_exact() {
    // Sigmoid routing with groups and a correction bias; an ungated shared expert.
    check("deepseek_v3");
}

#[test]
fn gpt_oss_hybrid_is_exact() {
    // Expert biases and the clamped SwiGLU.
    check("gpt_oss");
}

#[test]
fn hybrid_parses_its_names() {
    for (s, h) in [("off", Hybrid::Off), ("on", Hybrid::On), ("auto", Hybrid::Auto)] {
        assert_eq!(s.parse::<Hybrid>().unwrap(), h);
        assert_eq!(h.name(), s);
    }
    assert!("yes".parse::<Hybrid>().is_err());
}

#[test]
fn deepseek_v4_hybrid_is_exact() {
    // Hash and sqrtsoftplus routing, V4's clamped SwiGLU on both sides, a shared expert.
    check("deepseek_v4");
}
