//! Each WGSL kernel against its CPU reference on a real adapter (lavapipe in CI), bit for
//! bit: the kernels are written to reproduce the CPU's arithmetic exactly.
#![cfg(feature = "wgpu")]

use crate::gpu_common::{assert_bits, gpu, gpu_without_dp4a, Lcg};
use colibri_engine::gpu::buffers::{f32s, upload_f32, upload_mat};
use colibri_engine::gpu::ops::{self, AttnShape};
use colibri_engine::gpu::recorder::Recorder;
use colibri_engine::gpu::{block_on, GpuContext};
use colibri_engine::kernels::{self, Activation};
use colibri_engine::math;
use colibri_engine::model::rope::{Rope, RopeConfig};
use colibri_engine::tensor::{Bytes, DType, Mat};

fn read(ctx: &GpuContext, buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let mut rec = Recorder::new(ctx);
    rec.read(buf, 0, len as u64 * 4);
    f32s(&block_on(rec.submit()).unwrap()[0])
}

fn zeros(ctx: &GpuContext, len: usize) -> wgpu::Buffer {
    ctx.storage_buffer("test", len as u64 * 4).unwrap()
}

/// A random matrix stored in `dtype`: floats from random values, quantized types from
/// random bytes and random (finite) f16 scales.
fn random_mat(rows: usize, cols: usize, dtype: DType, rng: &mut Lcg) -> Mat {
    let rb = dtype.row_bytes(cols).unwrap();
    let mut bytes = Vec::with_capacity(rows * rb);
    for _ in 0..rows {
        match dtype {
            DType::F32 => bytes.extend((0..cols).flat_map(|_| rng.next().to_le_bytes())),
            DType::BF16 => {
                bytes.extend((0..cols).flat_map(|_| half::bf16::from_f32(rng.next()).to_bits().to_le_bytes()))
            }
            DType::F16 => bytes.extend((0..cols).flat_map(|_| {
                // Any finite half, subnormals included.
                let mut h = rng.bits() as u16;
                if h & 0x7c00 == 0x7c00 {
                    h &= !0x4000;
                }
                h.to_le_bytes()
            })),
            DType::Int8 { group } | DType::Int4 { group } => {
                let groups = cols.div_ceil(group as usize);
                let mut row = Vec::with_capacity(rb);
                for _ in 0..groups {
                    let s = half::f16::from_f32(rng.next().abs() * 0.05 + 1e-4);
                    row.extend(s.to_bits().to_le_bytes());
                }
                row.resize(row.len().div_ceil(4) * 4, 0);
                while row.len() < rb {
                    row.push(rng.bits() as u8);
                }
                bytes.extend(row);
            }
            DType::Mxfp4 => {
                // e8m0 scales around 2^-5 (normal f32 products), random nibbles.
                let blocks = cols / 32;
                let mut row: Vec<u8> = (0..blocks).map(|_| 118 + (rng.bits() % 10) as u8).collect();
                row.resize(blocks.div_ceil(4) * 4, 0);
                while row.len() < rb {
                    row.push(rng.bits() as u8);
                }
                bytes.extend(row);
            }
            DType::Fp8 { block } => {
                // f32 scales of either sign around 0.02, any e4m3 byte but the NaNs
                // (subnormals and -0 included).
                let blocks = cols.div_ceil(block as usize);
                let mut row: Vec<u8> = (0..blocks).flat_map(|_| (rng.next() * 0.02 + 1e-3).to_le_bytes()).collect();
                row.extend((0..cols).map(|_| match rng.bits() as u8 {
                    b if b & 0x7f == 0x7f => b ^ 1,
                    b => b,
                }));
                row.resize(rb, 0);
                bytes.extend(row);
            }
            DType::Q4K | DType::Q5K => {
                // Headers (f16 d and dmin of either sign, every 6-bit scale and min), then
                // random nibbles; Q5K: then random fifth-bit bytes (every bit of each).
                for _ in 0..cols / 256 {
                    bytes.extend(half::f16::from_f32(rng.next() * 0.01).to_bits().to_le_bytes());
                    bytes.extend(half::f16::from_f32(rng.next() * 0.01).to_bits().to_le_bytes());
                    bytes.extend((0..12).map(|_| rng.bits() as u8));
                }
                bytes.extend((0..cols / 2).map(|_| rng.bits() as u8));
                if dtype == DType::Q5K {
                    bytes.extend((0..cols / 256 * 32).map(|_| rng.bits() as u8));
                }
            }
            DType::U8 | DType::F8E4M3 => unreachable!("no GPU kernels for {dtype}"),
        }
    }
    Mat::new(rows, cols, dtype, Bytes::from_vec(bytes)).unwrap()
}

