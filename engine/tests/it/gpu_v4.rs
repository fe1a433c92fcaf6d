//! DeepSeek-V4's kernels on the GPU against the CPU reference (engine/src/model/v4/),
//! bit for bit on lavapipe: the hyper-connection collapse and expand with odd sizes (a
//! hidden size that is not a multiple of the workgroup, 2 to 5 streams, negative zeros
//! among the inputs), the streams' weights (sigmoids, softmax and Sinkhorn-Knopp) and
//! the hyper-head's, the strided row copy, the tail RoPE, the MoE's routing (sqrtsoftplus,
//! hash layers' fixed experts) and clamped SwiGLU, the compressors fed in chunks, and the
//! indexer's choice with the attention over passes of odd sizes.
#![cfg(feature = "wgpu")]

use colibri_engine::gpu::buffers::{f32s, upload_f32};
use colibri_engine::gpu::v4;

use crate::gpu_common::{assert_bits, gpu, Lcg};
use colibri_engine::gpu::recorder::Recorder;
use colibri_engine::gpu::{block_on, GpuContext};
use colibri_engine::model::v4::hc::{expand, head_pre, mix_streams, weights};
use colibri_engine::model::v4::HcShape;

fn read(ctx: &GpuContext, buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let mut rec = Recorder::new(ctx);
    rec.read(buf, 0, len as u64 * 4);
    f32s(&block_on(rec.submit()).unwrap()[0])
}

/// Random values with some exact zeros of either sign (the sums' first add decides their sign).
fn values(rng: &mut Lcg, len: usize, scale: f32) -> Vec<f32> {
    let mut v = rng.vec(len, scale);
    for (i, x) in v.iter_mut().enumerate() {
        match i % 17 {
            3 => *x = -0.0,
            9 => *x = 0.0,
            _ => {}
        }
    }
    v
}

#[test]
fn hc_collapse_and_expand_match_the_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(33);
    for (n, n_hc, hidden) in [(1usize, 2usize, 8usize), (7, 4, 67), (3, 5, 130), (12, 3, 64)] {
        let s = HcShape { n, n_hc, hidden, iters: 20, eps: 1e-6 };
        let x = values(&mut rng, n * n_hc * hidden, 3.0);
        let pre = values(&mut rng, n * n_hc, 1.5);
        let y = values(&mut rng, n * hidden, 2.0);
        let post = values(&mut rng, n * n_hc, 2.0);
        let comb = values(&mut rng, n * n_hc * n_hc, 1.0);

        let mut want_out = vec![0.0f32; n * hidden];
        for p in 0..n {
            let xs = &x[p * n_hc * hidden..(p + 1) * n_hc * hidden];
            mix_streams(&pre[p * n_hc..(p + 1) * n_hc], xs, hidden, &mut want_out[p * hidden..(p + 1) * hidden]);
        }
        let mut want_x = x.clone();
        expand(&mut want_x, &y, &post, &comb, n, n_hc, hidden);

        let up = |name, v: &[f32]| upload_f32(&ctx, name, v).unwrap();
        let (xb, preb, yb, postb, combb) =
            (up("x", &x), up("pre", &pre), up("y", &y), up("post", &post), up("comb", &comb));
        let out = ctx.storage_buffer("out", (n * hidden) as u64 * 4).unwrap();
        let scratch = ctx.storage_buffer("scratch", x.len() as u64 * 4).unwrap();
        let mut rec = Recorder::new(&ctx);
        v4::hc_collapse(&mut rec, &preb, &xb, s, &out).unwrap();
        v4::hc_expand(&mut rec, &xb, &yb, &postb, &combb, s, &scratch).unwrap();
        block_on(rec.submit()).unwrap();
        let what = format!("n {n}, n_hc {n_hc}, hidden {hidden}");
        assert_bits(&format!("hc_collapse ({what})"), &read(&ctx, &out, n * hidden), &want_out);
        assert_bits(&format!("hc_expand ({what})"), &read(&ctx, &xb, x.len()), &want_x);
        // The expand really changed the streams (the test would pass on a no-op otherwise).
        assert_ne!(want_x, x);
    }
}

