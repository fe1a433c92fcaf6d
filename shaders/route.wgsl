// route.wgsl — MoE routing of n positions from their router logits, as moe::route does
// it, for every scoring rule the families use:
//   1. scores: SCORING 0 softmax over all experts (math::softmax: max, then e^(v - max)
//      with det_exp summed in expert order, correctly rounded division); 1 the sigmoid of
//      each logit (det_sigmoid); 2 the logits themselves (gpt_oss); 3 sqrt(softplus) of
//      each logit (deepseek_v4: det_softplus, sqrt_cr);
//   2. selection scores: the scores plus BIAS (e_score_correction_bias) when has_bias;
//   3. groups (n_group > 1, topk_group < n_group, n_experts a multiple of n_group): a
//      group's score is the sum of its two best selection scores; only the experts of the
//      topk_group best groups are candidates;
//   4. the top-k candidates by selection score in descending order (ties to the lower
//      index, NaN last: moe::best's stable sort), or with has_fixed the k experts FIXED
//      names in its order (deepseek_v4's hash layers: moe::route_with's `fixed`; the host
//      checks they are experts); their weights are their scores (without the bias);
//      SCORING 2 takes the softmax of those k (math::softmax); norm divides them by their
//      sum (added in selection order, + 1e-20 for the sigmoid and sqrtsoftplus); a scale
//      other than 1 multiplies them (routed_scaling_factor).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P      uniform Params
//   1 L      storage read  f32 [n, n_experts]   router logits (any router bias added)
//   2 PROBS  storage rw    f32 [n, n_experts]   scratch: the scores
//   3 OUT    storage rw    u32 [n, top_k, 2]    (expert index, weight bits) per choice
//   4 BIAS   storage read  f32 [n_experts]      selection bias (read only when has_bias)
//   5 FIXED  storage read  u32 [n, top_k]       the chosen experts (read only when has_fixed)
// Workgroup: 64 threads, one per position.
// Dispatch: ceil(n / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_experts: u32,
    top_k: u32,
    norm: u32,
    scoring: u32,
    has_bias: u32,
    n_group: u32, // at most 32 (the host checks)
    topk_group: u32,
    scale: f32,
    has_fixed: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> L: array<f32>;
@group(0) @binding(2) var<storage, read_write> PROBS: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<u32>;
@group(0) @binding(4) var<storage, read> BIAS: array<f32>;
@group(0) @binding(5) var<storage, read> FIXED: array<u32>;

// a ranks before b (a at index ia, b at ib) in a stable descending sort, NaN last.
fn before(a: f32, ia: u32, b: f32, ib: u32) -> bool {
    if (is_nan_f32(a)) {
        return is_nan_f32(b) && ia < ib;
    }
    if (is_nan_f32(b)) {
        return true;
    }
    return a > b || (a == b && ia < ib);
}

// Selection score of expert e of the position whose scores start at base.
fn choice(base: u32, e: u32) -> f32 {
    if (P.has_bias != 0u) {
        return PROBS[base + e] + BIAS[e];
    }
    return PROBS[base + e];
}

