//! Mixture-of-Experts: the one routing function every family goes through, and the MoE
//! block that runs each selected expert once for all positions routed to it. The experts
//! come from an [`ExpertSource`] (crate::experts): resident, cached or streamed.

use crate::error::{Error, Result};
use std::borrow::Cow;
use std::sync::Arc;

use crate::experts::{Expert, ExpertSource};
use crate::kernels::{matmul, swiglu_many, Activation, FfnBias, FfnJob};
use crate::math;
use crate::model::config::{RouterConfig, Scoring};
use crate::tensor::Mat;

/// The experts chosen for one position and their mixing weights, best first.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// The `k` best of `candidates` by `score`, best first: NaN last, equal scores in the
/// order of `candidates` (a stable sort).
fn best(score: &[f32], mut candidates: Vec<usize>, k: usize) -> Vec<usize> {
    candidates
        .sort_by(|&a, &b| score[b].partial_cmp(&score[a]).unwrap_or_else(|| score[a].is_nan().cmp(&score[b].is_nan())));
    candidates.truncate(k);
    candidates
}

/// Routes one position from its router logits, as transformers does for every family
/// (all in float32):
/// 1. scores: softmax over all experts (mixtral, qwen, olmoe), the sigmoid of each
///    logit (deepseek_v3), or the logits themselves (gpt_oss, whose weights are the
///    softmax over the k chosen logits, step 4);
/// 2. selection scores: the scores plus `bias` (deepseek_v3's `e_score_correction_bias`),
///    which decides the choice only;
/// 3. with groups (`topk_group < n_group`), only the experts of the `topk_group` groups
///    whose two best selection scores sum highest are candidates;
/// 4. the top-k candidates by selection score (ties go to the lower expert index), whose
///    weights are their scores (without the bias), optionally renormalised to sum to one
///    (+1e-20 in the sigmoid router's denominator, as transformers), then multiplied by
///    `routed_scaling_factor`.
pub fn route(logits: &[f32], cfg: &RouterConfig, bias: Option<&[f32]>) -> Routing {
    route_with(logits, cfg, bias, None)
}

/// The per-expert scores of step 1 of [`route`].
fn scores_of(logits: &[f32], scoring: Scoring) -> Vec<f32> {
    let mut scores = logits.to_vec();
    match scoring {
        Scoring::Softmax => math::softmax(&mut scores),
        Scoring::Sigmoid => scores.iter_mut().for_each(|s| *s = math::sigmoid(*s)),
        // torch's softplus, with math::exp (the GPU's det_exp) under libm's log1pf.
        Scoring::SqrtSoftplus => scores.iter_mut().for_each(|s| *s = crate::math::softplus(*s).sqrt()),
        Scoring::SoftmaxOfTopk => {}
    }
    scores
}

/// [`route`], with the experts already chosen where `fixed` says which (deepseek_v4's
/// `hash_moe` layers: `tid2eid[token id]`, in the table's order); the router's scores
/// still weigh them (steps 1 and 4).
pub fn route_with(logits: &[f32], cfg: &RouterConfig, bias: Option<&[f32]>, fixed: Option<&[usize]>) -> Routing {
    let n = logits.len();
    let scores = scores_of(logits, cfg.scoring);
    let biased: Vec<f32>;
    let choice = match bias {
        Some(b) => {
            biased = scores.iter().zip(b).map(|(s, b)| s + b).collect();
            &biased
        }
        None => &scores,
    };
    let candidates: Vec<usize> = if cfg.n_group > 1 && cfg.topk_group < cfg.n_group && n.is_multiple_of(cfg.n_group) {
        let per = n / cfg.n_group;
        let group_score: Vec<f32> = (0..cfg.n_group)
            .map(|g| {
                let top2 = best(choice, (g * per..(g + 1) * per).collect(), 2);
                top2.iter().map(|&e| choice[e]).sum()
            })
            .collect();
        let mut kept = best(&group_score, (0..cfg.n_group).collect(), cfg.topk_group);
        kept.sort_unstable();
        kept.into_iter().flat_map(|g| g * per..(g + 1) * per).collect()
    } else {
        (0..n).collect()
    };
    let order = match fixed {
        Some(f) => f.iter().copied().filter(|&e| e < n).collect(),
        None => best(choice, candidates, cfg.top_k),
    };
    let mut weights: Vec<f32> = order.iter().map(|&e| scores[e]).collect();
    if cfg.scoring == Scoring::SoftmaxOfTopk {
        math::softmax(&mut weights);
    }
    if cfg.norm_topk_prob {
        let mut sum: f32 = weights.iter().sum();
        if matches!(cfg.scoring, Scoring::Sigmoid | Scoring::SqrtSoftplus) {
            sum += 1e-20;
        }
        for w in &mut weights {
            *w /= sum;
        }
    }
    if cfg.routed_scaling_factor != 1.0 {
        for w in &mut weights {
            *w *= cfg.routed_scaling_factor;
        }
    }
    Routing { experts: order, weights }
}

