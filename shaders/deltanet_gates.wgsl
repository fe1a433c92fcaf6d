// deltanet_gates.wgsl — Gated DeltaNet's per-head gates, in place, as
// DeltaNetWeights::forward computes them (engine/src/model/deltanet.rs):
//   beta  = sigmoid(b)                                   (det_sigmoid)
//   decay = exp(neg_a[h] * softplus(a + dt_bias[h]))     (det_exp, the product rounded)
//   softplus(x) = x above 20 (torch's threshold), else log1p(exp(x)).
// log1p is the `libm` crate's log1pf (FreeBSD's s_log1pf.c, what the CPU calls) ported
// line for line: the same branches, constants as bit patterns, every product rounded
// before it is added (opq), its two divisions correctly rounded (div_cr), and the
// compensation terms' differences pinned (opq) so no compiler may reassociate them.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P    uniform Params
//   1 BA   storage rw    f32 [n, 2 * heads]: per position b of every value head, then a;
//                              becomes beta of every head, then decay
//   2 NA   storage read  f32 [heads]   -exp(A_log)
//   3 DT   storage read  f32 [heads]   dt_bias
// Workgroup: 64 threads, one per (position, head).
// Dispatch: ceil(n * heads / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    heads: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> BA: array<f32>;
@group(0) @binding(2) var<storage, read> NA: array<f32>;
@group(0) @binding(3) var<storage, read> DT: array<f32>;

// libm::log1pf.
fn det_log1p(x: f32) -> f32 {
    let ln2_hi = bitcast<f32>(0x3f317180u);
    let ln2_lo = bitcast<f32>(0x3717f7d1u);
    let lg1 = bitcast<f32>(0x3f2aaaaau);
    let lg2 = bitcast<f32>(0x3eccce13u);
    let lg3 = bitcast<f32>(0x3e91e9eeu);
    let lg4 = bitcast<f32>(0x3e789e26u);
    let ix = bitcast<u32>(x);
    var k = 1;
    var f = 0.0;
    var c = 0.0;
    if (ix < 0x3ed413d0u || (ix >> 31u) > 0u) {
        // 1 + x < sqrt(2)+
        if (ix >= 0xbf800000u) {
            // x <= -1: log1p(-1) = -inf, NaN below
            if (x == -1.0) {
                return f32_bits(0xff800000u);
            }
            return f32_bits(F32_NAN);
        }
        if ((ix << 1u) < (0x33800000u << 1u)) {
            // |x| < 2^-24
            return x;
        }
        if (ix <= 0xbe95f619u) {
            // sqrt(2)/2- <= 1 + x < sqrt(2)+
            k = 0;
            c = 0.0;
            f = x;
        }
    } else if (ix >= 0x7f800000u) {
        return x;
    }
    if (k > 0) {
        let u = opq(1.0 + x);
        var iu = bitcast<u32>(u) + (0x3f800000u - 0x3f3504f3u);
        k = i32(iu >> 23u) - 0x7f;
        // correction term ~ log(1+x) - log(u)
        if (k < 25) {
            if (k >= 2) {
                c = 1.0 - opq(u - x);
            } else {
                c = x - opq(u - 1.0);
            }
            c = div_cr(c, u);
        } else {
            c = 0.0;
        }
        // reduce u into [sqrt(2)/2, sqrt(2)]
        iu = (iu & 0x007fffffu) + 0x3f3504f3u;
        f = bitcast<f32>(iu) - 1.0;
    }
    let s = div_cr(f, 2.0 + f);
    let z = opq(s * s);
    let w = opq(z * z);
    let t1 = opq(w * (lg2 + opq(w * lg4)));
    let t2 = opq(z * (lg1 + opq(w * lg3)));
    let r = t2 + t1;
    let hfsq = opq(opq(0.5 * f) * f);
    let dk = f32(k);
    return (((opq(s * (hfsq + r)) + (opq(dk * ln2_lo) + c)) - hfsq) + f) + opq(dk * ln2_hi);
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return det_log1p(det_exp(x));
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (i >= P.n * P.heads) {
        return;
    }
    let t = i / P.heads;
    let h = i % P.heads;
    let at = t * 2u * P.heads + h;
    let b = BA[at];
    let a = BA[at + P.heads];
    BA[at] = det_sigmoid(b);
    BA[at + P.heads] = det_exp(opq(NA[h] * softplus(a + DT[h])));
}
