// hc_expand.wgsl — DeepSeek-V4's hyper-connection expand after a block: the streams
// become OUT[p, k, d] = POST[p, k] * Y[p, d] + sum_j COMB[p, j, k] * X[p, j, d], as
// v4::hc::expand computes them: the sum over j ascending from 0.0, each product rounded
// before its add, then the rounded POST * Y product plus the sum. OUT is a separate
// buffer (every new stream reads all old ones); the caller copies it over X.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P     uniform Params
//   1 OUT   storage rw    f32 [n, n_hc, hidden]   the new streams
//   2 X     storage read  f32 [n, n_hc, hidden]   the old streams
//   3 Y     storage read  f32 [n, hidden]         the block's output
//   4 POST  storage read  f32 [n, n_hc]
//   5 COMB  storage read  f32 [n, n_hc, n_hc]     (from j, to k)
// Workgroup: 64 threads, one per (p, k, d).
// Dispatch: ceil(n * n_hc * hidden / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_hc: u32,
    hidden: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read> Y: array<f32>;
@group(0) @binding(4) var<storage, read> POST: array<f32>;
@group(0) @binding(5) var<storage, read> COMB: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    let width = P.n_hc * P.hidden;
    if (t >= P.n * width) {
        return;
    }
    let p = t / width;
    let k = (t % width) / P.hidden;
    let d = t % P.hidden;
    var acc = 0.0;
    for (var j = 0u; j < P.n_hc; j++) {
        acc = acc + opq(COMB[(p * P.n_hc + j) * P.n_hc + k] * X[(p * P.n_hc + j) * P.hidden + d]);
    }
    OUT[t] = opq(POST[p * P.n_hc + k] * Y[p * P.hidden + d]) + acc;
}
