//! wasm SIMD128 rows prepared once for many positions (a prefill, [`super::dot_row_many`]):
//! int4, Q4K and Q5K rows unpacked into the interleaved layout ([`prepare_int4`]) and
//! applied to up to four positions at a time ([`dot_many_int4`]).

use core::arch::wasm32::*;

#[cfg(not(target_feature = "relaxed-simd"))]
use super::wasm::words16;
use super::wasm::{load16, scales4, Consts};
use super::wasm_k::{fifth16, k4_scales8, KConsts};
use super::{round4, ActQ, CHUNK};
use crate::math::reduce8;

/// Makes an int4 row ready for many positions: the nibble values 0..15 (a Q5K row's with
/// their fifth bits, [`fifth16`]: 0..=31) in the interleaved layout of [`ActQ::interleave`]
/// (the x86 `tile::prepare` layout): per run of eight blocks and chunk m, eight 32-byte
/// vectors whose 4-byte lane j holds four split-order values of block j. Zero past the
/// row's last value and block.
pub fn prepare_int4(row: &[u8], a: &ActQ, u: &mut Vec<u8>) {
    let g = a.group;
    let n = a.dstride() * g;
    let vals = &row[round4(a.blocks * 2)..];
    let stored = a.blocks * g;
    // Q5K (group 32): the fifth-bit bytes after the nibbles.
    let high = if a.k5 { vals.get(stored / 2..).unwrap_or(&[]) } else { &[][..] };
    if u.len() < n {
        u.resize(n, 0);
    }
    let kc = Consts::literal();
    let low4 = kc.low4;
    for b0 in (0..a.dstride()).step_by(8) {
        for m in 0..g / CHUNK {
            // Split-order values of chunk m of each block: even (lo) then odd (hi).
            let mut lo = [u8x16_splat(0); 8];
            let mut hi = [u8x16_splat(0); 8];
            for j in 0..8 {
                let c = (b0 + j) * g + m * CHUNK;
                if c < stored {
                    let bytes = load16::<true>(vals, c / 2);
                    lo[j] = v128_and(bytes, low4);
                    hi[j] = u8x16_shr(bytes, 4);
                    if a.k5 {
                        // Block b0 + j of 32 values (m = 0) is sub-block j of run b0 / 8.
                        let (l5, h5) = fifth16::<true>(high, b0 + j, &kc);
                        (lo[j], hi[j]) = (v128_or(lo[j], l5), v128_or(hi[j], h5));
                    }
                }
            }
            let dst = &mut u[b0 * g + m * 8 * CHUNK..][..8 * CHUNK];
            // Vector k (k < 4: words of lo, else of hi): low half blocks 0-3, high 4-7.
            for (half, src) in [(0usize, &lo), (4, &hi)] {
                let t0 = transpose4(src[0], src[1], src[2], src[3]);
                let t1 = transpose4(src[4], src[5], src[6], src[7]);
                for k in 0..4 {
                    let at = (half + k) * 32;
                    // SAFETY: `dst` holds 8 * 32 bytes; at + 32 <= 256; unaligned stores.
                    unsafe {
                        v128_store(dst.as_mut_ptr().add(at) as *mut v128, t0[k]);
                        v128_store(dst.as_mut_ptr().add(at + 16) as *mut v128, t1[k]);
                    }
                }
            }
        }
    }
}

/// 4 x 4 transpose of 32-bit lanes: lane j of out[k] = lane k of r_j.
#[inline(always)]
fn transpose4(r0: v128, r1: v128, r2: v128, r3: v128) -> [v128; 4] {
    let t0 = i32x4_shuffle::<0, 4, 1, 5>(r0, r1);
    let t1 = i32x4_shuffle::<2, 6, 3, 7>(r0, r1);
    let t2 = i32x4_shuffle::<0, 4, 1, 5>(r2, r3);
    let t3 = i32x4_shuffle::<2, 6, 3, 7>(r2, r3);
    [
        i32x4_shuffle::<0, 1, 4, 5>(t0, t2),
        i32x4_shuffle::<2, 3, 6, 7>(t0, t2),
        i32x4_shuffle::<0, 1, 4, 5>(t1, t3),
        i32x4_shuffle::<2, 3, 6, 7>(t1, t3),
    ]
}

