//! Variants of the one-position Q4K / Q5K kernels (whole rows: group 32, runs of eight
//! blocks), timed next to the engine's (`run_k*` must give `run`'s checksum on KQUANT=4|5
//! or FORMATS rows; they return 0 on other rows). Both builds. What they showed (node 20
//! and Chromium 156, Intel Xeon, 2026-12-06) is the engine's `qdot::wasm_k::runs_k`: V8
//! loads a straight-line body's vectors first and spills them, and a volatile store per
//! pair of blocks (`BAR`) keeps each pair's loads after the previous pair's work (Q5K
//! relaxed 11.5 -> 15.9 Gvalues/s in node); the header's product in 16-bit lanes with an
//! opaque multiplier (`HDR` 1) instead of LLVM's 8 scalar shifts.
use core::arch::wasm32::*;

use colibri_engine::qdot::ActQ;

#[inline(always)]
fn reduce8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

#[derive(Clone, Copy)]
struct Kc {
    low4: v128,
    five: v128,
    mul: v128,
    six: v128,
}

/// Lanes: 32-bit partial sums of lo (x0) and hi (x1) products; `W32`: the relaxed 32-bit
/// form (else the 16-bit one, `qdot::wasm_form`).
#[inline(always)]
fn pair<const W32: bool>(lo: v128, hi: v128, x0: v128, x1: v128, kc: &Kc) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    {
        let _ = kc;
        if W32 {
            // The 32-bit form.
            return i32x4_relaxed_dot_i8x16_i7x16_add(
                x1,
                hi,
                i32x4_relaxed_dot_i8x16_i7x16_add(x0, lo, i32x4_splat(0)),
            );
        }
        let s = i16x8_add(i16x8_relaxed_dot_i8x16_i7x16(x0, lo), i16x8_relaxed_dot_i8x16_i7x16(x1, hi));
        i32x4_extadd_pairwise_i16x8(s)
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        let _ = kc;
        let a = i32x4_dot_i16x8(u16x8_extend_low_u8x16(lo), i16x8_extend_low_i8x16(x0));
        let b = i32x4_dot_i16x8(u16x8_extend_high_u8x16(lo), i16x8_extend_high_i8x16(x0));
        let c = i32x4_dot_i16x8(u16x8_extend_low_u8x16(hi), i16x8_extend_low_i8x16(x1));
        let d = i32x4_dot_i16x8(u16x8_extend_high_u8x16(hi), i16x8_extend_high_i8x16(x1));
        i32x4_add(i32x4_add(a, b), i32x4_add(c, d))
    }
}

/// Fifth bits of sub-block J (0..4 within its half) at 0x10: (lo, hi).
#[inline(always)]
fn fifth<const J: u32>(h: v128, kc: &Kc) -> (v128, v128) {
    let lo = match J {
        0 => u16x8_shl(h, 4),
        1 => u16x8_shl(h, 2),
        2 => h,
        _ => u16x8_shr(h, 2),
    };
    let hi = match J {
        0 => u16x8_shl(h, 3),
        1 => u16x8_shl(h, 1),
        2 => u16x8_shr(h, 1),
        _ => u16x8_shr(h, 3),
    };
    (v128_and(lo, kc.five), v128_and(hi, kc.five))
}

#[inline(always)]
unsafe fn block<const K5: bool, const J: u32, const W32: bool>(v: *const u8, q: *const u8, h: v128, kc: &Kc) -> v128 {
    let bytes = ld(v.add(16 * J as usize));
    let (x0, x1) = (ld(q.add(32 * J as usize)), ld(q.add(32 * J as usize + 16)));
    let mut lo = v128_and(bytes, kc.low4);
    let mut hi = v128_and(u16x8_shr(bytes, 4), kc.low4);
    if K5 {
        let (l5, h5) = fifth::<J>(h, kc);
        lo = v128_or(lo, l5);
        hi = v128_or(hi, h5);
    }
    pair::<W32>(lo, hi, x0, x1, kc)
}

#[inline(always)]
fn hpair(s0: v128, s1: v128) -> v128 {
    i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s0, s1), i32x4_shuffle::<2, 6, 3, 7>(s0, s1))
}

#[inline(always)]
fn hjoin(t0: v128, t1: v128) -> v128 {
    i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(t0, t1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1))
}

/// A store V8 keeps in place (an effect): the loads after it stay after it and `v` is
/// computed before it.
#[inline(always)]
fn barrier(sink: &mut v128, v: v128) {
    // SAFETY: `sink` is a valid v128.
    unsafe { core::ptr::write_volatile(sink, v) }
}

/// Integer sums of four blocks (v: their nibbles, q: activations, h: fifth bits).
#[inline(always)]
unsafe fn quad<const K5: bool, const W32: bool, const BAR: u32>(
    v: *const u8,
    q: *const u8,
    h: v128,
    kc: &Kc,
    sink: &mut v128,
) -> v128 {
    let s0 = block::<K5, 0, W32>(v, q, h, kc);
    if BAR == 1 {
        barrier(sink, s0);
    }
    let s1 = block::<K5, 1, W32>(v, q, h, kc);
    let t0 = hpair(s0, s1);
    if BAR >= 1 {
        barrier(sink, t0);
    }
    let s2 = block::<K5, 2, W32>(v, q, h, kc);
    if BAR == 1 {
        barrier(sink, s2);
    }
    let s3 = block::<K5, 3, W32>(v, q, h, kc);
    let t1 = hpair(s2, s3);
    if BAR >= 1 {
        barrier(sink, t1);
    }
    hjoin(t0, t1)
}

