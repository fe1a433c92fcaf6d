// rmsnorm.wgsl — in-place RMSNorm of every row of X: x = w * (x * (1 / sqrt(mean(x^2) + eps))),
// as kernels::rmsnorm computes it (transformers' formula).
//
// mean(x^2) uses math::dot's lane order (8 lanes, reduce8); the mean's division, the
// square root and the reciprocal are correctly rounded (div_cr, sqrt_cr), products are
// rounded before use (opq). Also serves per-head q/k norms (rows = n * heads, width =
// head_dim) and whole-projection norms (rows = n, width = heads * head_dim).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 X   storage rw    f32 [x_offset + rows * stride]: row k is the width floats at
//                             x_offset + k * stride (MLA normalises the latent part of
//                             each cache row)
//   2 NW  storage read  f32 [width]   norm weight
// Workgroup: 64 threads per row (8 accumulate, 64 scale).
// Dispatch: rows workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    rows: u32,
    width: u32,
    eps: f32,
    x_offset: u32,
    stride: u32, // floats from one row's start to the next (width when packed)
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> NW: array<f32>;

var<workgroup> lanes: array<f32, 8>;
var<workgroup> inv_rms: f32;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x + wg.y * P.groups_x;
    if (row >= P.rows) {
        return;
    }
    let base = P.x_offset + row * P.stride;
    if (li < 8u) {
        var acc = 0.0;
        for (var c = li; c < P.width; c = c + 8u) {
            let v = X[base + c];
            acc = acc + opq(v * v);
        }
        lanes[li] = acc;
    }
    workgroupBarrier();
    if (li == 0u) {
        let mean = div_cr(reduce8(lanes), f32(P.width));
        inv_rms = div_cr(1.0, sqrt_cr(mean + P.eps));
    }
    workgroupBarrier();
    let inv = inv_rms;
    for (var c = li; c < P.width; c = c + 64u) {
        X[base + c] = NW[c] * opq(X[base + c] * inv);
    }
}