#[test]
fn hc_weights_match_the_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(35);
    // (n, N, Sinkhorn iterations, eps): the fixture's 2 streams and wider.
    for (n, n_hc, iters, eps) in
        [(5usize, 2usize, 20usize, 1e-6f32), (70, 4, 20, 1e-6), (3, 3, 1, 1e-3), (9, 5, 7, 1e-6)]
    {
        let s = HcShape { n, n_hc, hidden: 1, iters, eps };
        let m = (2 + n_hc) * n_hc;
        let mix = values(&mut rng, n * m, 4.0);
        let base = values(&mut rng, m, 1.0);
        let scale = vec![0.7f32, -1.3, 2.1];
        let (mut pre, mut post, mut comb) =
            (vec![0.0f32; n * n_hc], vec![0.0f32; n * n_hc], vec![0.0f32; n * n_hc * n_hc]);
        for p in 0..n {
            weights(
                &base,
                &scale,
                &mix[p * m..(p + 1) * m],
                n_hc,
                iters,
                eps,
                &mut pre[p * n_hc..(p + 1) * n_hc],
                &mut post[p * n_hc..(p + 1) * n_hc],
                &mut comb[p * n_hc * n_hc..(p + 1) * n_hc * n_hc],
            );
        }
        let up = |name, v: &[f32]| upload_f32(&ctx, name, v).unwrap();
        let (mixb, baseb, scaleb) = (up("mix", &mix), up("base", &base), up("scale", &scale));
        let zero = |len: usize| ctx.storage_buffer("out", len as u64 * 4).unwrap();
        let (preb, postb, combb) = (zero(pre.len()), zero(post.len()), zero(comb.len()));
        let mut rec = Recorder::new(&ctx);
        v4::hc_weights(&mut rec, &mixb, &baseb, &scaleb, s, false, &preb, &postb, &combb).unwrap();
        block_on(rec.submit()).unwrap();
        let what = format!("n {n}, n_hc {n_hc}, iters {iters}");
        assert_bits(&format!("hc pre ({what})"), &read(&ctx, &preb, pre.len()), &pre);
        assert_bits(&format!("hc post ({what})"), &read(&ctx, &postb, post.len()), &post);
        assert_bits(&format!("hc comb ({what})"), &read(&ctx, &combb, comb.len()), &comb);

        // The hyper-head: pre only, from N mixes per position.
        let hmix = values(&mut rng, n * n_hc, 4.0);
        let hbase = values(&mut rng, n_hc, 1.0);
        let mut hpre = vec![0.0f32; n * n_hc];
        for p in 0..n {
            head_pre(&hmix[p * n_hc..(p + 1) * n_hc], &hbase, 0.9, eps, &mut hpre[p * n_hc..(p + 1) * n_hc]);
        }
        let (hmixb, hbaseb, hscaleb) = (up("hmix", &hmix), up("hbase", &hbase), up("hscale", &[0.9]));
        let hpreb = zero(hpre.len());
        let mut rec = Recorder::new(&ctx);
        v4::hc_weights(&mut rec, &hmixb, &hbaseb, &hscaleb, s, true, &hpreb, &postb, &combb).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits(&format!("hc head pre ({what})"), &read(&ctx, &hpreb, hpre.len()), &hpre);
    }
}

#[test]
fn copy_rows_matches_the_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(34);
    let src = rng.vec(400, 1.0);
    // (src_at, src_stride, dst_at, dst_stride, rows, width): strided both ways, and contiguous.
    for (sa, ss, da, ds, rows, width) in [(3usize, 20usize, 1usize, 9usize, 7usize, 9usize), (5, 11, 0, 11, 30, 11)] {
        let dst0 = rng.vec(400, 1.0);
        let mut want = dst0.clone();
        for r in 0..rows {
            let (s, d) = (sa + r * ss, da + r * ds);
            want[d..d + width].copy_from_slice(&src[s..s + width]);
        }
        let (sb, db) = (upload_f32(&ctx, "src", &src).unwrap(), upload_f32(&ctx, "dst", &dst0).unwrap());
        let mut rec = Recorder::new(&ctx);
        v4::copy_rows(&mut rec, &sb, sa, ss, &db, da, ds, rows, width).unwrap();
        block_on(rec.submit()).unwrap();
        assert_bits("copy_rows", &read(&ctx, &db, 400), &want);
    }
}