const DTYPES: [DType; 13] = [
    DType::Fp8 { block: 8 },
    DType::Fp8 { block: 12 },
    DType::Fp8 { block: 32 },
    DType::F32,
    DType::BF16,
    DType::F16,
    DType::Int8 { group: 32 },
    DType::Int4 { group: 32 },
    DType::Int4 { group: 7 },
    DType::Int8 { group: 64 },
    DType::Int4 { group: 64 },
    DType::Int8 { group: 3 },
    // The default conversion's attention, dense MLP and output (convert's DEFAULT_INT8_GROUP).
    DType::Int8 { group: 128 },
];

fn check_matmul(ctx: &GpuContext, rows: usize, cols: usize, dtype: DType, ns: &[usize], seed: u64) {
    let mut rng = Lcg(seed);
    let m = random_mat(rows, cols, dtype, &mut rng);
    let gm = upload_mat(ctx, "w", &m).unwrap();
    for &n in ns {
        let x = rng.vec(n * cols, 1.5);
        let mut want = vec![0.0; n * rows];
        kernels::matmul(&m, &x, n, &mut want);
        let xb = upload_f32(ctx, "x", &x).unwrap();
        let yb = zeros(ctx, n * rows);
        let mut rec = Recorder::new(ctx);
        ops::matmul(&mut rec, &gm, &xb, 0, n, &yb, 0, rows).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(
            &format!("matmul {dtype} [{rows}x{cols}] n={n} ({} blocks, dp4a {})", gm.parts.len(), ctx.dp4a()),
            &read(ctx, &yb, n * rows),
            &want,
        );
    }
}

#[test]
fn matmul_every_dtype_and_batch_size() {
    let Some(ctx) = gpu() else { return };
    for (i, dt) in DTYPES.into_iter().enumerate() {
        check_matmul(&ctx, 37, 29, dt, &[1, 3, 8, 11], 10 + i as u64);
        check_matmul(&ctx, 9, 200, dt, &[1, 17], 20 + i as u64);
    }
}

/// The integer matmuls with and without dot4I8Packed (naga implements the extension, so
/// natively [`gpu`] uses qmatmul_dp4a.wgsl for whole-word groups): both give the CPU's bits.
#[test]
fn qmatmul_with_and_without_dp4a() {
    let (Some(dp4a), Some(plain)) = (gpu(), gpu_without_dp4a()) else { return };
    if std::env::var("COLIBRI_GPU_DP4A").is_err() {
        assert!(dp4a.dp4a(), "naga implements packed_4x8_integer_dot_product");
    }
    assert!(!plain.dp4a());
    let dtypes = [
        DType::Int8 { group: 32 },
        DType::Int4 { group: 32 },
        DType::Int4 { group: 16 },
        DType::Int8 { group: 4 },
        DType::Int4 { group: 8 },
    ];
    for ctx in [&dp4a, &plain] {
        for (i, dt) in dtypes.into_iter().enumerate() {
            check_matmul(ctx, 37, 29, dt, &[1, 3, 8, 11], 60 + i as u64);
            check_matmul(ctx, 21, 330, dt, &[1, 2, 9], 70 + i as u64);
        }
    }
}

/// Q4K rows (GGUF Q4_K kept: qdot's Q4K step) with and without dot4I8Packed, every batch
/// size, and their embedding rows decoded: the CPU's bits.
#[test]
fn q4k_matmul_and_embedding_match_cpu() {
    check_k_rows(DType::Q4K, 90);
}