/// Batch-union: for each of `n_experts` experts, the (position, weight) pairs routed to it,
/// positions ascending (the CPU and GPU forwards both group a batch this way).
pub fn batch_union(routes: &[Routing], n_experts: usize) -> Result<Vec<Vec<(usize, f32)>>> {
    let mut users: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_experts];
    for (p, r) in routes.iter().enumerate() {
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            let list =
                users.get_mut(e).ok_or_else(|| Error::Invalid(format!("routed to expert {e} of {n_experts}")))?;
            list.push((p, w));
        }
    }
    Ok(users)
}

/// The always-on expert added to the routed mix.
pub struct SharedExpert {
    pub mlp: Expert,
    /// (1, hidden): the output is scaled by sigmoid(gate x) (qwen2_moe); None: added as
    /// is (deepseek_v3's `shared_experts`).
    pub gate: Option<Mat>,
}

/// Biases of every routed expert of a layer (gpt_oss), resident with the dense weights.
pub struct ExpertBiases {
    /// (n_experts, inter)
    pub gate: Vec<f32>,
    /// (n_experts, inter)
    pub up: Vec<f32>,
    /// (n_experts, hidden)
    pub down: Vec<f32>,
    pub inter: usize,
    pub hidden: usize,
}

impl ExpertBiases {
    pub fn of(&self, e: usize) -> FfnBias<'_> {
        let (i, h) = (self.inter, self.hidden);
        FfnBias {
            gate: &self.gate[e * i..(e + 1) * i],
            up: &self.up[e * i..(e + 1) * i],
            down: &self.down[e * h..(e + 1) * h],
        }
    }
}

/// Router, routed experts, and the optional shared expert.
pub struct MoeBlock {
    /// (n_experts, hidden)
    pub router: Mat,
    /// (n_experts): the router's own bias, added to its logits (`cfg.logit_bias`).
    pub router_bias: Option<Vec<f32>>,
    pub cfg: RouterConfig,
    /// How the routed experts combine gate and up.
    pub act: Activation,
    /// The routed experts' biases (gpt_oss).
    pub expert_bias: Option<ExpertBiases>,
    /// (n_experts): added to the router's scores for the selection only
    /// (`e_score_correction_bias`, when `cfg.correction_bias`).
    pub correction_bias: Option<Vec<f32>>,
    pub shared: Option<SharedExpert>,
}

impl MoeBlock {
    /// Router lookahead: the experts this block's router picks for `x` ([n, hidden]),
    /// ascending. For several positions, the `top_k` experts most positions pick (ties to
    /// the lower index), so a prefetch stays bounded however long the prompt.
    pub fn predict(&self, x: &[f32], n: usize) -> Vec<usize> {
        let ne = self.router.rows;
        let logits = self.router_logits(x, n);
        let routes = logits.chunks_exact(ne).map(|l| route(l, &self.cfg, self.correction_bias.as_deref()));
        most_chosen(routes, ne, self.cfg.top_k)
    }
}

/// The `keep` experts (at least one) that `routes` choose most often, ties to the lower
/// id, ascending: the router lookahead's guess for a layer.
pub(crate) fn most_chosen(routes: impl Iterator<Item = Routing>, ne: usize, keep: usize) -> Vec<usize> {
    let mut votes = vec![0usize; ne];
    for r in routes {
        for e in r.experts.into_iter().filter(|&e| e < ne) {
            votes[e] += 1;
        }
    }
    let mut order: Vec<usize> = (0..ne).filter(|&e| votes[e] > 0).collect();
    order.sort_by(|&a, &b| votes[b].cmp(&votes[a]).then(a.cmp(&b)));
    order.truncate(keep.max(1));
    order.sort_unstable();
    order
}

