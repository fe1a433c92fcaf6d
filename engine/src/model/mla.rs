//! Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2): the MLA variant of the one
//! attention module ([`crate::model::attention`]).
//! Reference: transformers' `DeepseekV3Attention` (modeling_deepseek_v3.py, v5).
//!
//! transformers, per position (H heads; dn = qk_nope_head_dim, dr = qk_rope_head_dim,
//! dv = v_head_dim, r = kv_lora_rank):
//! ```text
//! q          = q_b(RMSNorm(q_a(x)))  or  q_proj(x)         (H, dn + dr)
//! [c, k_rot] = kv_a_proj_with_mqa(x);  c = RMSNorm(c)      (r), (dr) shared by all heads
//! q_rot, k_rot rotated (interleaved pairs if rope_interleave)
//! [k_nope_h, v_h] = kv_b(c)                                (H, dn + dv)
//! score_h(i, j) = scale * (q_nope_h(i) . k_nope_h(j) + q_rot_h(i) . k_rot(j))
//! out = o_proj(concat_h sum_j softmax_j(score_h(i, j)) v_h(j))
//! ```
//! Here the cache holds only `c` and `k_rot` (r + dr floats per position and layer: 576
//! for DeepSeek-V3) and the key/value up-projections are absorbed:
//! `q_nope_h . (W_uk_h c) = (W_uk_h^T q_nope_h) . c` and
//! `sum_j p_j (W_uv_h c_j) = W_uv_h (sum_j p_j c_j)`, where W_uk_h and W_uv_h are head h's
//! rows of kv_b. Every position's numbers depend only on that position and the cache, so a
//! prefill gives the bits of token-by-token decoding.
//!
//! The pass is written once, in the graph (`graph::mla`), for every backend; this module
//! holds the weights and the CPU's two MLA operations (`absorb`, `attend`).

use crate::error::Result;
use crate::format::tensors::TensorStore;
use crate::kernels::for_each_chunk;
use crate::math;
use crate::model::attention::{first_visible, AttendShape, LayerCache};
use crate::model::config::MlaConfig;
use crate::model::dsa::{IndexerWeights, Selection};
use crate::tensor::Mat;

/// transformers builds q_a_layernorm and kv_a_layernorm with the default epsilon, not
/// the config's `rms_norm_eps`.
pub(crate) const LATENT_NORM_EPS: f32 = 1e-6;

/// How the queries are projected.
pub enum QueryProj<M = Mat, V = Vec<f32>> {
    /// (H*(dn+dr), hidden)
    Plain(M),
    /// q_a_proj (q_lora_rank, hidden) -> RMSNorm (q_lora_rank) -> q_b_proj (H*(dn+dr), q_lora_rank)
    LowRank { a: M, norm: V, b: M },
}

/// One layer's MLA weights, as matrices `M` and vectors `V` of a backend (the CPU's
/// [`Mat`] and `Vec<f32>` as loaded, or a GPU's buffers through [`MlaWeights::try_map`]);
/// the graph (`graph::mla`) runs them on either.
pub struct MlaWeights<M = Mat, V = Vec<f32>> {
    pub q: QueryProj<M, V>,
    /// kv_a_proj_with_mqa: (r + dr, hidden)
    pub kv_a: M,
    /// kv_a_layernorm: (r)
    pub kv_norm: V,
    /// kv_b_proj: (H*(dn+dv), r); per head, dn key rows (W_uk_h) then dv value rows.
    pub kv_b: M,
    /// Per head its dv value rows of kv_b (W_uv_h, (dv, r)), views into kv_b's bytes.
    pub uv: Vec<M>,
    /// o_proj: (hidden, H*dv)
    pub wo: M,
    /// DeepSeek Sparse Attention's indexer, on the layers that run it ([`crate::model::dsa`]).
    pub indexer: Option<Box<IndexerWeights<M, V>>>,
}

impl MlaWeights {
    /// Loads `{prefix}.q_proj` or `q_a_proj`/`q_a_layernorm`/`q_b_proj`,
    /// `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj` (and layer `l`'s DSA
    /// indexer where it runs one), checking every shape.
    pub fn load(s: &TensorStore, prefix: &str, hidden: usize, n_heads: usize, m: &MlaConfig, l: usize) -> Result<Self> {
        let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
        let w = |name: &str, rows: usize, cols: usize| s.mat(&format!("{prefix}.{name}.weight"), rows, cols);
        let qd = n_heads * (dn + dr);
        let q = match m.q_lora_rank {
            None => QueryProj::Plain(w("q_proj", qd, hidden)?),
            Some(rq) => QueryProj::LowRank {
                a: w("q_a_proj", rq, hidden)?,
                norm: s.vector(&format!("{prefix}.q_a_layernorm.weight"), rq)?,
                b: w("q_b_proj", qd, rq)?,
            },
        };
        let kv_b = w("kv_b_proj", n_heads * (dn + dv), r)?;
        let uv = (0..n_heads).map(|h| kv_b.row_block(h * (dn + dv) + dn, dv)).collect::<Result<_>>()?;
        Ok(MlaWeights {
            q,
            kv_a: w("kv_a_proj_with_mqa", r + dr, hidden)?,
            kv_norm: s.vector(&format!("{prefix}.kv_a_layernorm.weight"), r)?,
            kv_b,
            uv,
            wo: w("o_proj", hidden, n_heads * dv)?,
            indexer: match (&m.dsa, m.indexer_at(l), m.q_lora_rank) {
                (Some(d), Some(true), Some(rq)) => Some(Box::new(IndexerWeights::load(s, prefix, hidden, rq, d)?)),
                _ => None,
            },
        })
    }
}

