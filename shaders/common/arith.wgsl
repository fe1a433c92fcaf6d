// arith.wgsl — shared prelude (not a kernel): arithmetic that gives the CPU's bits.
//
// Prepended to every kernel that needs it (see engine/src/gpu/kernels.rs). It relies on
// the kernel declaring `var<uniform> P` whose struct has a field `zero: u32` that the
// host always sets to 0.
//
// Why these exist (the CPU reference is engine/src/math.rs and kernels.rs):
// - The WGSL spec lets a compiler fuse a*b+c into an fma and reassociate float math.
//   `opq(x)` xors x's bits with P.zero, a value the compiler cannot know, so a product
//   wrapped in opq() is rounded to f32 before it is added: no fusion, the CPU's bits.
// - WGSL division is only accurate to 2.5 ulp and sqrt to ~2 ulp. `div_cr` and
//   `sqrt_cr` compute the correctly rounded IEEE results (what the CPU gets) with
//   integer arithmetic only, so every GPU agrees.
// - `det_exp` is math::exp ported literally: only add/sub/mul (correctly rounded in
//   WGSL), floor and bit manipulation, with every product passed through opq().
// - `det_log1p` is libm's log1pf ported line for line; `det_softplus` is
//   deltanet::softplus (torch's threshold 20, log1p(det_exp(x)) below it).
// Subnormals: WGSL may flush them, so results below 2^-126 are flushed to (signed) zero
// and subnormal inputs count as zero; the CPU keeps them, a difference below 1.2e-38.

fn opq(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ P.zero);
}

