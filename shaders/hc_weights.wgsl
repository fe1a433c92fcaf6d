// hc_weights.wgsl — DeepSeek-V4's hyper-connection weights of each position from its mixes,
// as v4::hc::weights computes them (one thread per position, every sum in index order):
//   pre_j  = sigmoid(mix_j s0 + b_j) + eps
//   post_j = 2 sigmoid(mix_{N+j} s1 + b_{N+j})
//   comb   = softmax per row of (mix_{2N + jN + k} s2 + b_{2N + jN + k}), + eps, columns
//            divided by (column sum + eps); then iters - 1 times rows, then columns, divided
//            by (sum + eps) (Sinkhorn-Knopp).
// With head = 1 only pre (v4::hc::head_pre: mixes of N floats per position, s0, b_j).
// Products are rounded before their adds (opq), sigmoid / exp are det_sigmoid / det_exp
// (math::sigmoid, math::exp), divisions correctly rounded (div_cr).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P     uniform Params
//   1 MIX   storage read  f32 [n, (2 + N) N]   ([n, N] with head)
//   2 BASE  storage read  f32 [(2 + N) N]      ([N] with head)
//   3 SCALE storage read  f32 [3]              ([1] with head)
//   4 PRE   storage rw    f32 [n, N]
//   5 POST  storage rw    f32 [n, N]           (unused with head)
//   6 COMB  storage rw    f32 [n, N, N]        (unused with head)
// Workgroup: 64 threads, one per position.
// Dispatch: ceil(n / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_hc: u32,
    iters: u32,
    head: u32,
    eps_bits: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> MIX: array<f32>;
@group(0) @binding(2) var<storage, read> BASE: array<f32>;
@group(0) @binding(3) var<storage, read> SCALE: array<f32>;
@group(0) @binding(4) var<storage, read_write> PRE: array<f32>;
@group(0) @binding(5) var<storage, read_write> POST: array<f32>;
@group(0) @binding(6) var<storage, read_write> COMB: array<f32>;

// Divides column k of position p's comb by (its sum + eps).
fn normalise_columns(c0: u32, nhc: u32, eps: f32) {
    for (var k = 0u; k < nhc; k++) {
        var sum = 0.0;
        for (var j = 0u; j < nhc; j++) {
            sum = sum + COMB[c0 + j * nhc + k];
        }
        let d = sum + eps;
        for (var j = 0u; j < nhc; j++) {
            COMB[c0 + j * nhc + k] = div_cr(COMB[c0 + j * nhc + k], d);
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let p = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (p >= P.n) {
        return;
    }
    let nhc = P.n_hc;
    let eps = bitcast<f32>(P.eps_bits);
    if (P.head != 0u) {
        for (var j = 0u; j < nhc; j++) {
            PRE[p * nhc + j] = det_sigmoid(opq(MIX[p * nhc + j] * SCALE[0]) + BASE[j]) + eps;
        }
        return;
    }
    let m0 = p * (2u + nhc) * nhc;
    for (var j = 0u; j < nhc; j++) {
        PRE[p * nhc + j] = det_sigmoid(opq(MIX[m0 + j] * SCALE[0]) + BASE[j]) + eps;
        POST[p * nhc + j] = 2.0 * det_sigmoid(opq(MIX[m0 + nhc + j] * SCALE[1]) + BASE[nhc + j]);
    }
    let at = 2u * nhc;
    let c0 = p * nhc * nhc;
    for (var j = 0u; j < nhc; j++) {
        // The row's logits, then math::softmax: max, e^(v - max) summed in order, divided.
        var mx = f32_bits(0xff800000u); // -inf
        for (var k = 0u; k < nhc; k++) {
            let v = opq(MIX[m0 + at + j * nhc + k] * SCALE[2]) + BASE[at + j * nhc + k];
            COMB[c0 + j * nhc + k] = v;
            mx = max(mx, v);
        }
        var s = 0.0;
        for (var k = 0u; k < nhc; k++) {
            let e = det_exp(COMB[c0 + j * nhc + k] - mx);
            COMB[c0 + j * nhc + k] = e;
            s = s + e;
        }
        for (var k = 0u; k < nhc; k++) {
            COMB[c0 + j * nhc + k] = div_cr(COMB[c0 + j * nhc + k], s) + eps;
        }
    }
    normalise_columns(c0, nhc, eps);
    for (var it = 1u; it < P.iters; it++) {
        for (var j = 0u; j < nhc; j++) {
            var sum = 0.0;
            for (var k = 0u; k < nhc; k++) {
                sum = sum + COMB[c0 + j * nhc + k];
            }
            let d = sum + eps;
            for (var k = 0u; k < nhc; k++) {
                COMB[c0 + j * nhc + k] = div_cr(COMB[c0 + j * nhc + k], d);
            }
        }
        normalise_columns(c0, nhc, eps);
    }
}
