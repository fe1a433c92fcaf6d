// quantize_act.wgsl — activations quantized to int8 per block, as qdot::ActQ::quantize
// (engine/src/qdot/mod.rs) does on the CPU, for qmatmul.wgsl.
//
// Block b of position p = columns [b G, min((b+1) G, cols)) of X[p]:
//   amax = max |x| (compared as integer bits, so NaN/inf are seen);
//   amax bits >= 0x7f800000 (NaN or inf):  d = NaN, q = 0;
//   amax < 2^-64:                           d = 0,   q = 0;
//   else inv = 127 / amax, d = amax / 127 (div_cr: correctly rounded, as on the CPU),
//        q = clamp(round_ties_even(x * inv), -127, 127) (rounded with floor, exact).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P  uniform Params
//   1 X  storage read   f32 [x_offset + n * cols]
//   2 Q  storage rw     u32 [d_offset + n * blocks]: for position p, words
//        [p * q_words + b * ceil(G/4) ..) hold block b's q as bytes (4 per word, low byte
//        first, zero past the block's end); word d_offset + p * blocks + b holds d's bits.
// Workgroup: 64 threads, one workgroup per (position, block).
// Dispatch: n * blocks workgroups, as (min(that, 65535), ceil(that / 65535)) with
//   groups_x = the x count.

struct Params {
    zero: u32,
    n: u32,
    cols: u32,
    group: u32,
    blocks: u32,
    x_offset: u32,
    q_words: u32,
    d_offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Q: array<u32>;

var<workgroup> red: array<u32, 64>;

// round_ties_even(v) clamped to [-127, 127], for |v| < 2^23.
fn round_q(v: f32) -> i32 {
    let fl = floor(v);
    let fr = v - fl; // exact
    var r = i32(fl);
    if (fr > 0.5 || (fr == 0.5 && (r & 1) != 0)) {
        r = r + 1;
    }
    return clamp(r, -127, 127);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let id = wg.x + wg.y * P.groups_x;
    let live = id < P.n * P.blocks;
    let p = id / max(P.blocks, 1u);
    let b = id % max(P.blocks, 1u);
    let c0 = b * P.group;
    var len = 0u;
    if (live) {
        len = min(P.group, P.cols - c0);
    }
    let xbase = P.x_offset + p * P.cols + c0;
    var m = 0u;
    for (var i = li; i < len; i = i + 64u) {
        m = max(m, bitcast<u32>(X[xbase + i]) & 0x7fffffffu);
    }
    red[li] = m;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
            red[li] = max(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let amax_bits = red[0];
    if (!live) {
        return;
    }
    var d = 0.0;
    var inv = 0.0;
    var on = false;
    if (amax_bits >= 0x7f800000u) {
        d = f32_bits(F32_NAN);
    } else if (amax_bits >= 0x1f800000u) {
        let amax = bitcast<f32>(amax_bits);
        inv = div_cr(127.0, amax);
        d = div_cr(amax, 127.0);
        on = true;
    }
    let gw = (P.group + 3u) / 4u;
    let qbase = p * P.q_words + b * gw;
    for (var w = li; w < gw; w = w + 64u) {
        var word = 0u;
        for (var k = 0u; k < 4u; k = k + 1u) {
            let i = w * 4u + k;
            if (on && i < len) {
                let q = round_q(opq(X[xbase + i] * inv));
                word = word | ((bitcast<u32>(q) & 0xffu) << (8u * k));
            }
        }
        Q[qbase + w] = word;
    }
    if (li == 0u) {
        Q[P.d_offset + p * P.blocks + b] = bitcast<u32>(d);
    }
}
