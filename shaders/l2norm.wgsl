// l2norm.wgsl — Gated DeltaNet's q/k normalisation (transformers' l2norm), in place:
// per head row x = x * (1 / sqrt(sum x^2 + eps)), and the first `scaled` heads of each
// position (the queries) then times `scale` (k_head_dim^-0.5), as
// DeltaNetWeights::forward computes it: (x * inv) * scale, each product rounded (opq).
//
// sum x^2 uses math::dot's lane order (8 lanes, reduce8); the square root and the
// reciprocal are correctly rounded (sqrt_cr, div_cr).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 X   storage rw    f32 [n, pos_stride]: position t's head hh (hh < heads) is the
//                             `width` floats at t * pos_stride + hh * width
// Workgroup: 64 threads per row (8 accumulate, 64 scale).
// Dispatch: n * heads workgroups (one per head row), split (x, y) with groups_x.

struct Params {
    zero: u32,
    rows: u32,
    heads: u32,
    width: u32,
    pos_stride: u32,
    scaled: u32,
    scale: f32,
    eps: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;

var<workgroup> lanes: array<f32, 8>;
var<workgroup> inv_norm: f32;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x + wg.y * P.groups_x;
    if (row >= P.rows) {
        return;
    }
    let hh = row % P.heads;
    let base = (row / P.heads) * P.pos_stride + hh * P.width;
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
        inv_norm = div_cr(1.0, sqrt_cr(reduce8(lanes) + P.eps));
    }
    workgroupBarrier();
    let inv = inv_norm;
    for (var c = li; c < P.width; c = c + 64u) {
        if (hh < P.scaled) {
            X[base + c] = opq(X[base + c] * inv) * P.scale;
        } else {
            X[base + c] = X[base + c] * inv;
        }
    }
}
