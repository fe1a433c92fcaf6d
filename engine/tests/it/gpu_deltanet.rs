//! Gated DeltaNet on the GPU against the CPU reference (engine/src/model/deltanet.rs),
//! bit for bit on lavapipe: the conv and delta-rule kernels over a prefill and decode steps
//! with odd sizes (a value head wider than one workgroup), and the gates kernel (sigmoid, softplus with
//! its libm log1pf port, exp) over a wide range of inputs.
#![cfg(feature = "wgpu")]

use crate::gpu_common::{assert_bits, gpu, Lcg};
use colibri_engine::gpu::buffers::{f32s, upload_f32};
use colibri_engine::gpu::deltanet::GpuDeltaState;
use colibri_engine::gpu::kernels::Kernel;
use colibri_engine::gpu::recorder::Recorder;
use colibri_engine::gpu::{block_on, GpuContext};
use colibri_engine::math;
use colibri_engine::math::softplus;
use colibri_engine::model::config::LinearAttnConfig;
use colibri_engine::model::deltanet::{self, DeltaState};

fn read(ctx: &GpuContext, buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let mut rec = Recorder::new(ctx);
    rec.read(buf, 0, len as u64 * 4);
    f32s(&block_on(rec.submit()).unwrap()[0])
}

/// The causal conv + SiLU and the delta rule (deltanet_conv.wgsl, delta_rule.wgsl)
/// against deltanet::conv_silu and deltanet::rule, over a prefill, decode steps and a
/// batch, the state carried between calls, with odd sizes: a value head of 70 (two
/// column groups per head) and three value heads per key head. (The whole layer runs on
/// the GPU as the graph's `graph::deltanet`, checked on every DeltaNet fixture in
/// gpu_fixtures.rs.)
#[test]
fn deltanet_conv_and_rule_match_cpu_over_prefill_and_decode() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(17);
    let c = LinearAttnConfig {
        n_k_heads: 2,
        n_v_heads: 6,
        k_head_dim: 9,
        v_head_dim: 70,
        conv_kernel: 4,
        layers: vec![true],
        split_in_proj: false,
    };
    let (cd, nv, vd) = (c.conv_dim(), c.n_v_heads, c.value_dim());
    let taps = rng.vec(cd * c.conv_kernel, 0.7);
    let taps_b = upload_f32(&ctx, "taps", &taps).unwrap();
    let mut cpu = DeltaState::default();
    cpu.ensure(&c);
    let gst = GpuDeltaState::new(&ctx, &c).unwrap();
    for (i, n) in [7usize, 1, 1, 1, 3].into_iter().enumerate() {
        let mut mixed = rng.vec(n * cd, 1.5);
        // beta in (0, 1), decay in (0, 1], as the gates make them.
        let mut ba = Vec::with_capacity(n * 2 * nv);
        for _ in 0..n {
            ba.extend((0..nv).map(|_| 0.5 + 0.45 * rng.next()));
            ba.extend((0..nv).map(|_| 0.95 + 0.05 * rng.next()));
        }
        let (mb, bab) = (upload_f32(&ctx, "mixed", &mixed).unwrap(), upload_f32(&ctx, "ba", &ba).unwrap());
        let o = ctx.storage_buffer("o", (n * vd) as u64 * 4).unwrap();
        deltanet::conv_silu(&c, &taps, &mut mixed, n, &mut cpu.conv);
        let mut want = vec![0.0; n * vd];
        deltanet::rule(&c, &mixed, &ba, n, &mut cpu, &mut want);

        let mut rec = Recorder::new(&ctx);
        let params = [n as u32, cd as u32, c.conv_kernel as u32];
        let binds = vec![(&mb).into(), (&taps_b).into(), (&gst.conv).into()];
        rec.dispatch(Kernel::DeltaNetConv, &[], &params, binds, cd.div_ceil(64) as u64).unwrap();
        let groups = c.v_head_dim.div_ceil(64);
        let params = [
            n as u32,
            nv as u32,
            (nv / c.n_k_heads) as u32,
            c.k_head_dim as u32,
            c.v_head_dim as u32,
            c.key_dim() as u32,
            cd as u32,
            groups as u32,
        ];
        let binds = vec![(&mb).into(), (&bab).into(), (&gst.s).into(), (&o).into()];
        rec.dispatch(Kernel::DeltaRule, &[], &params, binds, (nv * groups) as u64).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("call {i}: conv ({n} positions)"), &read(&ctx, &mb, n * cd), &mixed);
        assert_bits(&format!("call {i}: delta rule ({n} positions)"), &read(&ctx, &o, n * vd), &want);
        assert!(want.iter().any(|v| v.abs() > 1e-3), "a test that cannot fail");
    }
    assert_bits("the state after every call", &read(&ctx, &gst.s, cpu.s.len()), &cpu.s);
}

#[test]
fn deltanet_gates_match_cpu_over_a_wide_range() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(5);
    let heads = 8;
    let neg_a: Vec<f32> = (0..heads).map(|h| -math::exp(h as f32 - 4.0)).collect();
    let dt: Vec<f32> = rng.vec(heads, 3.0);
    // a + dt_bias across softplus's branches: large negative (log1p of a tiny e^x), around
    // log1pf's reduction boundaries, around torch's threshold of 20, and beyond.
    let mut a: Vec<f32> = Vec::new();
    for i in 0..(1 << 16) {
        a.push(-110.0 + 140.0 * i as f32 / (1 << 16) as f32);
    }
    for x in [-1.0f32, -0.5, 0.0, 0.5, 19.999, 20.0, 20.001, -16.6, -17.0, -87.0, -88.0] {
        a.extend(dt.iter().map(|d| x - d));
    }
    a.extend(rng.vec(4096, 8.0));
    let n = a.len().div_ceil(heads);
    a.resize(n * heads, 0.5);
    let b: Vec<f32> = (0..n * heads).map(|_| rng.next() * 30.0).collect();
    let mut ba = Vec::with_capacity(2 * n * heads);
    for t in 0..n {
        ba.extend_from_slice(&b[t * heads..(t + 1) * heads]);
        ba.extend_from_slice(&a[t * heads..(t + 1) * heads]);
    }
    let buf = upload_f32(&ctx, "ba", &ba).unwrap();
    let (nb, db) = (upload_f32(&ctx, "neg_a", &neg_a).unwrap(), upload_f32(&ctx, "dt", &dt).unwrap());
    let mut rec = Recorder::new(&ctx);
    let groups = (n * heads).div_ceil(64) as u64;
    rec.dispatch(
        Kernel::DeltaNetGates,
        &[],
        &[n as u32, heads as u32],
        vec![(&buf).into(), (&nb).into(), (&db).into()],
        groups,
    )
    .unwrap();
    block_on(rec.submit()).unwrap();
    let got = read(&ctx, &buf, ba.len());
    let mut want = Vec::with_capacity(ba.len());
    for t in 0..n {
        want.extend((0..heads).map(|h| math::sigmoid(b[t * heads + h])));
        want.extend((0..heads).map(|h| math::exp(neg_a[h] * softplus(a[t * heads + h] + dt[h]))));
    }
    assert_bits("beta and decay", &got, &want);
    // The decays are not all 0 or 1: softplus's values matter.
    assert!(want.iter().filter(|d| **d > 0.01 && **d < 0.99).count() > 1000);
}