/// Q5K rows (GGUF Q5_K kept: Q4K's step on u = nibble + 16 * fifth bit) as Q4K's.
#[test]
fn q5k_matmul_and_embedding_match_cpu() {
    check_k_rows(DType::Q5K, 95);
}

/// Matmuls (both integer kernels) and embedding rows of a Q4K or Q5K matrix against the CPU.
fn check_k_rows(dtype: DType, seed: u64) {
    let (Some(dp4a), Some(plain)) = (gpu(), gpu_without_dp4a()) else { return };
    for ctx in [&dp4a, &plain] {
        check_matmul(ctx, 37, 256, dtype, &[1, 3, 8, 11], seed);
        check_matmul(ctx, 21, 768, dtype, &[1, 2, 9], seed + 1);
    }
    let mut rng = Lcg(seed + 2);
    let m = random_mat(9, 512, dtype, &mut rng);
    let gm = upload_mat(&dp4a, "embed", &m).unwrap();
    let ids: Vec<u32> = vec![0, 8, 3, 3];
    let mut want = vec![0.0; ids.len() * 512];
    for (i, &id) in ids.iter().enumerate() {
        m.row_into(id as usize, &mut want[i * 512..(i + 1) * 512]);
    }
    let x = zeros(&dp4a, want.len());
    let mut rec = Recorder::new(&dp4a);
    let idb = rec.data(&ids);
    ops::embed(&mut rec, &gm, idb, ids.len(), &x).unwrap();
    block_on(rec.submit()).unwrap();
    assert_bits(&format!("embed {dtype}"), &read(&dp4a, &x, want.len()), &want);
}

/// Integer matmul on activations with zero blocks, huge and tiny values, and a NaN row:
/// the CPU's bits (NaN where the CPU has NaN).
#[test]
fn qmatmul_edge_activations() {
    let (Some(dp4a), Some(plain)) = (gpu(), gpu_without_dp4a()) else { return };
    let (rows, cols, n) = (19, 100, 5);
    for (ctx, dtype) in
        [&dp4a, &plain].into_iter().flat_map(|c| [(c, DType::Int4 { group: 32 }), (c, DType::Int8 { group: 32 })])
    {
        let mut rng = Lcg(77);
        let m = random_mat(rows, cols, dtype, &mut rng);
        let gm = upload_mat(ctx, "w", &m).unwrap();
        let mut x = rng.vec(n * cols, 2.0);
        x[..40].iter_mut().for_each(|v| *v = 0.0); // position 0: one zero block, part of the next
        x[cols + 7] = 3.0e38;
        x[cols + 8] = -1.0e-30;
        x[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 1e-25); // tiny (below 2^-64 in places)
        x[3 * cols + 99] = f32::NAN;
        x[4 * cols + 50] = 0.5;
        let mut want = vec![0.0; n * rows];
        kernels::matmul(&m, &x, n, &mut want);
        let xb = upload_f32(ctx, "x", &x).unwrap();
        let yb = zeros(ctx, n * rows);
        let mut rec = Recorder::new(ctx);
        ops::matmul(&mut rec, &gm, &xb, 0, n, &yb, 0, rows).unwrap();
        block_on(rec.submit()).unwrap();
        let got = read(ctx, &yb, n * rows);
        assert!(want[3 * rows..4 * rows].iter().all(|v| v.is_nan()), "{dtype}: a NaN input makes its row NaN");
        assert!(got[3 * rows..4 * rows].iter().all(|v| v.is_nan()), "{dtype}: GPU row with NaN input");
        let keep = |v: &[f32]| -> Vec<f32> { v.iter().map(|f| if f.is_nan() { 0.0 } else { *f }).collect() };
        assert_bits(&format!("qmatmul {dtype} edge activations (dp4a {})", ctx.dp4a()), &keep(&got), &keep(&want));
    }
}

