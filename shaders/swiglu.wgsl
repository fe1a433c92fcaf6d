// swiglu.wgsl — the SwiGLU gate, in place: G[i] = silu(G[i]) * U[i], with
// silu(x) = x / (1 + e^-x) as math::silu computes it (det_exp, correctly rounded division).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P  uniform Params
//   1 G  storage rw    f32 [len]   gate projection, becomes the expert's hidden activation
//   2 U  storage read  f32 [len]   up projection
// Workgroup: 64 threads, one per element.
// Dispatch: ceil(len / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    len: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> G: array<f32>;
@group(0) @binding(2) var<storage, read> U: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.len) {
        return;
    }
    G[t] = det_silu(G[t]) * U[t];
}