impl<M, V> MlaWeights<M, V> {
    /// The same weights in another backend's form: `m` and `v` convert one matrix and one
    /// vector, given their names (q, q_a, q_a_norm, q_b, kv_a, kv_norm, kv_b, uv{h}, wo).
    pub fn try_map<M2, V2>(
        &self,
        m: impl Fn(&str, &M) -> Result<M2>,
        v: impl Fn(&str, &V) -> Result<V2>,
    ) -> Result<MlaWeights<M2, V2>> {
        Ok(MlaWeights {
            q: match &self.q {
                QueryProj::Plain(q) => QueryProj::Plain(m("q", q)?),
                QueryProj::LowRank { a, norm, b } => {
                    QueryProj::LowRank { a: m("q_a", a)?, norm: v("q_a_norm", norm)?, b: m("q_b", b)? }
                }
            },
            kv_a: m("kv_a", &self.kv_a)?,
            kv_norm: v("kv_norm", &self.kv_norm)?,
            kv_b: m("kv_b", &self.kv_b)?,
            uv: self.uv.iter().enumerate().map(|(h, u)| m(&format!("uv{h}"), u)).collect::<Result<_>>()?,
            wo: m("wo", &self.wo)?,
            indexer: self.indexer.as_ref().map(|x| x.try_map(&m, &v).map(Box::new)).transpose()?,
        })
    }
}

/// The absorbed queries (the CPU's `Ops::mla_absorb`): `qc` (n, H, r + dr) from the
/// queries `q` (n, H, dn + dr), rotary part rotated: per head and position
/// `W_uk_h^T q_nope_h` (summed over the dn rows of W_uk_h in ascending order, from 0.0:
/// a fixed order that the GPU's mla_absorb.wgsl reproduces), then q's rotary part.
pub(crate) fn absorb(kv_b: &Mat, q: &[f32], n: usize, n_heads: usize, m: &MlaConfig, qc: &mut [f32]) {
    let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
    let (dq, w) = (dn + dr, r + dr);
    // Head-major (H, n, r) so that each head is one task.
    let mut q_lat = vec![0.0f32; n_heads * n * r];
    for_each_chunk(&mut q_lat, n * r, |h, dst| {
        let mut row = vec![0.0f32; r];
        for d in 0..dn {
            kv_b.row_into(h * (dn + dv) + d, &mut row);
            for i in 0..n {
                let qv = q[(i * n_heads + h) * dq + d];
                for (t, u) in dst[i * r..(i + 1) * r].iter_mut().zip(&row) {
                    *t += qv * u;
                }
            }
        }
    });
    for i in 0..n {
        for h in 0..n_heads {
            let at = (i * n_heads + h) * w;
            qc[at..at + r].copy_from_slice(&q_lat[(h * n + i) * r..(h * n + i + 1) * r]);
            qc[at + r..at + w].copy_from_slice(&q[(i * n_heads + h) * dq + dn..(i * n_heads + h + 1) * dq]);
        }
    }
}