/// MXFP4 weights (gpt_oss's experts) against qdot::mxfp4: every batch size, several
/// blocks per lane, and activations with zero, tiny, huge and NaN blocks.
#[test]
fn mxfp4_matmul_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    for (rows, cols) in [(37usize, 32usize), (9, 320), (21, 96)] {
        check_matmul(&ctx, rows, cols, DType::Mxfp4, &[1, 3, 8, 11, 17], 40 + cols as u64);
    }
    let (rows, cols, n) = (19, 128, 5);
    let mut rng = Lcg(78);
    let m = random_mat(rows, cols, DType::Mxfp4, &mut rng);
    let gm = upload_mat(&ctx, "w", &m).unwrap();
    let mut x = rng.vec(n * cols, 2.0);
    x[..40].iter_mut().for_each(|v| *v = 0.0); // position 0: one zero block, part of the next
    x[cols + 7] = 3.0e38;
    x[cols + 8] = -1.0e-30;
    x[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 1e-25); // tiny (below 2^-64 in places)
    x[3 * cols + 99] = f32::NAN;
    x[4 * cols + 50] = 0.5;
    let mut want = vec![0.0; n * rows];
    kernels::matmul(&m, &x, n, &mut want);
    let xb = upload_f32(&ctx, "x", &x).unwrap();
    let yb = zeros(&ctx, n * rows);
    let mut rec = Recorder::new(&ctx);
    ops::matmul(&mut rec, &gm, &xb, 0, n, &yb, 0, rows).unwrap();
    block_on(rec.submit()).unwrap();
    let got = read(&ctx, &yb, n * rows);
    assert!(want[3 * rows..4 * rows].iter().all(|v| v.is_nan()), "a NaN input makes its row NaN");
    assert!(got[3 * rows..4 * rows].iter().all(|v| v.is_nan()), "GPU row with NaN input");
    let keep = |v: &[f32]| -> Vec<f32> { v.iter().map(|f| if f.is_nan() { 0.0 } else { *f }).collect() };
    assert_bits("mxfp4 edge activations", &keep(&got), &keep(&want));
}

#[test]
fn matmul_split_into_row_blocks() {
    let Some(_) = gpu() else { return };
    let mut ctx = GpuContext::new_blocking().unwrap();
    ctx.set_binding_cap(1024); // 10 rows of 24 f32 per block
    for dt in [DType::F32, DType::F16, DType::Int4 { group: 8 }, DType::Int8 { group: 8 }] {
        check_matmul(&ctx, 53, 24, dt, &[1, 4], 3);
    }
    let gm = upload_mat(&ctx, "w", &random_mat(53, 24, DType::F32, &mut Lcg(3))).unwrap();
    assert!(gm.parts.len() > 4, "expected several row blocks, got {}", gm.parts.len());
}

#[test]
fn embedding_lookup_is_exact() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(5);
    for dt in DTYPES {
        let m = random_mat(41, 19, dt, &mut rng);
        let gm = upload_mat(&ctx, "embed", &m).unwrap();
        let ids: Vec<u32> = vec![0, 40, 7, 7, 13];
        let mut want = vec![0.0; ids.len() * 19];
        for (i, &id) in ids.iter().enumerate() {
            m.row_into(id as usize, &mut want[i * 19..(i + 1) * 19]);
        }
        let x = zeros(&ctx, want.len());
        let mut rec = Recorder::new(&ctx);
        let idb = rec.data(&ids);
        ops::embed(&mut rec, &gm, idb, ids.len(), &x).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("embed {dt}"), &read(&ctx, &x, want.len()), &want);
    }
}

#[test]
fn rmsnorm_matches_cpu_over_wide_ranges() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(9);
    for (width, scale) in [(88usize, 1.0f32), (20, 1e-17), (96, 3e15), (7, 0.3), (1000, 12.0)] {
        let rows = 6;
        let x: Vec<f32> = rng.vec(rows * width, scale);
        let w: Vec<f32> = (0..width).map(|_| 1.0 + 0.3 * rng.next()).collect();
        let mut want = vec![0.0; rows * width];
        for r in 0..rows {
            kernels::rmsnorm(&x[r * width..(r + 1) * width], &w, 1e-6, &mut want[r * width..(r + 1) * width]);
        }
        let xb = upload_f32(&ctx, "x", &x).unwrap();
        let wb = upload_f32(&ctx, "w", &w).unwrap();
        let mut rec = Recorder::new(&ctx);
        ops::rmsnorm(&mut rec, &xb, 0, rows, width, &wb, 1e-6).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("rmsnorm width {width} scale {scale:e}"), &read(&ctx, &xb, x.len()), &want);
    }
}