#[test]
fn rope_tail_matches_the_cpu() {
    use colibri_engine::model::rope::{Rope, RopeConfig};
    use colibri_engine::model::v4::compress::rope_tail;
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(36);
    // (rotary dim, YaRN or not) over rows of 24 floats: the tail is the last 8 or all 24.
    let cfgs = [
        (8usize, serde_json::json!({"rope_theta": 10000.0})),
        (
            24,
            serde_json::json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0, "original_max_position_embeddings": 32}}),
        ),
    ];
    for (rot, cfg) in cfgs {
        let (stride, heads, n, pos0) = (24usize, 3usize, 5usize, 37usize);
        let rope = Rope::new(&RopeConfig::from_config(&cfg, rot, 4096).unwrap());
        assert_eq!(rope.rotary_dim, rot);
        for inverse in [false, true] {
            let x = rng.vec(n * heads * stride, 2.0);
            let mut want = x.clone();
            let mut cs = Vec::new();
            let (mut c, mut s) = (vec![], vec![]);
            for i in 0..n {
                for h in 0..heads {
                    let at = (i * heads + h) * stride;
                    rope_tail(&rope, &mut want[at..at + stride], pos0 + i, inverse, &mut c, &mut s);
                }
                rope.cos_sin(pos0 + i, &mut c, &mut s);
                cs.extend_from_slice(&c);
                cs.extend_from_slice(&s);
            }
            assert_ne!(want, x);
            let xb = upload_f32(&ctx, "x", &x).unwrap();
            let mut rec = Recorder::new(&ctx);
            let csb = rec.data_f32(&cs);
            v4::rope_tail(&mut rec, &xb, 0, n, heads, stride, rot / 2, inverse, csb).unwrap();
            block_on(rec.submit()).unwrap();
            assert_bits(&format!("rope_tail {cfg} inverse {inverse}"), &read(&ctx, &xb, x.len()), &want);
        }
    }
}