fn is_nan_f32(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

const F32_INF: u32 = 0x7f800000u;
const F32_NAN: u32 = 0x7fc00000u;

// The f32 with these bits, made at run time: WGSL rejects a constant expression whose
// value is infinite or NaN (Tint enforces it; naga does not), so inf and NaN are built
// through P.zero like opq().
fn f32_bits(bits: u32) -> f32 {
    return bitcast<f32>(bits ^ P.zero);
}

// The engine's dot-product lane combine: ((0+4)+(2+6))+((1+5)+(3+7)).
fn reduce8(a: array<f32, 8>) -> f32 {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// math::exp: x = k ln2 + r, degree-7 Taylor polynomial of e^r, times 2^k.
fn det_exp(x: f32) -> f32 {
    if (is_nan_f32(x)) {
        return x;
    }
    if (x > bitcast<f32>(0x42b17217u)) { // 88.72283
        return f32_bits(F32_INF);
    }
    if (x < bitcast<f32>(0xc2aeac4fu)) { // -87.33654
        return 0.0;
    }
    let log2e = bitcast<f32>(0x3fb8aa3bu);
    let ln2_hi = bitcast<f32>(0x3f318000u);
    let ln2_lo = bitcast<f32>(0xb95e8083u);
    let k = floor(opq(x * log2e) + 0.5);
    let r = (x - opq(k * ln2_hi)) - opq(k * ln2_lo);
    var p = bitcast<f32>(0x39500d01u); // 1/5040
    p = bitcast<f32>(0x3ab60b61u) + opq(r * p); // 1/720
    p = bitcast<f32>(0x3c088889u) + opq(r * p); // 1/120
    p = bitcast<f32>(0x3d2aaaabu) + opq(r * p); // 1/24
    p = bitcast<f32>(0x3e2aaaabu) + opq(r * p); // 1/6
    p = 0.5 + opq(r * p);
    p = 1.0 + opq(r * p);
    p = 1.0 + opq(r * p);
    let ki = i32(k); // in [-126, 128]
    if (ki > 127) {
        return opq(p * bitcast<f32>(254u << 23u)) * 2.0;
    }
    return p * bitcast<f32>(u32(ki + 127) << 23u);
}

// Correctly rounded a / b (round to nearest even) by 24-step integer long division.
fn div_cr(a: f32, b: f32) -> f32 {
    let ba = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let sign = (ba ^ bb) & 0x80000000u;
    let ea = (ba >> 23u) & 0xffu;
    let eb = (bb >> 23u) & 0xffu;
    let a_nan = ea == 0xffu && (ba & 0x7fffffu) != 0u;
    let b_nan = eb == 0xffu && (bb & 0x7fffffu) != 0u;
    if (a_nan || b_nan) {
        return f32_bits(F32_NAN);
    }
    let a_inf = ea == 0xffu;
    let b_inf = eb == 0xffu;
    let a_zero = ea == 0u; // subnormals count as zero
    let b_zero = eb == 0u;
    if ((a_inf && b_inf) || (a_zero && b_zero)) {
        return f32_bits(F32_NAN);
    }
    if (a_inf || b_zero) {
        return bitcast<f32>(sign | F32_INF);
    }
    if (a_zero || b_inf) {
        return bitcast<f32>(sign);
    }
    var ma = (ba & 0x7fffffu) | 0x800000u;
    let mb = (bb & 0x7fffffu) | 0x800000u;
    var e = i32(ea) - i32(eb);
    if (ma < mb) {
        ma = ma << 1u;
        e = e - 1;
    }
    // ma / mb in [1, 2): 24 quotient bits, then the remainder decides the rounding.
    var q = 0u;
    var r = ma;
    for (var i = 0u; i < 24u; i = i + 1u) {
        q = q << 1u;
        if (r >= mb) {
            r = r - mb;
            q = q | 1u;
        }
        r = r << 1u;
    }
    if (r > mb || (r == mb && (q & 1u) == 1u)) {
        q = q + 1u;
        if (q == 0x1000000u) {
            q = 0x800000u;
            e = e + 1;
        }
    }
    let be = e + 127;
    if (be >= 255) {
        return bitcast<f32>(sign | F32_INF);
    }
    if (be <= 0) {
        return bitcast<f32>(sign);
    }
    return bitcast<f32>(sign | (u32(be) << 23u) | (q & 0x7fffffu));
}

// Correctly rounded sqrt(x) by the digit-by-digit integer square root of a 48-bit radicand.
fn sqrt_cr(x: f32) -> f32 {
    let bx = bitcast<u32>(x);
    let ex = (bx >> 23u) & 0xffu;
    if (ex == 0u) {
        return bitcast<f32>(bx & 0x80000000u); // +-0 (and flushed subnormals)
    }
    if ((bx & 0x80000000u) != 0u || is_nan_f32(x)) {
        return f32_bits(F32_NAN);
    }
    if (ex == 0xffu) {
        return x; // +inf
    }
    var m = (bx & 0x7fffffu) | 0x800000u;
    var e = i32(ex) - 150; // x = m * 2^e
    if ((e & 1) != 0) {
        m = m << 1u;
        e = e - 1;
    }
    // Radicand m * 2^k with k even, chosen so the root has exactly 24 bits.
    var k = 24u;
    if (m >= 0x1000000u) {
        k = 22u;
    }
    let hi = m >> (32u - k);
    let lo = m << k;
    var root = 0u;
    var rem = 0u;
    for (var i = 0u; i < 24u; i = i + 1u) {
        let j = 23u - i; // bit pair 2j+1..2j of the radicand
        var pair = 0u;
        if (j >= 16u) {
            pair = (hi >> (2u * j - 32u)) & 3u;
        } else {
            pair = (lo >> (2u * j)) & 3u;
        }
        rem = (rem << 2u) | pair;
        let trial = (root << 2u) | 1u;
        if (rem >= trial) {
            rem = rem - trial;
            root = (root << 1u) | 1u;
        } else {
            root = root << 1u;
        }
    }
    // sqrt = root + f with rem = R - root^2; round up iff f > 1/2 iff rem > root.
    var be = 150 + (e - i32(k)) / 2;
    if (rem > root) {
        root = root + 1u;
        if (root == 0x1000000u) {
            root = 0x800000u;
            be = be + 1;
        }
    }
    return bitcast<f32>((u32(be) << 23u) | (root & 0x7fffffu));
}

// math::sigmoid: 1 / (1 + e^-x).
fn det_sigmoid(x: f32) -> f32 {
    return div_cr(1.0, 1.0 + det_exp(-x));
}

// math::silu: x / (1 + e^-x).
fn det_silu(x: f32) -> f32 {
    return div_cr(x, 1.0 + det_exp(-x));
}

// libm::log1pf (FreeBSD's s_log1pf.c, what the CPU calls) ported line for line: the
// same branches, constants as bit patterns, every product rounded before it is added
// (opq), its two divisions correctly rounded (div_cr), and the compensation terms'
// differences pinned (opq) so no compiler may reassociate them.
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

// torch's softplus as deltanet::softplus computes it: x above 20, else log1p(exp(x)).
fn det_softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return det_log1p(det_exp(x));
}
