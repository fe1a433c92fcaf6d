// mxfp4_matmul.wgsl — Y[p, row0 + r] = dot(W[r, :], X[p, :]) for one row block of an
// MXFP4 weight matrix and n positions quantized by quantize_act16.wgsl: the integer
// kernel of qdot::mxfp4::dot_row_scalar (engine/src/qdot/mxfp4/mod.rs).
//
// Row layout (tensor.rs, DType::Mxfp4): [e8m0 scales, one byte per block of 32, padded
// to 4 bytes][16 bytes per block: element 2j in the low nibble of byte j, 2j + 1 in the
// high one]. Doubled, an e2m1 nibble is an integer k in -12..=12. Per block b:
//   hsum_b = sum k_i h_i, lsum_b = sum k_i l_i in i32 (exact in any order);
// the float part in the CPU's order: lane b mod 8 accumulates its blocks in increasing
// b, acc += (e8m0_half(s_b) * d_b) * (f32(hsum_b) + f32(lsum_b) * 2^-16), every product
// and sum rounded on its own (opq), lanes combined by reduce8. Each thread of a row owns
// one lane, so the CPU's bits are reproduced exactly. (Scale bytes 0 and 1 are f32
// subnormals, 2^-128 and 2^-127, which a GPU may flush to zero; no real checkpoint
// scales weights that small.)
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P  uniform Params
//   1 W  storage read   u32 [rows * row_words]  one row block of MXFP4 rows
//   2 Q  storage read   u32 quantized activations (quantize_act16.wgsl's layout)
//   3 Y  storage rw     f32 [y_offset + n * y_stride]
// Workgroup: 64 threads = 8 rows x 8 lanes; positions 8 at a time, so each weight is
// decoded once per 8 positions.
// Dispatch: ceil(rows / 8) workgroups, split (x, y) with groups_x.

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

// The doubled e2m1 value of a nibble: 0 1 2 3 4 6 8 12, negative with bit 3.
fn e2m1x2(nib: u32) -> i32 {
    let m = nib & 7u;
    var v = i32(m);
    if (m >= 4u) {
        v = i32(2u + (m & 1u)) << ((m >> 1u) - 1u);
    }
    if ((nib & 8u) != 0u) {
        v = -v;
    }
    return v;
}

// 2^(e - 128): half the value of an e8m0 scale byte (tensor::e8m0_half).
fn e8m0_half(e: u32) -> f32 {
    if (e < 2u) {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

// Signed 16-bit half k (0 low, 1 high) of word v.
fn shalf(v: u32, k: u32) -> i32 {
    return bitcast<i32>(v << (16u - 16u * k)) >> 16u;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li & 7u;
    let rl = li >> 3u;
    let r = (wg.x + wg.y * P.groups_x) * 8u + rl;
    let live = r < P.rows;
    let blocks = P.cols / 32u;
    let vbase = r * P.row_words + (blocks + 3u) / 4u;
    let lo_unit = bitcast<f32>(0x37800000u); // 2^-16
    for (var p0 = 0u; p0 < P.n; p0 = p0 + NB) {
        let nb = min(NB, P.n - p0);
        var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        if (live) {
            for (var b = lane; b < blocks; b = b + 8u) {
                var hs = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
                var ls = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
                for (var w = 0u; w < 4u; w = w + 1u) {
                    let word = W[vbase + b * 4u + w];
                    for (var k = 0u; k < 4u; k = k + 1u) {
                        let byte = (word >> (8u * k)) & 0xffu;
                        let k0 = e2m1x2(byte & 15u);
                        let k1 = e2m1x2(byte >> 4u);
                        let j = w * 4u + k;
                        for (var pb = 0u; pb < nb; pb = pb + 1u) {
                            let qb = (p0 + pb) * P.q_words + b * 32u;
                            let hv = Q[qb + j];
                            let lv = Q[qb + 16u + j];
                            hs[pb] = hs[pb] + k0 * shalf(hv, 0u) + k1 * shalf(hv, 1u);
                            ls[pb] = ls[pb] + k0 * shalf(lv, 0u) + k1 * shalf(lv, 1u);
                        }
                    }
                }
                let s = e8m0_half((W[r * P.row_words + b / 4u] >> (8u * (b & 3u))) & 0xffu);
                for (var pb = 0u; pb < nb; pb = pb + 1u) {
                    let d = bitcast<f32>(Q[P.d_offset + (p0 + pb) * blocks + b]);
                    let sums = opq(f32(hs[pb]) + opq(f32(ls[pb]) * lo_unit));
                    acc[pb] = acc[pb] + opq(opq(s * d) * sums);
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
