// rope.wgsl — rotary position embedding, in place, "rotate_half" layout (Rope::apply):
//   x[i]        = x[i] * cos[i] + (-x[i + half]) * sin[i]
//   x[i + half] = x[i + half] * cos[i] + x[i] * sin[i]        for i < half
// for every head of every position. cos/sin are computed on the CPU (Rope::cos_sin, in
// f64 with libm) and uploaded per step, so no GPU sin/cos is involved; products are
// rounded before the add (opq) as on the CPU.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 X   storage rw    f32 [x_offset + n * heads * head_dim]
//   2 CS  storage read  f32 [cs_offset + n * 2 * half]: per position, half cosines then half sines
// Workgroup: 64 threads, one per (position, head, i < half).
// Dispatch: ceil(n * heads * half / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    heads: u32,
    head_dim: u32,
    half: u32,
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
    let ph = t / P.half; // position * heads + head
    let p = ph / P.heads;
    let base = P.x_offset + ph * P.head_dim;
    let c = CS[P.cs_offset + p * 2u * P.half + i];
    let s = CS[P.cs_offset + p * 2u * P.half + P.half + i];
    let x1 = X[base + i];
    let x2 = X[base + i + P.half];
    X[base + i] = opq(x1 * c) + opq((-x2) * s);
    X[base + i + P.half] = opq(x2 * c) + opq(x1 * s);
}