// Sum of the two best selection scores of experts [e0, e0 + per) (the best alone if per = 1).
fn group_score(base: u32, e0: u32, per: u32) -> f32 {
    var b1 = e0;
    for (var e = e0 + 1u; e < e0 + per; e++) {
        if (before(choice(base, e), e, choice(base, b1), b1)) {
            b1 = e;
        }
    }
    if (per < 2u) {
        return choice(base, b1);
    }
    var b2 = e0 + per;
    for (var e = e0; e < e0 + per; e++) {
        if (e != b1 && (b2 == e0 + per || before(choice(base, e), e, choice(base, b2), b2))) {
            b2 = e;
        }
    }
    return choice(base, b1) + choice(base, b2);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let p = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (p >= P.n) {
        return;
    }
    let ne = P.n_experts;
    let base = p * ne;
    if (P.scoring == 1u) {
        for (var e = 0u; e < ne; e++) {
            PROBS[base + e] = det_sigmoid(L[base + e]);
        }
    } else if (P.scoring == 2u) {
        for (var e = 0u; e < ne; e++) {
            PROBS[base + e] = L[base + e];
        }
    } else if (P.scoring == 3u) {
        for (var e = 0u; e < ne; e++) {
            PROBS[base + e] = sqrt_cr(det_softplus(L[base + e]));
        }
    } else {
        // max ignoring NaN, from -inf (f32::max folds the same way).
        var m = f32_bits(0xff800000u);
        for (var e = 0u; e < ne; e++) {
            let v = L[base + e];
            if (v > m) {
                m = v;
            }
        }
        if (m == f32_bits(0xff800000u)) {
            for (var e = 0u; e < ne; e++) {
                PROBS[base + e] = 0.0;
            }
        } else {
            var s = 0.0;
            for (var e = 0u; e < ne; e++) {
                let x = det_exp(L[base + e] - m);
                PROBS[base + e] = x;
                s = s + x;
            }
            for (var e = 0u; e < ne; e++) {
                PROBS[base + e] = div_cr(PROBS[base + e], s);
            }
        }
    }

    // Candidate groups as a bit mask (all experts without groups).
    var per = ne;
    var kept = 1u;
    let ng = P.n_group;
    if (P.has_fixed != 0u) {
        kept = 0u; // no candidates: the picks are FIXED's
    } else if (ng > 1u && P.topk_group < ng && ne % ng == 0u) {
        per = ne / ng;
        kept = 0u;
        var gs: array<f32, 32>;
        for (var g = 0u; g < ng; g++) {
            gs[g] = group_score(base, g * per, per);
        }
        var have = false;
        var prev = 0u;
        for (var j = 0u; j < P.topk_group; j++) {
            var best_g = ng;
            for (var g = 0u; g < ng; g++) {
                if (have && !before(gs[prev], prev, gs[g], g)) {
                    continue;
                }
                if (best_g == ng || before(gs[g], g, gs[best_g], best_g)) {
                    best_g = g;
                }
            }
            kept = kept | (1u << best_g);
            have = true;
            prev = best_g;
        }
    }

    // Selection sort of the top k; an expert is taken when it ranks after the previous pick.
    let k = P.top_k;
    let out = p * k * 2u;
    var have_prev = false;
    var prev = 0.0;
    var prev_i = 0u;
    for (var j = 0u; j < k; j++) {
        var best_i = ne;
        var best = 0.0;
        for (var e = 0u; e < ne; e++) {
            if (P.has_fixed != 0u || (kept & (1u << (e / per))) == 0u) {
                continue;
            }
            let v = choice(base, e);
            if (have_prev && !before(prev, prev_i, v, e)) {
                continue; // already taken (ranks at or before the previous pick)
            }
            if (best_i == ne || before(v, e, best, best_i)) {
                best = v;
                best_i = e;
            }
        }
        if (P.has_fixed != 0u) {
            best_i = FIXED[p * k + j];
        }
        OUT[out + 2u * j] = best_i;
        OUT[out + 2u * j + 1u] = bitcast<u32>(PROBS[base + min(best_i, ne - 1u)]);
        have_prev = true;
        prev = best;
        prev_i = best_i;
    }

    if (P.scoring == 2u) {
        var m = f32_bits(0xff800000u);
        for (var j = 0u; j < k; j++) {
            let v = bitcast<f32>(OUT[out + 2u * j + 1u]);
            if (v > m) {
                m = v;
            }
        }
        var s = 0.0;
        for (var j = 0u; j < k; j++) {
            var x = 0.0;
            if (m != f32_bits(0xff800000u)) {
                x = det_exp(bitcast<f32>(OUT[out + 2u * j + 1u]) - m);
            }
            OUT[out + 2u * j + 1u] = bitcast<u32>(x);
            s = s + x;
        }
        if (m != f32_bits(0xff800000u)) {
            for (var j = 0u; j < k; j++) {
                OUT[out + 2u * j + 1u] = bitcast<u32>(div_cr(bitcast<f32>(OUT[out + 2u * j + 1u]), s));
            }
        }
    }
    if (P.norm != 0u) {
        var sum = 0.0;
        for (var j = 0u; j < k; j++) {
            sum = sum + bitcast<f32>(OUT[out + 2u * j + 1u]);
        }
        if (P.scoring == 1u || P.scoring == 3u) {
            sum = sum + bitcast<f32>(0x1e3ce508u); // 1e-20
        }
        for (var j = 0u; j < k; j++) {
            let w = bitcast<f32>(OUT[out + 2u * j + 1u]);
            OUT[out + 2u * j + 1u] = bitcast<u32>(div_cr(w, sum));
        }
    }
    if (P.scale != 1.0) {
        for (var j = 0u; j < k; j++) {
            let w = bitcast<f32>(OUT[out + 2u * j + 1u]);
            OUT[out + 2u * j + 1u] = bitcast<u32>(w * P.scale);
        }
    }
}