const K4_INDEX: [u8; 32] = {
    let mut t = [0xffu8; 32];
    let mut j = 0;
    while j < 8 {
        let at = 4 + 6 * j / 8;
        t[4 * j] = at as u8;
        t[4 * j + 1] = at as u8 + 1;
        t[4 * j + 2] = at as u8 + 6;
        if at + 7 < 16 {
            t[4 * j + 3] = at as u8 + 7;
        }
        j += 1;
    }
    t
};

/// `half::f16::to_f32`'s bits: exponent and mantissa moved into place times 2^112 (exact
/// for normal and subnormal values), infinities and NaNs (quieted) by hand.
#[inline(always)]
fn f16(h: u16) -> f32 {
    let (sign, em) = ((h as u32 & 0x8000) << 16, h as u32 & 0x7fff);
    if em >= 0x7c00 {
        let man = (em & 0x3ff) << 13;
        return f32::from_bits(sign | 0x7f80_0000 | man | if man != 0 { 0x40_0000 } else { 0 });
    }
    f32::from_bits(sign | (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits())
}

/// Header factors: (A 0-3, B 0-3, A 4-7, B 4-7).
#[inline(always)]
unsafe fn header<const HDR: u32>(head: *const u8, kc: &Kc) -> [v128; 4] {
    let v = ld(head);
    let half = |i: usize| f16(u16::from_le_bytes([*head.add(i), *head.add(i + 1)]));
    let (d, dmin) = (f32x4_splat(half(0)), f32x4_splat(half(2)));
    let mut out = [f32x4_splat(0.0); 4];
    for h in 0..2 {
        let idx = ld(K4_INDEX[16 * h..].as_ptr());
        let (sc, m) = if HDR == 0 {
            let w = u32x4_shr(i32x4_mul(i8x16_swizzle(v, idx), i32x4(256, 4, 16, 64)), 8);
            (v128_and(w, i32x4_splat(63)), v128_and(u32x4_shr(w, 16), i32x4_splat(63)))
        } else {
            // 16-bit halves: sc's two bytes below, m's above, each at bit s = 6j mod 8:
            // times 2^(8 - s) and >> 8 bring the field to bit 0 of its half.
            let w = v128_and(u16x8_shr(i16x8_mul(i8x16_swizzle(v, idx), kc.mul), 8), kc.six);
            (v128_and(w, i32x4_splat(0xffff)), u32x4_shr(w, 16))
        };
        out[2 * h] = f32x4_mul(d, f32x4_convert_i32x4(sc));
        out[2 * h + 1] = f32x4_mul(dmin, f32x4_convert_i32x4(m));
    }
    out
}

/// One Q4K/Q5K row times position 0.
#[inline(never)]
pub fn dot_k<const K5: bool, const W32: bool, const HDR: u32, const BAR: u32>(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    let runs = blocks / 8;
    assert!(blocks % 8 == 0 && a.group == 32 && row.len() >= runs * (144 + if K5 { 32 } else { 0 }));
    assert!(a.q.len() >= blocks * 32 && a.d.len() >= blocks && a.ds.len() >= blocks);
    let kc = core::hint::black_box(Kc {
        low4: u8x16_splat(15),
        five: u8x16_splat(0x10),
        mul: i16x8(256, 256, 4, 4, 16, 16, 64, 64),
        six: i16x8_splat(63),
    });
    let head = row.as_ptr();
    // SAFETY: inside the row (asserted above), and the activations likewise.
    unsafe {
        let vals = head.add(16 * runs);
        let high = vals.add(128 * runs);
        let (q, d, ds) = (a.q.as_ptr() as *const u8, a.d.as_ptr(), a.ds.as_ptr());
        let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
        let zero = f32x4_splat(0.0);
        let mut sink = zero;
        for r in 0..runs {
            let [a0, b0, a1, b1] = header::<HDR>(head.add(16 * r), &kc);
            let (v, qq) = (vals.add(128 * r), q.add(256 * r));
            let h0 = if K5 { ld(high.add(32 * r)) } else { zero };
            let i0 = quad::<K5, W32, BAR>(v, qq, h0, &kc, &mut sink);
            let (d0, s0) = (ld(d.add(8 * r) as *const u8), ld(ds.add(8 * r) as *const u8));
            acc0 = f32x4_add(acc0, f32x4_sub(f32x4_mul(f32x4_mul(a0, d0), f32x4_convert_i32x4(i0)), f32x4_mul(b0, s0)));
            let h1 = if K5 { ld(high.add(32 * r + 16)) } else { zero };
            let i1 = quad::<K5, W32, BAR>(v.add(64), qq.add(128), h1, &kc, &mut sink);
            let (d1, s1) = (ld(d.add(8 * r + 4) as *const u8), ld(ds.add(8 * r + 4) as *const u8));
            acc1 = f32x4_add(acc1, f32x4_sub(f32x4_mul(f32x4_mul(a1, d1), f32x4_convert_i32x4(i1)), f32x4_mul(b1, s1)));
        }
        let mut out = [0.0f32; 8];
        v128_store(out.as_mut_ptr() as *mut v128, acc0);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc1);
        reduce8(out)
    }
}