#[test]
fn rope_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(11);
    let cfgs = [
        serde_json::json!({"rope_theta": 1e6}),
        serde_json::json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}}),
        serde_json::json!({"partial_rotary_factor": 0.5}),
    ];
    for cfg in cfgs {
        let (hd, heads, n, pos0) = (24, 3, 5, 40);
        let rope = Rope::new(&RopeConfig::from_config(&cfg, hd, 4096).unwrap());
        let x = rng.vec(n * heads * hd, 2.0);
        let mut want = x.clone();
        let mut cs = Vec::new();
        let (mut c, mut s) = (vec![], vec![]);
        for i in 0..n {
            rope.cos_sin(pos0 + i, &mut c, &mut s);
            rope.apply(&mut want[i * heads * hd..(i + 1) * heads * hd], hd, &c, &s);
            cs.extend_from_slice(&c);
            cs.extend_from_slice(&s);
        }
        let xb = upload_f32(&ctx, "x", &x).unwrap();
        let mut rec = Recorder::new(&ctx);
        let csb = rec.data_f32(&cs);
        ops::rope(&mut rec, &xb, n, heads, hd, rope.rotary_dim / 2, csb).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("rope {cfg}"), &read(&ctx, &xb, x.len()), &want);
    }
}

/// attention::attention after the projections, written out as the CPU runs it.
fn attention_ref(s: AttnShape, q: &[f32], kc: &[f32], vc: &[f32], sinks: Option<&[f32]>) -> Vec<f32> {
    let (hd, qd, kvd) = (s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let group = s.n_heads / s.n_kv_heads;
    let mut out = vec![0.0f32; s.n * qd];
    for i in 0..s.n {
        for h in 0..s.n_heads {
            let p = s.pos0 + i;
            let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
            let kvh = h / group;
            let qh = &q[i * qd + h * hd..i * qd + (h + 1) * hd];
            let mut scores: Vec<f32> =
                (lo..=p).map(|j| math::dot(qh, &kc[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd]) * s.scale).collect();
            match sinks {
                Some(sk) => math::softmax_with_sink(&mut scores, sk[h]),
                None => math::softmax(&mut scores),
            }
            let dst = &mut out[i * qd + h * hd..i * qd + (h + 1) * hd];
            for (sc, j) in scores.iter().zip(lo..=p) {
                for (d, vv) in dst.iter_mut().zip(&vc[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd]) {
                    *d += sc * vv;
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_cpu_with_gqa_and_window() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(13);
    for (n, pos0, window, heads, kv_heads, hd, with_sinks) in [
        (1, 0, None, 4, 2, 22, false),
        (7, 0, None, 6, 3, 12, false),
        (1, 90, Some(24), 4, 2, 22, false),
        (5, 100, None, 5, 1, 16, false),
        (3, 70, Some(5), 4, 4, 8, false),
        // gpt_oss: sink logits, on a windowed and a full layer.
        (9, 0, Some(7), 6, 2, 14, true),
        (2, 40, None, 6, 2, 14, true),
    ] {
        let s = AttnShape {
            n,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: hd,
            pos0,
            window,
            scale: (hd as f32).powf(-0.5),
            mla: None,
            row: None,
        };
        let total = pos0 + n;
        let q = rng.vec(n * heads * hd, 3.0);
        let kc = rng.vec(total * kv_heads * hd, 3.0);
        let vc = rng.vec(total * kv_heads * hd, 1.0);
        // Sinks from far below to far above the scores.
        let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 4.0 - 8.0).collect();
        let sinks = with_sinks.then_some(&sinks[..]);
        let want = attention_ref(s, &q, &kc, &vc, sinks);
        let sink_buf = sinks.map(|v| upload_f32(&ctx, "sinks", v).unwrap());
        let (qb, kb, vb) = (
            upload_f32(&ctx, "q", &q).unwrap(),
            upload_f32(&ctx, "k", &kc).unwrap(),
            upload_f32(&ctx, "v", &vc).unwrap(),
        );
        let scores = zeros(&ctx, n * heads * total);
        let out = zeros(&ctx, want.len());
        let mut rec = Recorder::new(&ctx);
        ops::attention(&mut rec, s, &qb, &kb, &vb, &scores, &out, sink_buf.as_ref(), None).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("attention {s:?}"), &read(&ctx, &out, want.len()), &want);
    }
}

#[test]
fn swiglu_gate_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(17);
    // Wide range: exp under/overflow edges, large |x|, tiny x.
    let mut g: Vec<f32> = rng.vec(5000, 30.0);
    g.extend([0.0, -0.0, 88.0, -88.0, 90.0, -90.0, 1e-30, -1e-30, 200.0, -200.0, 87.33, -87.34]);
    let mut u: Vec<f32> = rng.vec(g.len(), 2.0);
    u[..40].iter_mut().for_each(|v| *v *= 3.0); // beyond the clamp limit
    for act in [Activation::Silu, Activation::ClampedSwiglu { alpha: 1.702, limit: 2.0 }] {
        let want: Vec<f32> = g.iter().zip(&u).map(|(g, u)| act.apply(*g, *u)).collect();
        let (gb, ub) = (upload_f32(&ctx, "g", &g).unwrap(), upload_f32(&ctx, "u", &u).unwrap());
        let mut rec = Recorder::new(&ctx);
        ops::swiglu(&mut rec, &gb, &ub, g.len(), act).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("swiglu {act:?}"), &read(&ctx, &gb, g.len()), &want);
    }
}

#[test]
fn elementwise_kernels_match_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(19);
    let (n, h) = (6, 33);
    let x = rng.vec(n * h, 4.0);
    let b = rng.vec(h, 1.0);
    // add with broadcast (bias) and without (residual)
    let xb = upload_f32(&ctx, "x", &x).unwrap();
    let bb = upload_f32(&ctx, "b", &b).unwrap();
    let rb = upload_f32(&ctx, "r", &x).unwrap();
    let mut rec = Recorder::new(&ctx);
    ops::add(&mut rec, &xb, 0, &bb, 0, n * h, h).unwrap();
    ops::add(&mut rec, &xb, 0, &rb, 0, n * h, n * h).unwrap();
    ops::clamp(&mut rec, &xb, n * h, 1.75).unwrap();
    block_on(rec.submit()).unwrap();
    let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| ((v + b[i % h]) + v).clamp(-1.75, 1.75)).collect();
    assert_bits("add + clamp", &read(&ctx, &xb, n * h), &want);

    // moe_accumulate: two experts' outputs added in order with routing weights
    let y1 = rng.vec(3 * h, 2.0);
    let y2 = rng.vec(2 * h, 2.0);
    let r1 = [(4usize, 0.6f32), (0, 0.3), (5, 0.25)];
    let r2 = [(0usize, 0.7f32), (4, 0.4)];
    let mut want = rng.vec(n * h, 1.0);
    let out = upload_f32(&ctx, "out", &want).unwrap();
    for (y, r) in [(&y1, &r1[..]), (&y2, &r2[..])] {
        for (i, (p, w)) in r.iter().enumerate() {
            for d in 0..h {
                want[p * h + d] += y[i * h + d] * w;
            }
        }
    }
    let (y1b, y2b) = (upload_f32(&ctx, "y1", &y1).unwrap(), upload_f32(&ctx, "y2", &y2).unwrap());
    // gated_add: shared expert with sigmoid gate
    let s = rng.vec(n * h, 2.0);
    let gl: Vec<f32> = rng.vec(n, 6.0);
    for p in 0..n {
        let k = math::sigmoid(gl[p]);
        for d in 0..h {
            want[p * h + d] += k * s[p * h + d];
        }
    }
    let (sb, gb) = (upload_f32(&ctx, "s", &s).unwrap(), upload_f32(&ctx, "g", &gl).unwrap());
    let mut rec = Recorder::new(&ctx);
    ops::moe_accumulate(&mut rec, &out, &y1b, &r1, h).unwrap();
    ops::moe_accumulate(&mut rec, &out, &y2b, &r2, h).unwrap();
    ops::gated_add(&mut rec, &out, &sb, &gb, n, h).unwrap();
    block_on(rec.submit()).unwrap();
    assert_bits("moe_accumulate + gated_add", &read(&ctx, &out, n * h), &want);
}

