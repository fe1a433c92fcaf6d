// deltanet_gates.wgsl — Gated DeltaNet's per-head gates, in place, as
// DeltaNetWeights::forward computes them (engine/src/model/deltanet.rs):
//   beta  = sigmoid(b)                                   (det_sigmoid)
//   decay = exp(neg_a[h] * softplus(a + dt_bias[h]))     (det_exp, the product rounded)
//   softplus(x) = x above 20 (torch's threshold), else log1p(exp(x)).
// softplus is det_softplus (common/arith.wgsl: libm's log1pf ported line for line).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P    uniform Params
//   1 BA   storage rw    f32 [n, 2 * heads]: per position b of every value head, then a;
//                              becomes beta of every head, then decay
//   2 NA   storage read  f32 [heads]   -exp(A_log)
//   3 DT   storage read  f32 [heads]   dt_bias
// Workgroup: 64 threads, one per (position, head).
// Dispatch: ceil(n * heads / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    heads: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> BA: array<f32>;
@group(0) @binding(2) var<storage, read> NA: array<f32>;
@group(0) @binding(3) var<storage, read> DT: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (i >= P.n * P.heads) {
        return;
    }
    let t = i / P.heads;
    let h = i % P.heads;
    let at = t * 2u * P.heads + h;
    let b = BA[at];
    let a = BA[at + P.heads];
    BA[at] = det_sigmoid(b);
    BA[at + P.heads] = det_exp(opq(NA[h] * det_softplus(a + DT[h])));
}
