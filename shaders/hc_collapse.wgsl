// hc_collapse.wgsl — DeepSeek-V4's hyper-connection collapse: the N residual streams of
// each position mixed into one, OUT[p, d] = sum_j PRE[p, j] * X[p, j, d], j ascending
// from 0.0, each product rounded before its add, as v4::hc::mix_streams adds them.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P    uniform Params
//   1 OUT  storage rw    f32 [n, hidden]
//   2 PRE  storage read  f32 [n, n_hc]
//   3 X    storage read  f32 [n, n_hc, hidden]   the streams
// Workgroup: 64 threads, one per (p, d).
// Dispatch: ceil(n * hidden / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_hc: u32,
    hidden: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(2) var<storage, read> PRE: array<f32>;
@group(0) @binding(3) var<storage, read> X: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.n * P.hidden) {
        return;
    }
    let p = t / P.hidden;
    let d = t % P.hidden;
    var acc = 0.0;
    for (var j = 0u; j < P.n_hc; j++) {
        acc = acc + opq(PRE[p * P.n_hc + j] * X[(p * P.n_hc + j) * P.hidden + d]);
    }
    OUT[t] = acc;
}
