// layernorm.wgsl — in-place LayerNorm with weight and bias of every row of X, as
// dsa::layer_norm computes it (DeepSeek Sparse Attention's indexer key):
//   mean = (x_0 + x_1 + ...) / width                  sequential sum, index order
//   var  = ((x_0 - mean)^2 + (x_1 - mean)^2 + ...) / width
//   x    = ((x - mean) * (1 / sqrt(var + eps))) * w + b
// One thread per row does the two sums in the CPU's order; the divisions, the square
// root and the reciprocal are correctly rounded (div_cr, sqrt_cr), products rounded
// before an add (opq).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 X   storage rw    f32 [x_offset + rows * stride]: row k is the width floats at
//                             x_offset + k * stride
//   2 NW  storage read  f32 [width]   weight
//   3 NB  storage read  f32 [width]   bias
// Workgroup: 64 threads, one per row.
// Dispatch: ceil(rows / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    rows: u32,
    width: u32,
    eps: f32,
    x_offset: u32,
    stride: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> NW: array<f32>;
@group(0) @binding(3) var<storage, read> NB: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (row >= P.rows) {
        return;
    }
    let base = P.x_offset + row * P.stride;
    let n = f32(P.width);
    var sum = 0.0;
    for (var c = 0u; c < P.width; c = c + 1u) {
        sum = sum + X[base + c];
    }
    let mean = div_cr(sum, n);
    var sq = 0.0;
    for (var c = 0u; c < P.width; c = c + 1u) {
        let d = X[base + c] - mean;
        sq = sq + opq(d * d);
    }
    let inv = div_cr(1.0, sqrt_cr(div_cr(sq, n) + P.eps));
    for (var c = 0u; c < P.width; c = c + 1u) {
        X[base + c] = opq(opq((X[base + c] - mean) * inv) * NW[c]) + NB[c];
    }
}
