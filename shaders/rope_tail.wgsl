// rope_tail.wgsl — DeepSeek-V4's RoPE of the trailing 2 * half values of each head, as
// interleaved pairs kept in place (v4::compress::rope_tail): with a = x[2i], b = x[2i + 1]
// of the tail and s = sin[i] (-sin[i] with inverse, rotating back)
//   x[2i]     = a * cos[i] + (-b) * s
//   x[2i + 1] = b * cos[i] + a * s                            for i < half
// Each thread owns one pair, so in place is safe. Products are rounded before the add
// (opq), as on the CPU.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 X   storage rw    f32 [x_offset + n * heads * stride]: head h of position p at
//                       x_offset + (p * heads + h) * stride, its last 2 * half rotated
//   2 CS  storage read  f32 [cs_offset + n * 2 * half]: per position, half cosines then half sines
// Workgroup: 64 threads, one per (position, head, pair).
// Dispatch: ceil(n * heads * half / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    heads: u32,
    stride: u32,
    half: u32,
    inverse: u32,
    x_offset: u32,
    cs_offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.n * P.heads * P.half) {
        return;
    }
    let i = t % P.half;
    let row = t / P.half; // p * heads + h
    let p = row / P.heads;
    let at = P.x_offset + row * P.stride + P.stride - 2u * P.half + 2u * i;
    let c = CS[P.cs_offset + p * 2u * P.half + i];
    var s = CS[P.cs_offset + p * 2u * P.half + P.half + i];
    if (P.inverse != 0u) {
        s = -s;
    }
    let a = X[at];
    let b = X[at + 1u];
    X[at] = opq(a * c) + opq((-b) * s);
    X[at + 1u] = opq(b * c) + opq(a * s);
}