#[test]
fn route_matches_moe_route() {
    use colibri_engine::model::config::{RouterConfig, Scoring};
    use colibri_engine::model::moe::route;
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(23);
    // (experts, top_k, renormalise, logit scale, scoring, groups, kept groups, scaling, bias)
    let cases = [
        (7usize, 2usize, true, 3.0f32, Scoring::Softmax, 1usize, 1usize, 1.0f32, false),
        (64, 8, false, 12.0, Scoring::Softmax, 1, 1, 1.0, false),
        (128, 8, true, 0.5, Scoring::Softmax, 1, 1, 1.0, false),
        (16, 16, true, 40.0, Scoring::Softmax, 1, 1, 1.0, false),
        (60, 4, false, 200.0, Scoring::Softmax, 1, 1, 1.0, false),
        // glm4_moe / deepseek_v3: sigmoid scores, correction bias, groups, scaling.
        (12, 3, true, 3.0, Scoring::Sigmoid, 1, 1, 1.8, true),
        (64, 8, true, 4.0, Scoring::Sigmoid, 8, 4, 2.5, true),
        (32, 6, false, 2.0, Scoring::Sigmoid, 4, 2, 1.0, true),
        (24, 4, true, 6.0, Scoring::Sigmoid, 8, 3, 1.0, false),
        (9, 2, true, 1.0, Scoring::Sigmoid, 9, 4, 1.0, true),
        // gpt_oss: top-k of the logits, softmax over the chosen.
        (8, 3, false, 5.0, Scoring::SoftmaxOfTopk, 1, 1, 1.0, false),
        // (Not so wide that a weight falls below 2^-126: arith.wgsl flushes subnormals.)
        (32, 4, false, 40.0, Scoring::SoftmaxOfTopk, 1, 1, 1.0, false),
    ];
    for (ne, k, norm, scale, scoring, n_group, topk_group, rsf, has_bias) in cases {
        let n = 37;
        let mut logits = rng.vec(n * ne, scale);
        // Exact ties (ties go to the lower index), a row of equal logits, and a row whose
        // softmax underflows to zero for all but one expert.
        logits[ne + 3] = logits[ne + 1];
        logits[2 * ne..3 * ne].iter_mut().for_each(|v| *v = 0.25);
        logits[3 * ne] = 150.0;
        let cfg = RouterConfig {
            scoring,
            n_group,
            topk_group,
            routed_scaling_factor: rsf,
            correction_bias: has_bias,
            ..RouterConfig::softmax(ne, k, norm)
        };
        let bias = rng.vec(ne, 0.2);
        let bias_buf = upload_f32(&ctx, "bias", &bias).unwrap();
        let lb = upload_f32(&ctx, "logits", &logits).unwrap();
        let (probs, out) = (zeros(&ctx, n * ne), zeros(&ctx, n * k * 2));
        let mut rec = Recorder::new(&ctx);
        ops::route(&mut rec, &lb, &probs, &out, n, &cfg, has_bias.then_some(&bias_buf)).unwrap();
        rec.read(&out, 0, (n * k * 2) as u64 * 4);
        let got = ops::routes_from(&block_on(rec.submit()).unwrap()[0], k);
        assert_eq!(got.len(), n);
        let what = format!("{ne}x top{k} {scoring:?} groups {topk_group}/{n_group}");
        for (p, g) in got.iter().enumerate() {
            let want = route(&logits[p * ne..(p + 1) * ne], &cfg, has_bias.then_some(&bias[..]));
            assert_eq!(g.experts, want.experts, "experts {what}, position {p}");
            assert_bits(&format!("weights {what}, position {p}"), &g.weights, &want.weights);
        }
    }
}
