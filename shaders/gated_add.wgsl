// gated_add.wgsl — the shared expert's sigmoid gate: OUT[p, d] += sigmoid(G[p]) * S[p, d],
// as MoeBlock::forward adds it (math::sigmoid = 1 / (1 + e^-x) with det_exp and a
// correctly rounded division; product rounded before the add).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P    uniform Params
//   1 OUT  storage rw    f32 [n, hidden]
//   2 S    storage read  f32 [n, hidden]   shared expert output
//   3 G    storage read  f32 [n]           shared gate logits
// Workgroup: 64 threads, one per (p, d).
// Dispatch: ceil(n * hidden / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    hidden: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(2) var<storage, read> S: array<f32>;
@group(0) @binding(3) var<storage, read> G: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.n * P.hidden) {
        return;
    }
    let k = det_sigmoid(G[t / P.hidden]);
    OUT[t] = OUT[t] + opq(k * S[t]);
}
