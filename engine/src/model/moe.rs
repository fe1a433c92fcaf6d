//! Mixture-of-Experts: the one routing function every family goes through, and the MoE
//! block that runs each selected expert once for all positions routed to it. The experts
//! come from an [`ExpertSource`] (crate::experts): resident, cached or streamed.

use crate::error::Result;
use std::sync::Arc;

use crate::experts::{Expert, ExpertSource};
use crate::kernels::{matmul, swiglu_many, FfnJob};
use crate::math;
use crate::model::config::RouterConfig;
use crate::tensor::Mat;

/// The experts chosen for one position and their mixing weights, best first.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Routes one position from its router logits, as transformers does for these families:
/// softmax over all experts (float32), the top-k probabilities (ties go to the lower
/// expert index), optionally renormalised to sum to one.
pub fn route(logits: &[f32], cfg: &RouterConfig) -> Routing {
    let mut probs = logits.to_vec();
    math::softmax(&mut probs);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    // NaN sorts last; equal values keep ascending index order (stable sort).
    order
        .sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap_or_else(|| probs[a].is_nan().cmp(&probs[b].is_nan())));
    order.truncate(cfg.top_k);
    let mut weights: Vec<f32> = order.iter().map(|&e| probs[e]).collect();
    if cfg.norm_topk_prob {
        let sum: f32 = weights.iter().sum();
        for w in &mut weights {
            *w /= sum;
        }
    }
    Routing { experts: order, weights }
}

/// Router, routed experts, and the optional shared expert with its sigmoid gate.
pub struct MoeBlock {
    /// (n_experts, hidden)
    pub router: Mat,
    pub cfg: RouterConfig,
    /// Always-on expert added to the routed mix, scaled by sigmoid(shared_gate x).
    pub shared: Option<(Expert, Mat)>,
}

impl MoeBlock {
    /// Router lookahead: the experts this block's router picks for `x` ([n, hidden]),
    /// ascending. For several positions, the `top_k` experts most positions pick (ties to
    /// the lower index), so a prefetch stays bounded however long the prompt.
    pub fn predict(&self, x: &[f32], n: usize) -> Vec<usize> {
        let ne = self.router.rows;
        let mut logits = vec![0.0f32; n * ne];
        matmul(&self.router, x, n, &mut logits);
        let mut votes = vec![0usize; ne];
        for l in logits.chunks_exact(ne) {
            for e in route(l, &self.cfg).experts {
                votes[e] += 1;
            }
        }
        let mut order: Vec<usize> = (0..ne).filter(|&e| votes[e] > 0).collect();
        order.sort_by(|&a, &b| votes[b].cmp(&votes[a]).then(a.cmp(&b)));
        order.truncate(self.cfg.top_k.max(1));
        order.sort_unstable();
        order
    }
}

/// Counts of expert use, per layer (for placement statistics).
pub type UsageHook<'a> = &'a mut dyn FnMut(usize, usize);