/// The CPU's `Ops::attend_mla`: appends the n rows of `ckv` ([latent, rotated key] and
/// DSA's indexer key where the layer has one: `row` floats each) to `cache` (the latents
/// in `k`, the rest in `v`), then per head and position the scores of `qc`'s row against
/// the visible positions, or the selected ones (`sel`, ascending), latent and rotary dot
/// products, softmax, and the probability-weighted sum of their latents into `ctx` (H, n, r).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    cache: &mut LayerCache,
    qc: &[f32],
    ckv: &[f32],
    row: usize,
    s: AttendShape,
    m: &MlaConfig,
    sel: Option<&Selection>,
    ctx: &mut [f32],
) {
    let (n, nh, pos0) = (s.n, s.n_heads, s.pos0);
    let (dr, r) = (m.qk_rope_head_dim, m.kv_lora_rank);
    let w = r + dr;
    let mut latent = Vec::with_capacity(n * r);
    let mut rest = Vec::with_capacity(n * (row - r));
    for x in ckv[..n * row].chunks_exact(row) {
        latent.extend_from_slice(&x[..r]);
        rest.extend_from_slice(&x[r..]);
    }
    cache.append(&latent, &rest, r, row - r);
    // One task per (head, position).
    let (cl, ckr, vw) = (&cache.k, &cache.v, row - r);
    for_each_chunk(&mut ctx[..nh * n * r], r, |idx, dst| {
        let (h, i) = (idx / n, idx % n);
        let p = pos0 + i;
        let visible: Vec<usize> = match sel.and_then(|s| s.get(i)).and_then(Option::as_ref) {
            Some(kept) => kept.iter().map(|&j| j as usize).collect(),
            None => (first_visible(p, s.window)..=p).collect(),
        };
        let q = &qc[(i * nh + h) * w..(i * nh + h + 1) * w];
        let (ql, qr) = q.split_at(r);
        let mut scores: Vec<f32> = visible
            .iter()
            .map(|&j| (math::dot(ql, &cl[j * r..(j + 1) * r]) + math::dot(qr, &ckr[j * vw..j * vw + dr])) * s.scale)
            .collect();
        math::softmax(&mut scores);
        dst.fill(0.0);
        for (s, &j) in scores.iter().zip(&visible) {
            for (d, c) in dst.iter_mut().zip(&cl[j * r..(j + 1) * r]) {
                *d += s * c;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::AttnOpts;
    use crate::model::config::QkNorm;
    use crate::model::cpu::CpuOps;
    use crate::model::rope::{Rope, RopeConfig};

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
        Mat::from_f32(rows, cols, &rand(rows * cols, seed)).unwrap()
    }

    const H: usize = 3;
    const HIDDEN: usize = 14;

    fn setup(q_lora: Option<usize>, interleave: bool) -> (MlaWeights, AttnOpts, MlaConfig, Rope) {
        let m = MlaConfig {
            q_lora_rank: q_lora,
            kv_lora_rank: 7,
            qk_nope_head_dim: 5,
            qk_rope_head_dim: 4,
            v_head_dim: 6,
            rope_interleave: interleave,
            dsa: None,
        };
        let (dn, dr, dv, r) = (5, 4, 6, 7);
        let q = match q_lora {
            None => QueryProj::Plain(mat(H * (dn + dr), HIDDEN, 1)),
            Some(rq) => QueryProj::LowRank {
                a: mat(rq, HIDDEN, 2),
                norm: rand(rq, 3).iter().map(|v| 1.0 + v).collect(),
                b: mat(H * (dn + dr), rq, 4),
            },
        };
        let kv_b = mat(H * (dn + dv), r, 5);
        let w = MlaWeights {
            q,
            kv_a: mat(r + dr, HIDDEN, 6),
            kv_norm: rand(r, 7).iter().map(|v| 1.0 + v).collect(),
            uv: (0..H).map(|h| kv_b.row_block(h * (dn + dv) + dn, dv).unwrap()).collect(),
            kv_b,
            wo: mat(HIDDEN, H * dv, 8),
            indexer: None,
        };
        let o = AttnOpts {
            n_heads: H,
            n_kv_heads: H,
            head_dim: dn + dr,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            window: None,
            scale: 0.3,
            rms_eps: 1e-5,
            mla: Some(m.clone()),
            output_gate: false,
        };
        let rope = Rope::new(&RopeConfig::from_config(&serde_json::json!({}), dr, 64).unwrap());
        (w, o, m, rope)
    }

    /// The graph's MLA ([`crate::model::graph::mla`]) on the CPU backend.
    fn run(s: &(MlaWeights, AttnOpts, MlaConfig, Rope), x: &[f32], pos0: usize, cache: &mut LayerCache) -> Vec<f32> {
        let n = x.len() / HIDDEN;
        let mut ops = CpuOps::for_positions(&s.3, pos0, n, std::slice::from_mut(cache));
        let mut out = vec![0.0; n * HIDDEN];
        let x = x.to_vec();
        let pass = crate::model::graph::mla(&mut ops, 0, &s.0, &s.1, &x, n, &mut out);
        crate::model::graph::run_ready(pass).unwrap().unwrap();
        out
    }

    /// The formula of the module header, without absorption, in f64: keys and values
    /// expanded per head from the latents.
    fn reference(s: &(MlaWeights, AttnOpts, MlaConfig, Rope), x: &[f32]) -> Vec<f64> {
        let (w, o, m, rope) = s;
        let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
        let n = x.len() / HIDDEN;
        let mv = |a: &Mat, v: &[f64]| -> Vec<f64> {
            let mut row = vec![0.0; a.cols];
            (0..a.rows)
                .map(|k| {
                    a.row_into(k, &mut row);
                    row.iter().zip(v).map(|(a, b)| *a as f64 * b).sum()
                })
                .collect()
        };
        let norm = |v: &[f64], wt: &[f32]| -> Vec<f64> {
            let ms = v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64;
            v.iter().zip(wt).map(|(a, w)| a / (ms + 1e-6).sqrt() * *w as f64).collect()
        };
        // Rotation of interleaved or half-split pairs, in f64.
        let rot = |v: &[f64], p: usize| -> Vec<f64> {
            let half = dr / 2;
            let pair = |i: usize| if m.rope_interleave { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let mut outv = vec![0.0; dr];
            for i in 0..half {
                let th = p as f64 * rope.inv_freq[i] as f64;
                let (a, b) = pair(i);
                // Output in the de-interleaved order, as transformers returns it.
                outv[i] = v[a] * th.cos() - v[b] * th.sin();
                outv[i + half] = v[b] * th.cos() + v[a] * th.sin();
            }
            outv
        };
        let (mut qs, mut keys, mut vals) = (vec![], vec![], vec![]);
        for i in 0..n {
            let xi: Vec<f64> = x[i * HIDDEN..(i + 1) * HIDDEN].iter().map(|v| *v as f64).collect();
            let q = match &w.q {
                QueryProj::Plain(wq) => mv(wq, &xi),
                QueryProj::LowRank { a, norm: nw, b } => mv(b, &norm(&mv(a, &xi), nw)),
            };
            let ckv = mv(&w.kv_a, &xi);
            let c = norm(&ckv[..r], &w.kv_norm);
            let kr = rot(&ckv[r..], i);
            let kv = mv(&w.kv_b, &c);
            let (mut qh, mut kh, mut vh) = (vec![], vec![], vec![]);
            for h in 0..H {
                let qq = &q[h * (dn + dr)..(h + 1) * (dn + dr)];
                qh.push([qq[..dn].to_vec(), rot(&qq[dn..], i)].concat());
                let kvh = &kv[h * (dn + dv)..(h + 1) * (dn + dv)];
                kh.push([kvh[..dn].to_vec(), kr.clone()].concat());
                vh.push(kvh[dn..].to_vec());
            }
            qs.push(qh);
            keys.push(kh);
            vals.push(vh);
        }
        let mut out = vec![];
        for (i, qi) in qs.iter().enumerate() {
            let mut ctx = vec![];
            for (h, qh) in qi.iter().enumerate() {
                let sc: Vec<f64> = (0..=i)
                    .map(|j| qh.iter().zip(&keys[j][h]).map(|(a, b)| a * b).sum::<f64>() * o.scale as f64)
                    .collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                ctx.extend((0..dv).map(|d| (0..=i).map(|j| e[j] / z * vals[j][h][d]).sum::<f64>()));
            }
            out.extend(mv(&w.wo, &ctx));
        }
        out
    }

    #[test]
    fn absorbed_latent_attention_matches_the_expanded_formula() {
        for (q_lora, interleave) in [(Some(6), true), (None, false), (None, true)] {
            let s = setup(q_lora, interleave);
            let n = 6;
            let x = rand(n * HIDDEN, 11).iter().map(|v| v * 4.0).collect::<Vec<_>>();
            let mut cache = LayerCache::default();
            let got = run(&s, &x, 0, &mut cache);
            let want = reference(&s, &x);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((*g as f64 - w).abs() < 1e-5 * (1.0 + w.abs()), "{q_lora:?} {interleave}: [{k}] {g} vs {w}");
            }
            // Only the latent and the rotary key are cached.
            assert_eq!(cache.k.len(), n * 7);
            assert_eq!(cache.v.len(), n * 4);
        }
    }

    #[test]
    fn prefill_equals_incremental_decode_bit_for_bit() {
        let s = setup(Some(6), true);
        let n = 7;
        let x = rand(n * HIDDEN, 12).iter().map(|v| v * 4.0).collect::<Vec<_>>();
        let mut c1 = LayerCache::default();
        let all = run(&s, &x, 0, &mut c1);
        let mut c2 = LayerCache::default();
        let mut inc = run(&s, &x[..3 * HIDDEN], 0, &mut c2);
        for i in 3..n {
            inc.extend(run(&s, &x[i * HIDDEN..(i + 1) * HIDDEN], i, &mut c2));
        }
        assert_eq!(all, inc);
        assert_eq!(c1.k, c2.k);
        assert_eq!(c1.v, c2.v);
        // A rollback keeps exactly the first positions' latents.
        c1.truncate(3);
        assert_eq!(c1.k, c2.k[..3 * 7].to_vec());
        assert_eq!(c1.v.len(), 3 * 4);
    }
}