/// Counts of expert use, per layer (for placement statistics).
pub type UsageHook<'a> = &'a mut dyn FnMut(usize, usize);

impl MoeBlock {
    /// The router's logits for `x` ([n, hidden]): (n, n_experts), its bias added.
    pub fn router_logits(&self, x: &[f32], n: usize) -> Vec<f32> {
        let ne = self.router.rows;
        let mut logits = vec![0.0f32; n * ne];
        matmul(&self.router, x, n, &mut logits);
        if let Some(b) = &self.router_bias {
            for row in logits.chunks_exact_mut(ne) {
                row.iter_mut().zip(b).for_each(|(l, bi)| *l += bi);
            }
        }
        logits
    }

    /// The feed-forward of routed expert `e` (weights `w`) on `x` ([n, hidden]).
    fn expert_job<'a>(&'a self, e: usize, w: &'a Expert, x: &'a [f32], n: usize) -> FfnJob<'a> {
        FfnJob {
            gate: &w.gate,
            up: &w.up,
            down: &w.down,
            x,
            n,
            act: self.act,
            bias: self.expert_bias.as_ref().map(|b| b.of(e)),
        }
    }

    /// The routes of the `n` positions of `x` ([n, hidden]): [`route`] of each row of the
    /// router's logits.
    pub fn routes(&self, x: &[f32], n: usize) -> Vec<Routing> {
        let logits = self.router_logits(x, n);
        logits.chunks_exact(self.router.rows).map(|l| route(l, &self.cfg, self.correction_bias.as_deref())).collect()
    }

    /// The routed experts of `n` positions of `x` ([n, hidden]) into `out`: `out = sum over
    /// experts e (ascending index) of w * expert_e(x[p])` for the (p, w) of `users[e]`
    /// ([`batch_union`]). Each expert runs once over all positions routed to it; the shared
    /// expert is the graph's (model::graph).
    #[allow(clippy::too_many_arguments)]
    pub fn routed(
        &self,
        layer: usize,
        experts: &dyn ExpertSource,
        users: &[Vec<(usize, f32)>],
        x: &[f32],
        n: usize,
        out: &mut [f32],
        on_use: Option<UsageHook<'_>>,
    ) -> Result<()> {
        let hidden = self.router.cols;
        let n_exp = users.len();
        if x.len() < n * hidden || out.len() < n * hidden || users.iter().flatten().any(|&(p, _)| p >= n) {
            return Err(Error::Invalid(format!("layer {layer}: MoE input of {n} positions does not match")));
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
        let gather = |list: &[(usize, f32)]| gather_rows(x, n, hidden, list);
        // The experts whose bytes are here now run together (one parallel region); the
        // others in whatever order their reads complete. The outputs are summed in
        // ascending expert order, so the bits never depend on which read finished first.
        let mut done: Vec<Option<Vec<f32>>> = vec![None; used.len()];
        let ready: Vec<usize> = (0..used.len()).filter(|&i| experts.ready(layer, used[i])).collect();
        let arcs: Vec<Arc<Expert>> = ready.iter().map(|&i| experts.expert(layer, used[i])).collect::<Result<_>>()?;
        let xs: Vec<Cow<'_, [f32]>> = ready.iter().map(|&i| gather(&users[used[i]])).collect();
        let jobs: Vec<FfnJob> = arcs
            .iter()
            .zip(&xs)
            .zip(&ready)
            .map(|((e, xe), &i)| self.expert_job(used[i], e, xe, xe.len() / hidden))
            .collect();
        let mut ys: Vec<Vec<f32>> = xs.iter().map(|xe| vec![0.0f32; xe.len()]).collect();
        if !jobs.is_empty() {
            let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|v| v.as_mut_slice()).collect();
            swiglu_many(&jobs, &mut outs);
        }
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
            swiglu_many(&[self.expert_job(used[i], &expert, &xs, list.len())], &mut [&mut ys]);
            done[i] = Some(ys);
        }
        Ok(())
    }
}

