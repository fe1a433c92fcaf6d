// qmatmul.wgsl — Y[p, row0 + r] = sum over blocks of (ws_b * d_b) * isum_b for one row
// block of an int8/int4 weight matrix and n positions quantized by quantize_act.wgsl:
// the integer kernel of qdot::dot_row_scalar (engine/src/qdot/mod.rs).
//
// isum_b = sum_i q_i * w_i in i32 (exact in any order); the float part in the CPU's order:
// lane l (= b mod 8) accumulates its blocks in increasing b, acc += opq(opq(ws_b * d_b) *
// f32(isum_b)) (each product rounded, no fusion), lanes combined by reduce8. Each thread
// of a row owns one lane, so the CPU's bits are reproduced exactly.
//
// Q4K rows (DTYPE 6, GROUP 32; weights.wgsl): isum_b = sum u_i * q_i of the nibbles as
// stored and s_b = sum q_i, then acc += k4_term (A_b * d_b) * f32(isum_b) - B_b * (d_b *
// f32(s_b)): qdot::dot_row_scalar's Q4K step. Q5K rows (DTYPE 7): the same, u = nibble +
// 16 * fifth bit (wint; up to 31, |isum_b| < 2^24).
//
// Preludes: common/arith.wgsl, common/weights.wgsl (W, DTYPE 3, 4, 6 or 7, GROUP, wint,
// wscale, k_rows, k4_factors).
// Bindings:
//   0 P  uniform Params
//   1 W  storage read   u32 [rows * row_words]  one row block, int8 or int4 (weights.wgsl)
//   2 Q  storage read   u32 quantized activations (quantize_act.wgsl's layout)
//   3 Y  storage rw     f32 [y_offset + n * y_stride]
// Workgroup: 64 threads = 8 rows x 8 lanes; positions 8 at a time, so each weight is
// decoded once per 8 positions.
// Dispatch: ceil(rows / 8) workgroups, as (min(that, 65535), ceil(that / 65535)) with
//   groups_x = the x count.

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

// Signed byte k of word v.
fn sbyte(v: u32, k: u32) -> i32 {
    return bitcast<i32>(v << (24u - 8u * k)) >> 24u;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li & 7u;
    let rl = li >> 3u;
    let r = (wg.x + wg.y * P.groups_x) * 8u + rl;
    let live = r < P.rows;
    let blocks = (P.cols + GROUP - 1u) / GROUP;
    let gw = (GROUP + 3u) / 4u;
    for (var p0 = 0u; p0 < P.n; p0 = p0 + NB) {
        let nb = min(NB, P.n - p0);
        var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        if (live) {
            for (var b = lane; b < blocks; b = b + 8u) {
                let c0 = b * GROUP;
                let len = min(GROUP, P.cols - c0);
                var isum = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
                var ssum = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
                for (var i0 = 0u; i0 < len; i0 = i0 + 4u) {
                    var w: array<i32, 4>;
                    for (var k = 0u; k < 4u; k = k + 1u) {
                        w[k] = 0;
                        if (i0 + k < len) {
                            w[k] = wint(r, c0 + i0 + k, P.cols, P.row_words);
                        }
                    }
                    let qi = b * gw + i0 / 4u;
                    for (var pb = 0u; pb < nb; pb = pb + 1u) {
                        let v = Q[(p0 + pb) * P.q_words + qi];
                        isum[pb] = isum[pb] + w[0] * sbyte(v, 0u) + w[1] * sbyte(v, 1u) + w[2] * sbyte(v, 2u)
                            + w[3] * sbyte(v, 3u);
                        if (k_rows()) {
                            ssum[pb] = ssum[pb] + sbyte(v, 0u) + sbyte(v, 1u) + sbyte(v, 2u) + sbyte(v, 3u);
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