/// V4's routing: sqrt(softplus) scores (with and without the correction bias, with and
/// without renormalising and scaling), and the hash layers' fixed experts weighed by them.
#[test]
fn v4_route_matches_the_cpu() {
    use colibri_engine::gpu::ops;
    use colibri_engine::model::config::{RouterConfig, Scoring};
    use colibri_engine::model::moe::route_with;
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(37);
    // (experts, top_k, renormalise, logit scale, scaling, bias, hash)
    let cases = [
        (7usize, 2usize, true, 3.0f32, 1.5f32, true, false),
        (64, 6, true, 12.0, 2.5, true, false),
        (33, 4, false, 30.0, 1.0, false, false),
        (16, 3, true, 4.0, 1.5, false, true),
        (9, 9, true, 25.0, 1.0, false, true),
        (40, 5, false, 2.0, 1.0, false, true),
    ];
    for (ne, k, norm, scale, rsf, has_bias, hash) in cases {
        let n = 29;
        let mut logits = rng.vec(n * ne, scale);
        // Exact ties, a row of equal logits, both sides of softplus's threshold 20, a
        // logit whose e^x underflows.
        logits[ne + 3] = logits[ne + 1];
        logits[2 * ne..3 * ne].iter_mut().for_each(|v| *v = 0.25);
        logits[3 * ne] = 20.0;
        logits[3 * ne + 1] = 20.000002;
        logits[4 * ne] = -95.0;
        logits[4 * ne + 1] = -0.0;
        let cfg = RouterConfig {
            scoring: Scoring::SqrtSoftplus,
            routed_scaling_factor: rsf,
            correction_bias: has_bias,
            ..RouterConfig::softmax(ne, k, norm)
        };
        let bias = rng.vec(ne, 0.2);
        // Per position k distinct experts in a scrambled order (as tid2eid rows are).
        let fixed: Vec<u32> = (0..n)
            .flat_map(|p| {
                let mut e: Vec<u32> = (0..ne as u32).collect();
                for i in (1..ne).rev() {
                    e.swap(i, (p * 7 + i * 13 + rng.vec(1, 1.0)[0].to_bits() as usize) % (i + 1));
                }
                e.truncate(k);
                e
            })
            .collect();
        let bias_buf = upload_f32(&ctx, "bias", &bias).unwrap();
        let lb = upload_f32(&ctx, "logits", &logits).unwrap();
        let zeros = |len: usize| ctx.storage_buffer("zeros", len as u64 * 4).unwrap();
        let (probs, out) = (zeros(n * ne), zeros(n * k * 2));
        let mut rec = Recorder::new(&ctx);
        let fixed_bind = hash.then(|| rec.data(&fixed));
        ops::route_with(&mut rec, &lb, &probs, &out, n, &cfg, has_bias.then_some(&bias_buf), fixed_bind).unwrap();
        rec.read(&out, 0, (n * k * 2) as u64 * 4);
        let got = ops::routes_from(&block_on(rec.submit()).unwrap()[0], k);
        assert_eq!(got.len(), n);
        let what = format!("{ne}x top{k} norm {norm} scaling {rsf} bias {has_bias} hash {hash}");
        for (p, g) in got.iter().enumerate() {
            let f: Vec<usize> = fixed[p * k..(p + 1) * k].iter().map(|&e| e as usize).collect();
            let bias = has_bias.then_some(&bias[..]);
            let want = route_with(&logits[p * ne..(p + 1) * ne], &cfg, bias, hash.then_some(&f[..]));
            assert_eq!(g.experts, want.experts, "experts {what}, position {p}");
            assert_bits(&format!("weights {what}, position {p}"), &g.weights, &want.weights);
            if hash {
                assert_eq!(g.experts, f, "{what}: the hash layer's experts");
            }
        }
    }
}

/// V4's clamped SwiGLU (kernels::Activation::SiluClamped) on the GPU.
#[test]
fn v4_clamped_swiglu_matches_the_cpu() {
    use colibri_engine::gpu::ops;
    use colibri_engine::kernels::Activation;
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(38);
    let mut g = values(&mut rng, 3001, 30.0);
    g.extend([f32::NAN, 88.0, -88.0, 90.0, -90.0, 1e-30, -1e-30, 200.0, -200.0, 10.0, 10.5, -10.5]);
    let mut u = values(&mut rng, g.len(), 12.0);
    u[3001..].copy_from_slice(&[1.0, 11.0, -11.0, 10.0, -10.0, 3.0, 3.0, 1.0, 1.0, 10.0, 10.5, -10.5]);
    let act = Activation::SiluClamped { limit: 10.0 };
    let want: Vec<f32> = g.iter().zip(&u).map(|(g, u)| act.apply(*g, *u)).collect();
    // The clamps bite: above the limit, gate and up are cut.
    let plain: Vec<f32> = g.iter().zip(&u).map(|(g, u)| Activation::Silu.apply(*g, *u)).collect();
    assert!(want.iter().zip(&plain).filter(|(a, b)| a.to_bits() != b.to_bits()).count() > 100);
    let (gb, ub) = (upload_f32(&ctx, "g", &g).unwrap(), upload_f32(&ctx, "u", &u).unwrap());
    let mut rec = Recorder::new(&ctx);
    ops::swiglu(&mut rec, &gb, &ub, g.len(), act).unwrap();
    block_on(rec.submit()).unwrap();
    assert_bits("swiglu SiluClamped", &read(&ctx, &gb, g.len()), &want);
}