/// The rows of `x` ([n, hidden]) at the positions of `list`. An expert that every position
/// chose (always, in decode) reads `x` itself: the experts sharing one input then share its
/// quantized copy too (kernels::matmul_many keys it by address).
pub(crate) fn gather_rows<'a>(x: &'a [f32], n: usize, hidden: usize, list: &[(usize, f32)]) -> Cow<'a, [f32]> {
    if list.len() == n && list.iter().enumerate().all(|(j, (p, _))| *p == j) {
        return Cow::Borrowed(&x[..n * hidden]);
    }
    let mut xs = vec![0.0f32; list.len() * hidden];
    for (j, (p, _)) in list.iter().enumerate() {
        xs[j * hidden..(j + 1) * hidden].copy_from_slice(&x[p * hidden..(p + 1) * hidden]);
    }
    Cow::Owned(xs)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::experts::ResidentExperts;

    fn cfg(top_k: usize, norm: bool) -> RouterConfig {
        RouterConfig::softmax(0, top_k, norm)
    }

    #[test]
    fn top_k_with_and_without_renormalisation() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 0.0];
        let r = route(&logits, &cfg(2, false), None);
        assert_eq!(r.experts, vec![1, 3]);
        let z: f64 = logits.iter().map(|v| (*v as f64).exp()).sum();
        assert!((r.weights[0] as f64 - 2f64.exp() / z).abs() < 1e-6);
        assert!((r.weights[1] as f64 - 1.5f64.exp() / z).abs() < 1e-6);
        let r = route(&logits, &cfg(2, true), None);
        let s = 2f64.exp() + 1.5f64.exp();
        assert!((r.weights[0] as f64 - 2f64.exp() / s).abs() < 1e-6);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let r = route(&[1.0, 3.0, 3.0, 3.0, 0.0], &cfg(2, false), None);
        assert_eq!(r.experts, vec![1, 2]);
        let r = route(&[0.0; 8], &cfg(3, true), None);
        assert_eq!(r.experts, vec![0, 1, 2]);
        assert!(r.weights.iter().all(|w| (*w - 1.0 / 3.0).abs() < 1e-7));
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let r = route(&[1e30, -1e30, 5e29, 1e30], &cfg(2, true), None);
        assert_eq!(r.experts, vec![0, 3]);
        assert_eq!(r.weights, vec![0.5, 0.5]);
        let r = route(&[f32::NAN, 1.0, 2.0], &cfg(1, false), None);
        assert_eq!(r.experts.len(), 1);
    }

    #[test]
    fn softmax_of_topk_weighs_only_the_chosen() {
        // gpt_oss: top-k on the logits, softmax over the k chosen.
        let cfg = RouterConfig { scoring: Scoring::SoftmaxOfTopk, ..RouterConfig::softmax(5, 2, false) };
        let r = route(&[0.1f32, 2.0, -1.0, 1.5, 0.0], &cfg, None);
        assert_eq!(r.experts, vec![1, 3]);
        let mut want = vec![2.0f32, 1.5];
        math::softmax(&mut want);
        assert_eq!(r.weights, want);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn clamped_swiglu_is_gpt_oss_gate() {
        let act = Activation::ClampedSwiglu { alpha: 1.702, limit: 2.0 };
        let want = |g: f64, u: f64| {
            let (g, u) = (g.min(2.0), u.clamp(-2.0, 2.0));
            (u + 1.0) * g / (1.0 + (-1.702 * g).exp())
        };
        for (g, u) in [(0.5f32, -0.3f32), (3.0, 0.1), (-4.0, 5.0), (1.0, -7.0)] {
            assert!((act.apply(g, u) as f64 - want(g as f64, u as f64)).abs() < 1e-6, "{g} {u}");
        }
    }

    fn sigmoid_cfg(n: usize, top_k: usize, n_group: usize, topk_group: usize, norm: bool) -> RouterConfig {
        RouterConfig {
            n_experts: n,
            top_k,
            norm_topk_prob: norm,
            scoring: Scoring::Sigmoid,
            n_group,
            topk_group,
            routed_scaling_factor: 2.5,
            correction_bias: true,
            logit_bias: false,
        }
    }

    #[test]
    fn correction_bias_chooses_but_does_not_weigh() {
        let logits = [0.0f32, 1.0, -1.0, 0.5];
        let bias = [0.0f32, 0.0, 0.9, 0.0];
        let r = route(&logits, &sigmoid_cfg(4, 2, 1, 1, false), Some(&bias));
        // Selection on sigmoid + bias: expert 2 (0.269 + 0.9) then 1 (0.731).
        assert_eq!(r.experts, vec![2, 1]);
        // Weights: the unbiased sigmoid scores times routed_scaling_factor.
        assert_eq!(r.weights, vec![math::sigmoid(-1.0) * 2.5, math::sigmoid(1.0) * 2.5]);
        let r = route(&logits, &sigmoid_cfg(4, 2, 1, 1, true), Some(&bias));
        let (a, b) = (math::sigmoid(-1.0), math::sigmoid(1.0));
        assert_eq!(r.weights, vec![a / (a + b + 1e-20) * 2.5, b / (a + b + 1e-20) * 2.5]);
        assert!((r.weights.iter().sum::<f32>() - 2.5).abs() < 1e-6);
    }

    #[test]
    fn groups_limit_the_candidates() {
        // All logits 0 (score 0.5); the bias sets the selection scores. Groups of two:
        // g0 = {0.95, 0.0} sums 0.95, g1 = {0.6, 0.6} 1.2, g2 = {0.55, 0.5} 1.05,
        // g3 = {0.1, 0.1} 0.2. The two best groups are g1 and g2, so expert 0, the best
        // single expert, is not a candidate.
        let choice = [0.95f32, 0.0, 0.6, 0.6, 0.55, 0.5, 0.1, 0.1];
        let bias: Vec<f32> = choice.iter().map(|c| c - 0.5).collect();
        let r = route(&[0.0; 8], &sigmoid_cfg(8, 3, 4, 2, true), Some(&bias));
        assert_eq!(r.experts, vec![2, 3, 4]);
        let w = 0.5 / (1.5 + 1e-20) * 2.5;
        assert_eq!(r.weights, vec![w; 3]);
        // Without the group limit expert 0 wins.
        let r = route(&[0.0; 8], &sigmoid_cfg(8, 3, 4, 4, true), Some(&bias));
        assert_eq!(r.experts, vec![0, 2, 3]);
        // A group score is its best two, not its best one nor its sum: g1 = {0.7, 0.2, 0.2}
        // (0.9) beats g0 = {0.8, 0.05, 0.05} (0.85) though g0 holds the best expert.
        let choice = [0.8f32, 0.05, 0.05, 0.7, 0.2, 0.2];
        let bias: Vec<f32> = choice.iter().map(|c| c - 0.5).collect();
        let r = route(&[0.0; 6], &sigmoid_cfg(6, 1, 2, 1, false), Some(&bias));
        assert_eq!(r.experts, vec![3]);
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
    fn routed_experts_equal_per_position_reference_and_union_experts() {
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
            router_bias: None,
            cfg: RouterConfig::softmax(ne, 2, true),
            act: Activation::Silu,
            expert_bias: None,
            correction_bias: None,
            shared: None,
        };
        let forward = |x: &[f32], n: usize, out: &mut [f32], on_use: Option<UsageHook<'_>>| {
            let users = batch_union(&block.routes(x, n), ne).unwrap();
            block.routed(0, &experts, &users, x, n, out, on_use).unwrap();
        };
        let n = 7;
        let x: Vec<f32> = (0..n * h).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect();
        let mut out = vec![0.0; n * h];
        let mut uses = 0usize;
        forward(&x, n, &mut out, Some(&mut |_, c| uses += c));
        assert_eq!(uses, n * 2);
        for p in 0..n {
            let xp = &x[p * h..(p + 1) * h];
            let mut one = vec![0.0; h];
            forward(xp, 1, &mut one, None);
            assert_eq!(one, out[p * h..(p + 1) * h].to_vec(), "position {p} differs between batch and single");
            // Plain reference in f64.
            let lg: Vec<f32> = (0..ne)
                .map(|e| {
                    let mut r = vec![0.0; h];
                    block.router.row_into(e, &mut r);
                    math::dot(&r, xp)
                })
                .collect();
            let rt = route(&lg, &block.cfg, None);
            let mut want = vec![0.0f64; h];
            for (&e, &w) in rt.experts.iter().zip(&rt.weights) {
                let mut y = vec![0.0; h];
                experts.expert(0, e).unwrap().forward(xp, 1, &mut y);
                for i in 0..h {
                    want[i] += (w * y[i]) as f64;
                }
            }
            for i in 0..h {
                assert!((out[p * h + i] as f64 - want[i]).abs() < 1e-5, "position {p} lane {i}");
            }
        }
    }
}
