// quantize_act16.wgsl — activations quantized to two int16 parts per block of 32, as
// qdot::mxfp4::ActQ16::quantize (engine/src/qdot/mxfp4/mod.rs) does on the CPU, for
// mxfp4_matmul.wgsl.
//
// Block b of position p = columns [32 b, 32 b + 32) of X[p] (cols a multiple of 32):
//   amax = max |x| (compared as integer bits, so NaN/inf are seen);
//   amax bits >= 0x7f800000 (NaN or inf):  d = NaN, h = l = 0;
//   amax < 2^-64:                           d = 0,   h = l = 0;
//   else inv = 32767 / amax, d = amax / 32767, inv_lo = 65536 / d (div_cr: correctly
//        rounded, as on the CPU),
//        h = clamp(round_ties_even(x * inv), -32767, 32767),
//        l = clamp(round_ties_even((x - h * d) * inv_lo), -32767, 32767),
//   every product and difference rounded on its own (opq), rounding done with floor.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P  uniform Params
//   1 X  storage read   f32 [x_offset + n * cols]
//   2 Q  storage rw     u32 [d_offset + n * blocks]: for position p and block b, the 16
//        words from p * q_words + 32 b hold h of elements (2j, 2j + 1) in their low and
//        high halves (word j), the next 16 words l the same way; word
//        d_offset + p * blocks + b holds d's bits. q_words = 32 * blocks.
// Workgroup: 64 threads, one per (position, block).
// Dispatch: ceil(n * blocks / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    cols: u32,
    blocks: u32,
    x_offset: u32,
    q_words: u32,
    d_offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Q: array<u32>;

// round_ties_even(v) clamped to [-32767, 32767], for |v| < 2^23.
fn round16(v: f32) -> i32 {
    let fl = floor(v);
    let fr = v - fl; // exact
    var r = i32(fl);
    if (fr > 0.5 || (fr == 0.5 && (r & 1) != 0)) {
        r = r + 1;
    }
    return clamp(r, -32767, 32767);
}

fn pack(a: i32, b: i32) -> u32 {
    return (bitcast<u32>(a) & 0xffffu) | (bitcast<u32>(b) << 16u);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let id = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (id >= P.n * P.blocks) {
        return;
    }
    let p = id / P.blocks;
    let b = id % P.blocks;
    let xbase = P.x_offset + p * P.cols + b * 32u;
    var amax_bits = 0u;
    for (var i = 0u; i < 32u; i++) {
        amax_bits = max(amax_bits, bitcast<u32>(X[xbase + i]) & 0x7fffffffu);
    }
    let qbase = p * P.q_words + b * 32u;
    var d = 0.0;
    if (amax_bits >= 0x7f800000u) {
        d = f32_bits(F32_NAN);
    }
    if (amax_bits >= 0x7f800000u || amax_bits < 0x1f800000u) {
        for (var w = 0u; w < 32u; w++) {
            Q[qbase + w] = 0u;
        }
    } else {
        let amax = bitcast<f32>(amax_bits);
        let inv = div_cr(32767.0, amax);
        d = div_cr(amax, 32767.0);
        let inv_lo = div_cr(65536.0, d);
        for (var j = 0u; j < 16u; j++) {
            var h: array<i32, 2>;
            var l: array<i32, 2>;
            for (var e = 0u; e < 2u; e++) {
                let v = X[xbase + 2u * j + e];
                h[e] = round16(opq(v * inv));
                l[e] = round16(opq(opq(v - opq(f32(h[e]) * d)) * inv_lo));
            }
            Q[qbase + j] = pack(h[0], h[1]);
            Q[qbase + 16u + j] = pack(l[0], l[1]);
        }
    }
    Q[P.d_offset + p * P.blocks + b] = bitcast<u32>(d);
}