/// The compressors' entries (CSA's overlapping windows at rate 4, HCA-like disjoint ones
/// at rate 8 and 5, odd widths) fed in chunks of odd sizes, so windows complete inside a
/// chunk, across chunks and not at all: the GPU's entries equal the CPU's after every
/// chunk.
#[test]
fn v4_compress_matches_the_cpu() {
    use colibri_engine::gpu::v4::GpuComp;
    use colibri_engine::model::rope::{Rope, RopeConfig};
    use colibri_engine::model::v4::compress::{feed, CompShape};
    use colibri_engine::model::v4::CompState;
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(39);
    // (dim, rotary dim, rate, overlap, chunk sizes)
    let cases = [
        (24usize, 8usize, 4usize, true, vec![1usize, 3, 7, 2, 9, 1, 1, 5, 12]),
        (13 * 2, 6, 8, false, vec![5, 1, 17, 3, 8, 2, 1]),
        (70, 8, 5, false, vec![4, 1, 11, 9]),
        (10, 4, 3, true, vec![2, 2, 2, 1, 7, 1]),
    ];
    for (d, rot, rate, overlap, chunks) in cases {
        let rope = Rope::new(
            &RopeConfig::from_config(
                &serde_json::json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0, "original_max_position_embeddings": 32}}),
                rot,
                4096,
            )
            .unwrap(),
        );
        let width = if overlap { 2 * d } else { d };
        let ape = values(&mut rng, rate * width, 1.0);
        let norm = values(&mut rng, d, 1.5);
        let (apeb, normb) = (upload_f32(&ctx, "ape", &ape).unwrap(), upload_f32(&ctx, "norm", &norm).unwrap());
        let mut st = CompState::default();
        let mut gst = GpuComp::new(&ctx).unwrap();
        let mut grew = 0;
        for (i, &n) in chunks.iter().enumerate() {
            let kv = values(&mut rng, n * width, 2.0);
            let mut gate = values(&mut rng, n * width, 3.0);
            if i == 2 {
                gate[1] = 90.0; // one slot takes all the weight
            }
            let c = CompShape { n, dim: d, rate, overlap, rms_eps: 1e-6 };
            let before = st.entries.len();
            feed(c, &ape, &norm, &mut st, &kv, &gate, &rope);
            grew += usize::from(st.entries.len() > before);
            let (kb, gb) = (upload_f32(&ctx, "kv", &kv).unwrap(), upload_f32(&ctx, "gate", &gate).unwrap());
            let mut rec = Recorder::new(&ctx);
            gst.feed(&mut rec, &kb, &gb, &apeb, &normb, c, &rope).unwrap();
            block_on(rec.submit()).unwrap();
            assert_eq!(gst.count * d, st.entries.len(), "entries after chunk {i}");
            let what = format!("dim {d}, rate {rate}, overlap {overlap}, after chunk {i}");
            assert_bits(&format!("v4 compress ({what})"), &read(&ctx, &gst.entries, st.entries.len()), &st.entries);
        }
        assert!(grew >= 3, "entries were made in {grew} chunks only");
    }
}

