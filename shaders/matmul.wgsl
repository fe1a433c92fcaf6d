// matmul.wgsl — Y[p, row0 + r] = sum_c W[r, c] * X[p, c] for one row block of a weight
// matrix and n positions: matrix-vector (n = 1) and small-batch matrix products.
//
// Reduction order = math::dot: lane l (= c mod 8) accumulates its columns in increasing
// order, each product rounded before the add (opq), lanes combined by reduce8. Each
// thread of a row owns one lane, so the CPU's order is reproduced exactly.
//
// Preludes: common/arith.wgsl, common/weights.wgsl (W, DTYPE, GROUP, wval).
// Bindings:
//   0 P  uniform Params
//   1 W  storage read   u32 [rows * row_words]  one row block, stored dtype (weights.wgsl)
//   2 X  storage read   f32 [x_offset + n * cols]
//   3 Y  storage rw     f32 [y_offset + n * y_stride]
// Workgroup: 64 threads = 8 rows x 8 lanes; positions are done 8 at a time so each
// weight is decoded once per 8 positions.
// Dispatch: ceil(rows / 8) workgroups, as (min(that, 65535), ceil(that / 65535)) with
//   groups_x = the x count.

struct Params {
    zero: u32,
    rows: u32,
    cols: u32,
    n: u32,
    row_words: u32,
    x_offset: u32,
    y_offset: u32,
    y_stride: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const NB: u32 = 8u;
// (row in workgroup, lane, position in batch)
var<workgroup> partial: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li & 7u;
    let rl = li >> 3u;
    let r = (wg.x + wg.y * P.groups_x) * 8u + rl;
    let live = r < P.rows;
    for (var p0 = 0u; p0 < P.n; p0 = p0 + NB) {
        let nb = min(NB, P.n - p0);
        var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        if (live) {
            for (var c = lane; c < P.cols; c = c + 8u) {
                let wv = wval(r, c, P.cols, P.row_words);
                let xc = P.x_offset + p0 * P.cols + c;
                for (var b = 0u; b < nb; b = b + 1u) {
                    acc[b] = acc[b] + opq(wv * X[xc + b * P.cols]);
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