/// A row prepared by [`prepare_int4`] times positions `p0..p0 + out.len()` (interleaved
/// activations), four at a time: each step adds four products of block j into
/// lane j, so a run of eight blocks ends with its sums in two vectors (blocks 0-3, 4-7), which
/// are exactly acc[0] and acc[1] of [`body`]: the reference's bits. A Q4K row (`a.k4`: the
/// same nibbles under Q4_K headers) takes the sums without int4's bias and its header's
/// float step, as `wasm_k::body_k` does; a Q5K row (`a.k5`) too, its fifth bits prepared.
pub fn dot_many_int4(u: &[u8], row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    let mut i = 0;
    while i < out.len() {
        let k = (out.len() - i).min(4);
        let o = &mut out[i..i + k];
        match (k, a.k4) {
            (4, false) => tile::<4, false>(u, row, a, p0 + i, o),
            (3, false) => tile::<3, false>(u, row, a, p0 + i, o),
            (2, false) => tile::<2, false>(u, row, a, p0 + i, o),
            (_, false) => tile::<1, false>(u, row, a, p0 + i, o),
            (4, true) => tile::<4, true>(u, row, a, p0 + i, o),
            (3, true) => tile::<3, true>(u, row, a, p0 + i, o),
            (2, true) => tile::<2, true>(u, row, a, p0 + i, o),
            (_, true) => tile::<1, true>(u, row, a, p0 + i, o),
        }
        i += k;
    }
}

