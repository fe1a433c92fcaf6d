//! Gated DeltaNet on the GPU against the CPU reference (engine/src/model/deltanet.rs),
//! bit for bit on lavapipe: a whole layer over a prefill and decode steps with odd sizes
//! (a value head wider than one workgroup), and the gates kernel (sigmoid, softplus with
//! its libm log1pf port, exp) over a wide range of inputs.
#![cfg(feature = "wgpu")]

mod gpu_common;

use colibri_engine::gpu::buffers::{f32s, upload_f32};
use colibri_engine::gpu::deltanet::{DeltaScratch, GpuDeltaNet, GpuDeltaState};
use colibri_engine::gpu::kernels::Kernel;
use colibri_engine::gpu::recorder::Recorder;
use colibri_engine::gpu::stream::Uploader;
use colibri_engine::gpu::{block_on, GpuContext};
use colibri_engine::math;
use colibri_engine::model::config::LinearAttnConfig;
use colibri_engine::model::deltanet::{softplus, DeltaNetWeights, DeltaState, InProj};
use colibri_engine::tensor::Mat;
use gpu_common::{assert_bits, gpu, Lcg};

fn read(ctx: &GpuContext, buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let mut rec = Recorder::new(ctx);
    rec.read(buf, 0, len as u64 * 4);
    f32s(&block_on(rec.submit()).unwrap()[0])
}

fn layer(rng: &mut Lcg, c: LinearAttnConfig, hidden: usize) -> DeltaNetWeights {
    let mut m = |rows: usize, cols: usize| Mat::from_f32(rows, cols, &rng.vec(rows * cols, 0.5)).unwrap();
    let (in_qkvz, in_ba, out) =
        (m(2 * c.key_dim() + 2 * c.value_dim(), hidden), m(2 * c.n_v_heads, hidden), m(hidden, c.value_dim()));
    DeltaNetWeights {
        in_proj: InProj::Grouped { qkvz: in_qkvz, ba: in_ba },
        conv: rng.vec(c.conv_dim() * c.conv_kernel, 0.7),
        neg_a: rng.vec(c.n_v_heads, 1.0).iter().map(|x| -math::exp(x - 1.0)).collect(),
        dt_bias: rng.vec(c.n_v_heads, 1.0),
        norm: rng.vec(c.v_head_dim, 0.3).iter().map(|x| x + 1.0).collect(),
        out,
        cfg: c,
        eps: 1e-6,
    }
}

#[test]
fn deltanet_layer_matches_cpu_over_prefill_and_decode() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(17);
    let hidden = 37;
    // v_head_dim 70: two column groups per head; three value heads per key head.
    let cfg = LinearAttnConfig {
        n_k_heads: 2,
        n_v_heads: 6,
        k_head_dim: 9,
        v_head_dim: 70,
        conv_kernel: 4,
        layers: vec![true],
        split_in_proj: false,
    };
    let w = layer(&mut rng, cfg.clone(), hidden);
    let g = GpuDeltaNet::upload(&Uploader::new(&ctx, None), "test", &w).unwrap();
    let mut cpu_state = DeltaState::default();
    let mut gpu_state = GpuDeltaState::new(&ctx, &cfg).unwrap();
    // A prefill of 7, then three decode steps, then a batch of 3.
    for (i, n) in [7usize, 1, 1, 1, 3].into_iter().enumerate() {
        let x = rng.vec(n * hidden, 1.5);
        let mut want = vec![0.0; n * hidden];
        w.forward(&x, n, &mut cpu_state, &mut want);
        let xb = upload_f32(&ctx, "x", &x).unwrap();
        let y = ctx.storage_buffer("y", (n * hidden) as u64 * 4).unwrap();
        let scratch = DeltaScratch::new(&ctx, &cfg, n).unwrap();
        let mut rec = Recorder::new(&ctx);
        g.forward(&mut rec, &scratch, &xb, n, &mut gpu_state, &y).unwrap();
        block_on(rec.submit()).unwrap();
        let got = read(&ctx, &y, n * hidden);
        assert_bits(&format!("call {i} ({n} positions)"), &got, &want);
        assert_eq!(gpu_state.pos, cpu_state.pos);
        assert!(want.iter().any(|v| v.abs() > 1e-3), "a test that cannot fail");
    }
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
