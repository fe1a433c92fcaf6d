// route.wgsl — MoE routing of n positions from their router logits, as moe::route does
// it: softmax over all experts (math::softmax: max, then e^(v - max) with det_exp summed
// in expert order, then correctly rounded division), the top-k probabilities in
// descending order (ties to the lower expert index, NaN last: a stable sort), optionally
// renormalised by their sum (added in selection order, correctly rounded division).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P      uniform Params
//   1 L      storage read  f32 [n, n_experts]   router logits
//   2 PROBS  storage rw    f32 [n, n_experts]   scratch: the softmax
//   3 OUT    storage rw    u32 [n, top_k, 2]    (expert index, weight bits) per choice
// Workgroup: 64 threads, one per position.
// Dispatch: ceil(n / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_experts: u32,
    top_k: u32,
    norm: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> L: array<f32>;
@group(0) @binding(2) var<storage, read_write> PROBS: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<u32>;

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

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let p = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (p >= P.n) {
        return;
    }
    let ne = P.n_experts;
    let base = p * ne;
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
    // Selection sort of the top k; an expert is taken when it ranks after the previous pick.
    let k = P.top_k;
    let out = p * k * 2u;
    var sum = 0.0;
    var have_prev = false;
    var prev = 0.0;
    var prev_i = 0u;
    for (var j = 0u; j < k; j++) {
        var best_i = ne;
        var best = 0.0;
        for (var e = 0u; e < ne; e++) {
            let v = PROBS[base + e];
            if (have_prev && !before(prev, prev_i, v, e)) {
                continue; // already taken (ranks at or before the previous pick)
            }
            if (best_i == ne || before(v, e, best, best_i)) {
                best = v;
                best_i = e;
            }
        }
        OUT[out + 2u * j] = best_i;
        OUT[out + 2u * j + 1u] = bitcast<u32>(best);
        sum = sum + best;
        have_prev = true;
        prev = best;
        prev_i = best_i;
    }
    if (P.norm != 0u) {
        for (var j = 0u; j < k; j++) {
            let w = bitcast<f32>(OUT[out + 2u * j + 1u]);
            OUT[out + 2u * j + 1u] = bitcast<u32>(div_cr(w, sum));
        }
    }
}
