//! What DeepSeek Sparse Attention saves: one decode step's attention (indexer included) at
//! DeepSeek-V3.2's attention sizes, over a cache of N positions, sparse (index_topk 2048)
//! against the same layer dense. A benchmark, not a test: `tools/bench_dsa.sh` runs it in
//! release and prints one JSON line per context length.

use crate::model::attention::{AttnOpts, LayerCache};
use crate::model::config::DsaConfig;
use crate::model::config::{MlaConfig, QkNorm};
use crate::model::cpu::CpuOps;
use crate::model::dsa::IndexerWeights;
use crate::model::mla::{MlaWeights, QueryProj};
use crate::model::rope::{Rope, RopeConfig};
use crate::tensor::Mat;

fn rand(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn mat(rows: usize, cols: usize, seed: u64) -> Mat {
    let scale = (cols as f32).powf(-0.5);
    Mat::from_f32(rows, cols, &rand(rows * cols, seed).iter().map(|v| v * scale).collect::<Vec<_>>()).unwrap()
}

#[test]
#[ignore = "a benchmark: tools/bench_dsa.sh"]
fn decode_attention_by_context() {
    let contexts: Vec<usize> = std::env::var("DSA_CONTEXTS")
        .unwrap_or_else(|_| "1024,8192,32768".into())
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    let (hidden, nh, rq, r, dn, dr, dv) = (1024, 128, 1536, 512, 128, 64, 128);
    let (hi, di, topk) = (64, 128, 2048);
    let dsa = DsaConfig { topk, n_heads: hi, head_dim: di, interleave: false, full: vec![true] };
    let kv_b = mat(nh * (dn + dv), r, 5);
    let weights = |indexer: bool| MlaWeights {
        q: QueryProj::LowRank { a: mat(rq, hidden, 1), norm: vec![1.0; rq], b: mat(nh * (dn + dr), rq, 2) },
        kv_a: mat(r + dr, hidden, 3),
        kv_norm: vec![1.0; r],
        uv: (0..nh).map(|h| kv_b.row_block(h * (dn + dv) + dn, dv).unwrap()).collect(),
        kv_b: kv_b.clone(),
        wo: mat(hidden, nh * dv, 4),
        indexer: indexer.then(|| {
            Box::new(IndexerWeights {
                wq_b: mat(hi * di, rq, 6),
                wk: mat(di, hidden, 7),
                k_norm: vec![1.0; di],
                k_bias: vec![0.0; di],
                weights_proj: mat(hi, hidden, 8),
            })
        }),
    };
    let rope = Rope::new(&RopeConfig::from_config(&serde_json::json!({}), dr, 1 << 20).unwrap());
    let x = rand(hidden, 9);
    for &n_ctx in &contexts {
        let mut line = serde_json::json!({"context": n_ctx, "index_topk": topk, "threads": crate::kernels::threads()});
        for sparse in [true, false] {
            let m = MlaConfig {
                q_lora_rank: Some(rq),
                kv_lora_rank: r,
                qk_nope_head_dim: dn,
                qk_rope_head_dim: dr,
                v_head_dim: dv,
                rope_interleave: true,
                dsa: sparse.then(|| dsa.clone()),
            };
            let o = AttnOpts {
                n_heads: nh,
                n_kv_heads: nh,
                head_dim: dn + dr,
                qk_norm: QkNorm::None,
                clip_qkv: None,
                window: None,
                scale: ((dn + dr) as f32).powf(-0.5),
                rms_eps: 1e-6,
                mla: Some(m.clone()),
                output_gate: false,
            };
            let w = weights(sparse);
            // A cache of n_ctx random rows: latent, then [rotary key, indexer key].
            let vw = m.cache_width_at(0) - r;
            let mut cache = LayerCache::default();
            cache.append(&rand(n_ctx * r, 10), &rand(n_ctx * vw, 11), r, vw);
            let mut best = f64::MAX;
            for _ in 0..3 {
                let mut c = cache.clone();
                let mut ops = CpuOps::for_positions(&rope, n_ctx, 1, std::slice::from_mut(&mut c));
                let mut out = vec![0.0f32; hidden];
                let t = std::time::Instant::now();
                let pass = crate::model::graph::mla(&mut ops, 0, &w, &o, &x, 1, &mut out);
                crate::model::graph::run_ready(pass).unwrap().unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            line[if sparse { "sparse_ms" } else { "dense_ms" }] = serde_json::json!(best * 1e3);
        }
        let ratio = line["dense_ms"].as_f64().unwrap() / line["sparse_ms"].as_f64().unwrap();
        line["dense_over_sparse"] = serde_json::json!(ratio);
        println!("{line}");
    }
}