/// A V4 layer's attention state over passes of odd sizes (prefill chunks and single
/// decode steps), for a sliding layer, an HCA-like one (entries every 8 positions, all
/// seen) and a CSA one (entries every 4, the indexer choosing 3): the indexer's choice
/// and the attention's output equal the CPU's after every pass, across several
/// compression boundaries and a sequence far longer than the window.
#[test]
fn v4_select_and_attend_match_the_cpu() {
    use colibri_engine::gpu::v4_attn::GpuV4Layer;
    use colibri_engine::model::rope::{Rope, RopeConfig};
    use colibri_engine::model::v4::attn::{attend, AttendShape};
    use colibri_engine::model::v4::compress::{feed, select, visible, CompShape};
    use colibri_engine::model::v4::{SelectShape, V4LayerState};
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(40);
    let (hd, rot, nh, window, di, hi, topk) = (24usize, 8usize, 3usize, 5usize, 16usize, 2usize, 3usize);
    let rope = Rope::new(&RopeConfig::from_config(&serde_json::json!({"rope_theta": 10000.0}), rot, 4096).unwrap());
    let irope = Rope::new(&RopeConfig::from_config(&serde_json::json!({"rope_theta": 10000.0}), 4, 4096).unwrap());
    let up = |name, v: &[f32]| upload_f32(&ctx, name, v).unwrap();
    // (rate, sparse): sliding, HCA-like, CSA.
    for (rate, sparse) in [(None, false), (Some(8usize), false), (Some(4), true)] {
        let overlap = sparse;
        let width = if overlap { 2 * hd } else { hd };
        let (ape, norm) = (values(&mut rng, 8 * width, 1.0), values(&mut rng, hd, 1.5));
        let (iape, inorm) = (values(&mut rng, 4 * 2 * di, 1.0), values(&mut rng, di, 1.5));
        let sinks = values(&mut rng, nh, 2.0);
        let (apeb, normb, iapeb, inormb, sinksb) =
            (up("ape", &ape), up("norm", &norm), up("iape", &iape), up("inorm", &inorm), up("sinks", &sinks));
        let mut st = V4LayerState::default();
        let mut gst = GpuV4Layer::new(&ctx, window, hd).unwrap();
        let mut pos0 = 0;
        let mut chose = 0;
        for (step, n) in [5usize, 1, 9, 1, 13, 2, 1, 7, 1].into_iter().enumerate() {
            let what = format!("rate {rate:?} sparse {sparse}, pass {step} at {pos0}");
            let q = values(&mut rng, n * nh * hd, 1.0);
            let kv = values(&mut rng, n * hd, 1.0);
            let mut rec = Recorder::new(&ctx);
            if let Some(r) = rate {
                let (ck, cg) = (values(&mut rng, n * width, 2.0), values(&mut rng, n * width, 3.0));
                let c = CompShape { n, dim: hd, rate: r, overlap, rms_eps: 1e-6 };
                feed(c, &ape[..r * width], &norm, &mut st.comp, &ck, &cg, &rope);
                let (ckb, cgb, apeb_r) = (up("ck", &ck), up("cg", &cg), up("ape", &ape[..r * width]));
                gst.comp.feed(&mut rec, &ckb, &cgb, &apeb_r, &normb, c, &rope).unwrap();
                let _ = &apeb;
            }
            let mut picks = None;
            let mut list = None;
            if sparse {
                let r = rate.unwrap();
                let (ik, ig) = (values(&mut rng, n * 2 * di, 2.0), values(&mut rng, n * 2 * di, 3.0));
                let c = CompShape { n, dim: di, rate: r, overlap: true, rms_eps: 1e-6 };
                feed(c, &iape, &inorm, &mut st.index, &ik, &ig, &irope);
                gst.index.feed(&mut rec, &up("ik", &ik), &up("ig", &ig), &iapeb, &inormb, c, &irope).unwrap();
                let iq = values(&mut rng, n * hi * di, 1.0);
                let iw = values(&mut rng, n * hi, 1.0);
                let total = st.index.entries.len() / di;
                let scale = (hi as f32).powf(-0.5);
                let p: Vec<Vec<usize>> = (0..n)
                    .map(|i| {
                        let w: Vec<f32> = iw[i * hi..(i + 1) * hi].iter().map(|v| v * scale).collect();
                        let vis = visible(pos0 + i, r, total);
                        select(&iq[i * hi * di..(i + 1) * hi * di], &w, &st.index.entries, vis, di, topk)
                    })
                    .collect();
                chose += p.iter().filter(|c| c.len() == topk && *c.last().unwrap() + 1 > topk).count();
                let s = SelectShape { n, pos0, heads: hi, head_dim: di, topk, rate: r };
                list = Some(gst.select(&mut rec, &up("iq", &iq), &up("iw", &iw), s).unwrap());
                picks = Some(p);
            }
            let s = AttendShape { n, pos0, heads: nh, head_dim: hd, window, rate, sparse, scale: 0.3 };
            let mut want = vec![0.0f32; n * nh * hd];
            attend(&mut st, &q, &kv, &sinks, s, picks.as_deref(), &mut want);
            let out = ctx.storage_buffer("out", want.len() as u64 * 4).unwrap();
            gst.attend(&mut rec, &up("q", &q), &up("kv", &kv), &sinksb, s, list.as_ref().map(|l| (l, topk)), &out)
                .unwrap();
            block_on(rec.submit()).unwrap();
            if let (Some(p), Some(l)) = (&picks, &list) {
                let words: Vec<u32> = read(&ctx, l, n * (topk + 1)).iter().map(|v| v.to_bits()).collect();
                for (i, want) in p.iter().enumerate() {
                    let row = &words[i * (topk + 1)..(i + 1) * (topk + 1)];
                    let got: Vec<usize> = row[1..1 + row[0] as usize].iter().map(|&e| e as usize).collect();
                    assert_eq!(&got, want, "choice of query {i}, {what}");
                }
            }
            assert_bits(&format!("v4 attend ({what})"), &read(&ctx, &out, want.len()), &want);
            assert_eq!(gst.held * hd, st.window.len(), "window kept, {what}");
            pos0 += n;
        }
        if sparse {
            assert!(chose > 10, "the indexer chose among more than top-k entries {chose} times only");
        }
    }
}

