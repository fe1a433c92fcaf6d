// qmatmul_dp4a.wgsl — qmatmul.wgsl with its integer dot products done four at a time by
// dot4I8Packed (the WGSL language extension packed_4x8_integer_dot_product: one DP4a
// instruction where the GPU has it, a polyfill elsewhere). Chosen by gpu::ops::matmul when
// the WGSL implementation reports the extension and the group is whole words (int8: a
// multiple of 4, int4: of 8); the same integers, so the same bits as qmatmul.wgsl and the
// CPU (qdot::dot_row_scalar).
//
// int8 rows: a stored word already holds four two's-complement weights. int4 rows: a word
// holds eight nibbles q + 8 (element 2j low nibble of byte j); each half is spread to four
// bytes and turned into signed bytes q (see int4_bytes). quantize_act.wgsl's words hold four
// activations of a block, zero past its end, so a word that runs past the block's (or the
// row's padded) end adds nothing.
//
// The float part is qmatmul.wgsl's: lane l (= b mod 8) accumulates its blocks in increasing
// b, acc += opq(opq(ws_b * d_b) * f32(isum_b)), lanes combined by reduce8.
//
// Q4K rows (DTYPE 6): the nibbles u as they are (spread to bytes, all below 128), s_b =
// dot4I8Packed(0x01010101, q), and qmatmul.wgsl's Q4K float step. Q5K rows (DTYPE 7): Q4K's,
// each byte's fifth bit (k5_word, spread by fifth_bytes) or-ed in as 16: u = 0..31, still
// below 128, so dot4I8Packed stays exact.
//
// Preludes: common/arith.wgsl, common/weights.wgsl (W, DTYPE 3, 4, 6 or 7, GROUP, wscale,
// k_rows, k5_word, k4_factors).
// Bindings: as qmatmul.wgsl, with the same Params. Workgroup and Dispatch: as qmatmul.wgsl.

struct Params {
    zero: u32,
    rows: u32,
    cols: u32,
    n: u32,
    row_words: u32,
    q_words: u32,
    d_offset: u32,
    y_offset: u32,
    y_stride: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> Q: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const NB: u32 = 8u;
// (row in workgroup, lane, position in batch)
var<workgroup> partial: array<f32, 512>;

// Four int4 weights (the nibbles q + 8 in the low 16 bits of h, element order) as four
// signed bytes q: spread the nibbles to bytes, then n ^ 8 is q as a 4-bit two's complement
// number, sign-extended to 8 bits by or-ing 0xf0 where its bit 3 is set (0x08 * 30 = 0xf0,
// no carry between bytes).
fn int4_bytes(h: u32) -> u32 {
    let s = nibble_bytes(h) ^ 0x08080808u;
    return s | ((s & 0x08080808u) * 30u);
}

// The four nibbles in the low 16 bits of h, one per byte (0..15).
fn nibble_bytes(h: u32) -> u32 {
    let y = (h | (h << 8u)) & 0x00ff00ffu;
    return (y | (y << 4u)) & 0x0f0f0f0fu;
}

// The four weights of a nibble row in the low 16 bits of h as signed bytes: int4's q, or
// Q4K's (Q5K's low four bits) u as stored.
fn weight_bytes(h: u32) -> u32 {
    if (k_rows()) {
        return nibble_bytes(h);
    }
    return int4_bytes(h);
}

// Q5K: 16 times the four fifth bits in the low 16 bits of h (bits 0 and 1 of its two bytes,
// k5_word's order), one per byte: spread the bytes to halves, then bit 1 of each half to
// bit 8 (no other bit survives the mask).
fn fifth_bytes(h: u32) -> u32 {
    let y = (h | (h << 8u)) & 0x00ff00ffu;
    return ((y | (y << 7u)) & 0x01010101u) << 4u;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li & 7u;
    let rl = li >> 3u;
    let r = (wg.x + wg.y * P.groups_x) * 8u + rl;
    let live = r < P.rows;
    let blocks = (P.cols + GROUP - 1u) / GROUP;
    let gw = GROUP / 4u;
    // First word of row r's values (after its f16 scales, padded to a word).
    let vbase = r * P.row_words + (blocks + 1u) / 2u;
    for (var p0 = 0u; p0 < P.n; p0 = p0 + NB) {
        let nb = min(NB, P.n - p0);
        var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        if (live) {
            for (var b = lane; b < blocks; b = b + 8u) {
                let c0 = b * GROUP;
                let len = min(GROUP, P.cols - c0);
                let qb = b * gw;
                var isum = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
                var ssum = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
                if (DTYPE == 3u) {
                    for (var k = 0u; k < (len + 3u) / 4u; k = k + 1u) {
                        let w = W[vbase + c0 / 4u + k];
                        for (var pb = 0u; pb < nb; pb = pb + 1u) {
                            isum[pb] = isum[pb] + dot4I8Packed(w, Q[(p0 + pb) * P.q_words + qb + k]);
                        }
                    }
                } else {
                    for (var k = 0u; k < (len + 7u) / 8u; k = k + 1u) {
                        let w = W[vbase + c0 / 8u + k];
                        var lo = weight_bytes(w & 0xffffu);
                        var hi = weight_bytes(w >> 16u);
                        if (DTYPE == 7u) {
                            let h = k5_word(r, c0 + 8u * k, P.cols, P.row_words);
                            lo = lo | fifth_bytes(h & 0xffffu);
                            hi = hi | fifth_bytes(h >> 16u);
                        }
                        for (var pb = 0u; pb < nb; pb = pb + 1u) {
                            let qi = (p0 + pb) * P.q_words + qb + 2u * k;
                            isum[pb] = isum[pb] + dot4I8Packed(lo, Q[qi]) + dot4I8Packed(hi, Q[qi + 1u]);
                            if (k_rows()) {
                                ssum[pb] = ssum[pb] + dot4I8Packed(0x01010101u, Q[qi])
                                    + dot4I8Packed(0x01010101u, Q[qi + 1u]);
                            }
                        }
                    }
                }
                if (k_rows()) {
                    let f = k4_factors(r, b, P.row_words);
                    for (var pb = 0u; pb < nb; pb = pb + 1u) {
                        let d = bitcast<f32>(Q[P.d_offset + (p0 + pb) * blocks + b]);
                        acc[pb] = acc[pb] + k4_term(f, d, isum[pb], ssum[pb]);
                    }
                } else {
                    let ws = wscale(r, b, P.cols, P.row_words);
                    for (var pb = 0u; pb < nb; pb = pb + 1u) {
                        let d = bitcast<f32>(Q[P.d_offset + (p0 + pb) * blocks + b]);
                        acc[pb] = acc[pb] + opq(opq(ws * d) * f32(isum[pb]));
                    }
                }
            }
        }
        for (var b = 0u; b < NB; b = b + 1u) {
            partial[li * NB + b] = acc[b];
        }
        workgroupBarrier();
        // Thread (rl, lane) now combines the eight lanes of position p0 + lane.
        if (live && lane < nb) {
            var lanes: array<f32, 8>;
            for (var l = 0u; l < 8u; l = l + 1u) {
                lanes[l] = partial[(rl * 8u + l) * NB + lane];
            }
            Y[P.y_offset + (p0 + lane) * P.y_stride + r] = reduce8(lanes);
        }
        workgroupBarrier();
    }
}