impl MoeBlock {
    /// `out = sum over selected experts (ascending expert index) of w * expert(x)`, plus the
    /// gated shared expert, for `n` positions of `x` ([n, hidden]).
    pub fn forward(
        &self,
        layer: usize,
        experts: &dyn ExpertSource,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        on_use: Option<UsageHook<'_>>,
    ) -> Result<()> {
        let hidden = self.router.cols;
        let n_exp = self.router.rows;
        let mut logits = vec![0.0f32; n * n_exp];
        matmul(&self.router, x, n, &mut logits);
        let routes: Vec<Routing> = logits.chunks_exact(n_exp).map(|l| route(l, &self.cfg)).collect();

        // Batch-union: expert -> the (position, weight) pairs routed to it.
        let mut users: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_exp];
        for (p, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                users[e].push((p, w));
            }
        }
        out[..n * hidden].iter_mut().for_each(|v| *v = 0.0);
        let used: Vec<usize> = (0..n_exp).filter(|&e| !users[e].is_empty()).collect();
        experts.prepare(layer, &used)?;
        let mut on_use = on_use;
        for &e in &used {
            if let Some(hook) = on_use.as_mut() {
                hook(e, users[e].len());
            }
            experts.note_use(layer, e, users[e].len());
        }
        let gather = |list: &[(usize, f32)]| {
            let mut xs = vec![0.0f32; list.len() * hidden];
            for (j, (p, _)) in list.iter().enumerate() {
                xs[j * hidden..(j + 1) * hidden].copy_from_slice(&x[p * hidden..(p + 1) * hidden]);
            }
            xs
        };
        // The experts whose bytes are here now, and the shared expert, run together (two
        // parallel regions for the whole layer); the others in whatever order their reads
        // complete. The outputs are summed in ascending expert order, so the bits never
        // depend on which read finished first.
        let mut done: Vec<Option<Vec<f32>>> = vec![None; used.len()];
        let ready: Vec<usize> = (0..used.len()).filter(|&i| experts.ready(layer, used[i])).collect();
        let arcs: Vec<Arc<Expert>> = ready.iter().map(|&i| experts.expert(layer, used[i])).collect::<Result<_>>()?;
        let xs: Vec<Vec<f32>> = ready.iter().map(|&i| gather(&users[used[i]])).collect();
        let mut jobs: Vec<FfnJob> = arcs
            .iter()
            .zip(&xs)
            .map(|(e, xe)| FfnJob { gate: &e.gate, up: &e.up, down: &e.down, x: xe, n: xe.len() / hidden })
            .collect();
        let mut ys: Vec<Vec<f32>> = xs.iter().map(|xe| vec![0.0f32; xe.len()]).collect();
        if let Some((shared, _)) = &self.shared {
            jobs.push(FfnJob { gate: &shared.gate, up: &shared.up, down: &shared.down, x, n });
            ys.push(vec![0.0f32; n * hidden]);
        }
        {
            let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|v| v.as_mut_slice()).collect();
            swiglu_many(&jobs, &mut outs);
        }
        let shared_out = if self.shared.is_some() { ys.pop() } else { None };
        for (&i, y) in ready.iter().zip(ys) {
            done[i] = Some(y);
        }
        let mut pending: Vec<usize> = (0..used.len()).filter(|&i| done[i].is_none()).collect();
        let mut next = 0;
        loop {
            while let Some(ys) = done.get_mut(next).and_then(Option::take) {
                for (j, (p, w)) in users[used[next]].iter().enumerate() {
                    let dst = &mut out[p * hidden..(p + 1) * hidden];
                    for (d, y) in dst.iter_mut().zip(&ys[j * hidden..(j + 1) * hidden]) {
                        *d += y * w;
                    }
                }
                next += 1;
            }
            if pending.is_empty() {
                break;
            }
            let pick = pending.iter().position(|&i| experts.ready(layer, used[i])).unwrap_or(0);
            let i = pending.remove(pick);
            let list = &users[used[i]];
            let expert = experts.expert(layer, used[i])?;
            let xs = gather(list);
            let mut ys = vec![0.0f32; xs.len()];
            expert.forward(&xs, list.len(), &mut ys);
            done[i] = Some(ys);
        }
        if let (Some((_, gate)), Some(s)) = (&self.shared, shared_out) {
            let mut g = vec![0.0f32; n];
            matmul(gate, x, n, &mut g);
            for p in 0..n {
                let k = math::sigmoid(g[p]);
                for (d, v) in out[p * hidden..(p + 1) * hidden].iter_mut().zip(&s[p * hidden..(p + 1) * hidden]) {
                    *d += k * v;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::experts::ResidentExperts;

    fn cfg(top_k: usize, norm: bool) -> RouterConfig {
        RouterConfig { n_experts: 0, top_k, norm_topk_prob: norm }
    }

    #[test]
    fn top_k_with_and_without_renormalisation() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 0.0];
        let r = route(&logits, &cfg(2, false));
        assert_eq!(r.experts, vec![1, 3]);
        let z: f64 = logits.iter().map(|v| (*v as f64).exp()).sum();
        assert!((r.weights[0] as f64 - 2f64.exp() / z).abs() < 1e-6);
        assert!((r.weights[1] as f64 - 1.5f64.exp() / z).abs() < 1e-6);
        let r = route(&logits, &cfg(2, true));
        let s = 2f64.exp() + 1.5f64.exp();
        assert!((r.weights[0] as f64 - 2f64.exp() / s).abs() < 1e-6);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let r = route(&[1.0, 3.0, 3.0, 3.0, 0.0], &cfg(2, false));
        assert_eq!(r.experts, vec![1, 2]);
        let r = route(&[0.0; 8], &cfg(3, true));
        assert_eq!(r.experts, vec![0, 1, 2]);
        assert!(r.weights.iter().all(|w| (*w - 1.0 / 3.0).abs() < 1e-7));
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let r = route(&[1e30, -1e30, 5e29, 1e30], &cfg(2, true));
        assert_eq!(r.experts, vec![0, 3]);
        assert_eq!(r.weights, vec![0.5, 0.5]);
        let r = route(&[f32::NAN, 1.0, 2.0], &cfg(1, false));
        assert_eq!(r.experts.len(), 1);
    }

    fn mat(rows: usize, cols: usize, seed: u64) -> Mat {
        let mut s = seed;
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Mat::from_f32(rows, cols, &v).unwrap()
    }

    #[test]
    fn block_equals_per_position_reference_and_unions_experts() {
        let (h, inter, ne) = (6, 5, 4);
        let experts = ResidentExperts {
            layers: vec![(0..ne as u64)
                .map(|e| {
                    Arc::new(Expert {
                        gate: mat(inter, h, e * 3 + 1),
                        up: mat(inter, h, e * 3 + 2),
                        down: mat(h, inter, e * 3 + 3),
                    })
                })
                .collect()],
        };
        let block = MoeBlock {
            router: mat(ne, h, 99),
            cfg: RouterConfig { n_experts: ne, top_k: 2, norm_topk_prob: true },
            shared: Some((Expert { gate: mat(3, h, 50), up: mat(3, h, 51), down: mat(h, 3, 52) }, mat(1, h, 53))),
        };
        let n = 7;
        let x: Vec<f32> = (0..n * h).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect();
        let mut out = vec![0.0; n * h];
        let mut uses = 0usize;
        block.forward(0, &experts, &x, n, &mut out, Some(&mut |_, c| uses += c)).unwrap();
        assert_eq!(uses, n * 2);
        for p in 0..n {
            let xp = &x[p * h..(p + 1) * h];
            let mut one = vec![0.0; h];
            block.forward(0, &experts, xp, 1, &mut one, None).unwrap();
            assert_eq!(one, out[p * h..(p + 1) * h].to_vec(), "position {p} differs between batch and single");
            // Plain reference in f64.
            let lg: Vec<f32> = (0..ne)
                .map(|e| {
                    let mut r = vec![0.0; h];
                    block.router.row_into(e, &mut r);
                    math::dot(&r, xp)
                })
                .collect();
            let rt = route(&lg, &block.cfg);
            let mut want = vec![0.0f64; h];
            for (&e, &w) in rt.experts.iter().zip(&rt.weights) {
                let mut y = vec![0.0; h];
                experts.expert(0, e).unwrap().forward(xp, 1, &mut y);
                for i in 0..h {
                    want[i] += (w * y[i]) as f64;
                }
            }
            let (shared, gate) = block.shared.as_ref().unwrap();
            let mut sy = vec![0.0; h];
            shared.forward(xp, 1, &mut sy);
            let mut gr = vec![0.0; h];
            gate.row_into(0, &mut gr);
            let g = 1.0 / (1.0 + (-(math::dot(&gr, xp) as f64)).exp());
            for i in 0..h {
                want[i] += g * sy[i] as f64;
                assert!((out[p * h + i] as f64 - want[i]).abs() < 1e-5, "position {p} lane {i}");
            }
        }
    }
}