/// v4_topk.wgsl alone, on scores built to break a careless top-k: many equal scores
/// (ties go to the lower entry), zeros of both signs (equal), negatives, infinities, a
/// tie straddling the cut, and visible counts from below topk to thousands (several
/// passes of its 256 threads), against the CPU's choice (`top_entries`).
#[test]
fn v4_topk_matches_the_cpu_with_ties_and_long_contexts() {
    use colibri_engine::gpu::kernels::Kernel;
    use colibri_engine::model::v4::compress::top_entries;
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(77);
    let (rate, topk) = (4usize, 64usize);
    for keys in [10usize, 64, 65, 300, 2500] {
        // Queries at the last positions, so that they see from keys - n + 1 to keys entries.
        let n = 6usize;
        let pos0 = keys * rate - n;
        let mut scores = vec![0.0f32; n * keys];
        for (i, row) in scores.chunks_mut(keys).enumerate() {
            for (j, s) in row.iter_mut().enumerate() {
                *s = match (i, rng.bits() % 8) {
                    // Query 0: all equal but for sign of zero: the lowest topk entries.
                    (0, b) => {
                        if b % 2 == 0 {
                            0.0
                        } else {
                            -0.0
                        }
                    }
                    // Query 1: few distinct values, so that a tie straddles the cut.
                    (1, b) => (b % 3) as f32 - 1.0,
                    (_, 0) => 0.0,
                    (_, 1) => -0.0,
                    (_, 2) => 0.25,
                    (_, 3) if j % 97 == 0 => f32::INFINITY,
                    (_, 4) if j % 89 == 0 => f32::NEG_INFINITY,
                    _ => rng.next() * 3.0,
                };
            }
        }
        let sb = upload_f32(&ctx, "scores", &scores).unwrap();
        let flags = ctx.storage_buffer("flags", (n * keys) as u64 * 4).unwrap();
        let list = ctx.storage_buffer("list", (n * (topk + 1)) as u64 * 4).unwrap();
        let params = [n as u32, pos0 as u32, rate as u32, keys as u32, topk as u32, keys as u32];
        let mut rec = Recorder::new(&ctx);
        rec.dispatch(Kernel::V4Topk, &[], &params, vec![(&sb).into(), (&flags).into(), (&list).into()], n as u64)
            .unwrap();
        block_on(rec.submit()).unwrap();
        let words: Vec<u32> = read(&ctx, &list, n * (topk + 1)).iter().map(|v| v.to_bits()).collect();
        for i in 0..n {
            let vis = ((pos0 + i + 1) / rate).min(keys);
            let want = top_entries(&scores[i * keys..i * keys + vis], topk);
            let row = &words[i * (topk + 1)..(i + 1) * (topk + 1)];
            let got: Vec<usize> = row[1..1 + row[0] as usize].iter().map(|&e| e as usize).collect();
            assert_eq!(got, want, "query {i} of {keys} keys ({vis} visible)");
        }
    }
}