#[inline(always)]
fn tile<const P: usize, const K: bool>(u: &[u8], row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    let (g, ds) = (a.group, a.dstride());
    let run = 8 * g;
    assert!(u.len() >= ds * g && a.qi.len() >= (p0 + P) * ds * g && out.len() >= P, "prepared shapes");
    // A Q4K row: group 32, whole runs of eight blocks (one header each), `ds` made.
    assert!(!K || (g == 32 && a.blocks.is_multiple_of(8) && a.ds.len() >= (p0 + P) * ds), "Q4K shapes");
    let mut qi = [a.qi.as_ptr(); P];
    for (i, q) in qi.iter_mut().enumerate() {
        // SAFETY: inside a.qi (asserted above).
        *q = unsafe { a.qi.as_ptr().add((p0 + i) * ds * g) };
    }
    let mut acc = [[f32x4_splat(0.0); 2]; P];
    let k = Consts::literal();
    let kk = KConsts::new();
    // Bytes of the steps whose i16 pair sums the relaxed loop keeps before widening.
    #[cfg(target_feature = "relaxed-simd")]
    let span = if K && a.k5 { 4 * 32 } else { 8 * 32 };
    let mut b0 = 0;
    while b0 < a.blocks {
        let nb = (a.blocks - b0).min(8);
        let mut lo = [i32x4_splat(0); P];
        let mut hi = [i32x4_splat(0); P];
        // int4 values are stored q + 8: each block starts from -8 * sum x (Q4K sums are of
        // the nibbles as stored: from zero).
        for i in 0..if K { 0 } else { P } {
            let s = &a.srow(p0 + i)[b0..b0 + 8];
            // SAFETY: `s` holds 8 i32 (bounds-checked slice).
            let (s0, s1) =
                unsafe { (v128_load(s.as_ptr() as *const v128), v128_load(s.as_ptr().add(4) as *const v128)) };
            lo[i] = i32x4_neg(i32x4_shl(s0, 3));
            hi[i] = i32x4_neg(i32x4_shl(s1, 3));
        }
        let base = b0 * g;
        let mut v = 0;
        #[cfg(target_feature = "relaxed-simd")]
        while v < run {
            // i16 pair sums of up to eight steps, widened once (a step adds one pair of at
            // most 2 * 15 * 127 = 3810 per lane, eight at most 30480 < 2^15: exact, as in
            // `block_lanes`); Q5K's values reach 31, a pair 2 * 31 * 127 = 7874, so four
            // steps (31496 < 2^15). Pairs (2k, 2k + 1) belong to word k, so the widening
            // pairwise add gives each block's lane its four products per step.
            let end = (v + span).min(run);
            let mut lo16 = [i16x8_splat(0); P];
            let mut hi16 = [i16x8_splat(0); P];
            while v < end {
                // SAFETY: base + v + 32 <= ds * g <= u.len() and the same for each position's
                // interleaved activations (asserted above).
                unsafe {
                    let w0 = v128_load(u.as_ptr().add(base + v) as *const v128);
                    let w1 = v128_load(u.as_ptr().add(base + v + 16) as *const v128);
                    for i in 0..P {
                        let x0 = v128_load(qi[i].add(base + v) as *const v128);
                        let x1 = v128_load(qi[i].add(base + v + 16) as *const v128);
                        lo16[i] = i16x8_add(lo16[i], i16x8_relaxed_dot_i8x16_i7x16(x0, w0));
                        hi16[i] = i16x8_add(hi16[i], i16x8_relaxed_dot_i8x16_i7x16(x1, w1));
                    }
                }
                v += 32;
            }
            for i in 0..P {
                lo[i] = i32x4_add(lo[i], i32x4_extadd_pairwise_i16x8(lo16[i]));
                hi[i] = i32x4_add(hi[i], i32x4_extadd_pairwise_i16x8(hi16[i]));
            }
        }
        #[cfg(not(target_feature = "relaxed-simd"))]
        while v < run {
            // SAFETY: base + v + 32 <= ds * g <= u.len() and the same for each position's
            // interleaved activations (asserted above).
            unsafe {
                let w0 = v128_load(u.as_ptr().add(base + v) as *const v128);
                let w1 = v128_load(u.as_ptr().add(base + v + 16) as *const v128);
                for i in 0..P {
                    let x0 = v128_load(qi[i].add(base + v) as *const v128);
                    let x1 = v128_load(qi[i].add(base + v + 16) as *const v128);
                    lo[i] = words16(lo[i], w0, x0);
                    hi[i] = words16(hi[i], w1, x1);
                }
            }
            v += 32;
        }
        if K {
            let [(a0, bf0), (a1, bf1)] = k4_scales8(&row[2 * b0..2 * b0 + 16], &kk);
            for i in 0..P {
                let (d, dsq) = (&a.drow(p0 + i)[b0..b0 + 8], &a.ds[(p0 + i) * ds + b0..][..8]);
                // SAFETY: `d` and `dsq` hold 8 f32 (bounds-checked slices).
                let (d0, d1, s0, s1) = unsafe {
                    (
                        v128_load(d.as_ptr() as *const v128),
                        v128_load(d.as_ptr().add(4) as *const v128),
                        v128_load(dsq.as_ptr() as *const v128),
                        v128_load(dsq.as_ptr().add(4) as *const v128),
                    )
                };
                // body's K step: acc + ((A * d) * f32(isum) - B * ds), per half.
                let t0 = f32x4_mul(f32x4_mul(a0, d0), f32x4_convert_i32x4(lo[i]));
                let t1 = f32x4_mul(f32x4_mul(a1, d1), f32x4_convert_i32x4(hi[i]));
                acc[i][0] = f32x4_add(acc[i][0], f32x4_sub(t0, f32x4_mul(bf0, s0)));
                acc[i][1] = f32x4_add(acc[i][1], f32x4_sub(t1, f32x4_mul(bf1, s1)));
            }
            b0 += 8;
            continue;
        }
        let (ws0, ws1) = if nb == 8 {
            (scales4(row, b0, &k), scales4(row, b0 + 4, &k))
        } else {
            // Past the last block the scales are zero (not the next values' bytes).
            let mut buf = [0u8; 16];
            buf[..2 * nb].copy_from_slice(&row[2 * b0..2 * (b0 + nb)]);
            (scales4(&buf, 0, &k), scales4(&buf, 4, &k))
        };
        for i in 0..P {
            let d = &a.drow(p0 + i)[b0..b0 + 8];
            // SAFETY: `d` holds 8 f32 (bounds-checked slice).
            let (d0, d1) =
                unsafe { (v128_load(d.as_ptr() as *const v128), v128_load(d.as_ptr().add(4) as *const v128)) };
            acc[i][0] = f32x4_add(acc[i][0], f32x4_mul(f32x4_mul(ws0, d0), f32x4_convert_i32x4(lo[i])));
            acc[i][1] = f32x4_add(acc[i][1], f32x4_mul(f32x4_mul(ws1, d1), f32x4_convert_i32x4(hi[i])));
        }
        b0 += 8;
    }
    for i in 0..P {
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 f32; v128.store has no alignment requirement.
        unsafe {
            v128_store(lanes.as_mut_ptr() as *mut v128, acc[i][0]);
            v128_store(lanes.as_mut_ptr().add(4) as *mut v128, acc[i][1]);
        }
        out[i] = reduce8(lanes);
    }
}
