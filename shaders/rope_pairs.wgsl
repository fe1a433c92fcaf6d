// rope_pairs.wgsl — rotary position embedding of interleaved pairs (DeepSeek's
// rope_interleave), in place: the 2 * half values of each head come as pairs
// (x0, x1), (x2, x3), ... and leave in "rotate_half" order, as rope::deinterleave
// followed by Rope::apply gives them (transformers returns the same order):
//   a = x[2i], b = x[2i + 1]
//   x[i]        = a * cos[i] + (-b) * sin[i]
//   x[i + half] = b * cos[i] + a * sin[i]                      for i < half
// Every head is read whole into workgroup memory before any value is written back,
// so the permutation is safe in place. Products are rounded before the add (opq), as
// in rope.wgsl and on the CPU.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 X   storage rw    f32 [x_offset + n * heads * head_dim]: head h of position p at
//                       x_offset + (p * heads + h) * head_dim, its first 2 * half rotated
//   2 CS  storage read  f32 [cs_offset + n * 2 * half]: per position, half cosines then half sines
// Workgroup: 64 threads for one (position, head), each taking i, i + 64, ... < half
// (half <= 512).
// Dispatch: n * heads workgroups, split (x, y) with groups_x.

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

var<workgroup> S: array<f32, 1024>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let ph = wg.x + wg.y * P.groups_x; // position * heads + head
    if (ph >= P.n * P.heads) {
        return;
    }
    let p = ph / P.heads;
    let base = P.x_offset + ph * P.head_dim;
    for (var i = li; i < P.half; i += 64u) {
        S[i] = X[base + 2u * i];
        S[i + P.half] = X[base + 2u * i + 1u];
    }
    workgroupBarrier();
    for (var i = li; i < P.half; i += 64u) {
        let c = CS[P.cs_offset + p * 2u * P.half + i];
        let s = CS[P.cs_offset + p * 2u * P.half + P.half + i];
        let x1 = S[i];
        let x2 = S[i + P.half];
        X[base + i] = opq(x1 * c) + opq((-x2) * s);
        X[base + i + P.half] = opq(x2 * c) + opq(x1 * s);
    }
}
