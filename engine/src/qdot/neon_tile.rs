//! aarch64 path of [`super::dot_row_many`] for several positions: a weight row is made
//! ready once ([`prepare`]) and then applied to the positions four at a time.
//!
//! The layout is the one of [`super::ActQ::interleave`] (and of the x86 and wasm prepared
//! rows): per run of eight blocks and 32-value chunk, eight 32-byte steps whose 4-byte lane
//! j holds four values of block j. A 16-byte half of a step covers blocks 0-3 (low) or 4-7
//! (high), and `sdot` adds the four products of lane j into lane j: a run ends with its
//! eight block sums in two vectors, lanes in the reference's order (acc[b mod 8]), with no
//! horizontal sums. Without dotprod, `smull` products added pairwise twice (`saddlp`,
//! `addp`) land in the same lanes. Integer sums are exact, so the bits are
//! [`super::dot_row_scalar`]'s. A Q4K row (`ActQ::k4`: int4 nibbles under Q4_K headers)
//! takes the sums of its nibbles as stored and the Q4K step of the one-position kernel; a
//! Q5K row (`ActQ::k5`) the same, its fifth bits ORed into the prepared values (0..=31:
//! positive int8, products and sums exact as for int4).

use std::arch::aarch64::*;

use super::neon::{k4_scales8, scales4, sdot};
use super::{padded, round4, ActQ, CHUNK};
use crate::math::reduce8;

/// Whether [`prepare`] and [`dot_many`] can take this row: groups of whole chunks, the
/// activations interleaved and split as the weights want, positions inside them, and a
/// row that holds every block's scale and values.
pub fn fits(int4: bool, row: &[u8], a: &ActQ, p0: usize, n: usize) -> bool {
    let g = a.group;
    let values = if int4 { a.blocks * g / 2 } else { a.blocks * g };
    g > 0
        && g.is_multiple_of(CHUNK)
        && a.split == int4
        && a.qi.len() == a.n * a.dstride() * g
        && a.d.len() == a.n * a.dstride()
        && a.s.len() == a.n * a.dstride()
        && p0 + n <= a.n
        && row.len() >= round4(a.blocks * 2) + values
        && (!a.k4 || (int4 && g == 32 && a.blocks.is_multiple_of(8) && a.ds.len() == a.n * a.dstride()))
        // Q5K: 32 fifth-bit bytes per run of eight blocks after the nibbles.
        && (!a.k5 || (super::neon::k5_takes(a) && row.len() >= round4(a.blocks * 2) + values + a.blocks * 4))
}

/// Makes `row` ready for many positions in `u` ([`fits`] must hold): int4 as its nibble
/// values 0..15 in split order (the -8 is taken off with the activations' block sums; a
/// Q5K row's with their fifth bits, 0..=31), int8 as its stored values; interleaved; zero
/// past the row's last value and block.
pub fn prepare(int4: bool, row: &[u8], a: &ActQ, u: &mut Vec<u8>) {
    let g = a.group;
    let n = a.dstride() * g;
    let vals = &row[round4(a.blocks * 2)..];
    let stored = a.blocks * g;
    // Q5K (group 32): the fifth-bit bytes after the nibbles.
    let high = if a.k5 { &vals[stored / 2..] } else { &[][..] };
    if u.len() < n {
        u.resize(n, 0);
    }
    for b0 in (0..a.dstride()).step_by(8) {
        for m in 0..g / CHUNK {
            // Values 0-15 (lo) and 16-31 (hi) of chunk m of each block, in the
            // activations' order: int4 split (even values, then odd), int8 natural.
            let mut lo = [[0u8; 16]; 8];
            let mut hi = [[0u8; 16]; 8];
            for j in 0..8 {
                let c = (b0 + j) * g + m * CHUNK;
                if c >= stored {
                    continue;
                }
                if int4 {
                    let bytes = padded::<16>(vals, c / 2);
                    for (k, &v) in bytes.iter().enumerate() {
                        lo[j][k] = v & 15;
                        hi[j][k] = v >> 4;
                    }
                    if a.k5 {
                        // Block b0 + j (group 32) is sub-block j of run b0 / 8: nibble byte k's
                        // fifth bits in byte 16 (j / 4) + k, bits 2 (j mod 4) (low nibble) and
                        // 2 (j mod 4) + 1 (high nibble) (tensor::q5k_bit).
                        let five = padded::<16>(high, 32 * (b0 / 8) + 16 * (j / 4));
                        let at = 2 * (j % 4);
                        for (k, &f) in five.iter().enumerate() {
                            lo[j][k] |= ((f >> at) & 1) << 4;
                            hi[j][k] |= ((f >> (at + 1)) & 1) << 4;
                        }
                    }
                } else {
                    let bytes = padded::<32>(vals, c);
                    lo[j].copy_from_slice(&bytes[..16]);
                    hi[j].copy_from_slice(&bytes[16..]);
                }
            }
            let dst = &mut u[b0 * g + m * 8 * CHUNK..][..8 * CHUNK];
            // Step k (k < 4: words of lo, else of hi): its low half blocks 0-3, high 4-7.
            for (half, src) in [(0usize, &lo), (4, &hi)] {
                let t0 = transpose4(&src[0], &src[1], &src[2], &src[3]);
                let t1 = transpose4(&src[4], &src[5], &src[6], &src[7]);
                for k in 0..4 {
                    let at = (half + k) * 32;
                    // SAFETY: `dst` holds 8 * 32 bytes and at + 32 <= 256; NEON is baseline.
                    unsafe {
                        vst1q_u32(dst.as_mut_ptr().add(at) as *mut u32, t0[k]);
                        vst1q_u32(dst.as_mut_ptr().add(at + 16) as *mut u32, t1[k]);
                    }
                }
            }
        }
    }
}

/// 4 x 4 transpose of 32-bit lanes: lane j of out[k] = lane k of r_j.
#[inline(always)]
fn transpose4(r0: &[u8; 16], r1: &[u8; 16], r2: &[u8; 16], r3: &[u8; 16]) -> [uint32x4_t; 4] {
    // SAFETY: each array holds 16 bytes; NEON is part of aarch64's baseline.
    unsafe {
        let [r0, r1, r2, r3] = [r0, r1, r2, r3].map(|r| vreinterpretq_u32_u8(vld1q_u8(r.as_ptr())));
        let (t0, t1) = (vzip1q_u32(r0, r1), vzip2q_u32(r0, r1));
        let (t2, t3) = (vzip1q_u32(r2, r3), vzip2q_u32(r2, r3));
        let pair = |a: uint32x4_t, b: uint32x4_t, high: bool| {
            let (a, b) = (vreinterpretq_u64_u32(a), vreinterpretq_u64_u32(b));
            vreinterpretq_u32_u64(if high { vzip2q_u64(a, b) } else { vzip1q_u64(a, b) })
        };
        [pair(t0, t2, false), pair(t0, t2, true), pair(t1, t3, false), pair(t1, t3, true)]
    }
}

/// acc lane j + the four products of bytes 4j..4j + 4 of `w` and `x`, without dotprod:
/// widening products, then two pairwise adds (exact: a product fits i16, sums i32).
#[inline(always)]
fn dot4_mull(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: NEON is part of aarch64's baseline; register-only intrinsics.
    unsafe {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
        let hi = vpaddlq_s16(vmull_high_s8(w, x));
        vaddq_s32(acc, vpaddq_s32(lo, hi))
    }
}

/// A row prepared by [`prepare`] times positions `p0..p0 + out.len()` ([`fits`] must
/// hold), four at a time.
///
/// # Safety
/// `dotprod` only where [`super::neon::has_dotprod`] said so.
pub unsafe fn dot_many(dotprod: bool, int4: bool, u: &[u8], row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    let mut i = 0;
    while i < out.len() {
        let k = (out.len() - i).min(4);
        let o = &mut out[i..i + k];
        // SAFETY: the caller's contract for dotprod; shapes as checked by `fits`.
        unsafe {
            match (dotprod, k) {
                (true, 4) => tile_dot::<4>(int4, u, row, a, p0 + i, o),
                (true, 3) => tile_dot::<3>(int4, u, row, a, p0 + i, o),
                (true, 2) => tile_dot::<2>(int4, u, row, a, p0 + i, o),
                (true, _) => tile_dot::<1>(int4, u, row, a, p0 + i, o),
                (false, 4) => tile::<4, false>(int4, u, row, a, p0 + i, o),
                (false, 3) => tile::<3, false>(int4, u, row, a, p0 + i, o),
                (false, 2) => tile::<2, false>(int4, u, row, a, p0 + i, o),
                (false, _) => tile::<1, false>(int4, u, row, a, p0 + i, o),
            }
        }
        i += k;
    }
}

#[target_feature(enable = "dotprod")]
unsafe fn tile_dot<const P: usize>(int4: bool, u: &[u8], row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract (dotprod present).
    unsafe { tile::<P, true>(int4, u, row, a, p0, out) }
}

/// # Safety
/// `DOT` needs dotprod.
#[inline(always)]
unsafe fn tile<const P: usize, const DOT: bool>(
    int4: bool,
    u: &[u8],
    row: &[u8],
    a: &ActQ,
    p0: usize,
    out: &mut [f32],
) {
    let (g, ds) = (a.group, a.dstride());
    let run = 8 * g;
    assert!(u.len() >= ds * g && a.qi.len() >= (p0 + P) * ds * g && out.len() >= P, "prepared shapes");
    let mut qi = [a.qi.as_ptr(); P];
    for (i, q) in qi.iter_mut().enumerate() {
        // SAFETY: inside a.qi (asserted above).
        *q = unsafe { a.qi.as_ptr().add((p0 + i) * ds * g) };
    }
    // SAFETY: NEON is baseline; every load is inside `u`, a.qi (asserted above), or the
    // bounds-checked slices of a's scales and sums; `DOT` only with dotprod (caller).
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 2]; P];
        let mut b0 = 0;
        while b0 < a.blocks {
            let nb = (a.blocks - b0).min(8);
            let mut lo = [vdupq_n_s32(0); P];
            let mut hi = [vdupq_n_s32(0); P];
            if int4 && !a.k4 {
                // int4 values are stored q + 8: start each block from -8 * sum x.
                for i in 0..P {
                    let s = &a.srow(p0 + i)[b0..b0 + 8];
                    lo[i] = vnegq_s32(vshlq_n_s32::<3>(vld1q_s32(s.as_ptr())));
                    hi[i] = vnegq_s32(vshlq_n_s32::<3>(vld1q_s32(s.as_ptr().add(4))));
                }
            }
            let base = b0 * g;
            let mut v = 0;
            while v < run {
                let w0 = vld1q_s8(u.as_ptr().add(base + v) as *const i8);
                let w1 = vld1q_s8(u.as_ptr().add(base + v + 16) as *const i8);
                for i in 0..P {
                    let x0 = vld1q_s8(qi[i].add(base + v));
                    let x1 = vld1q_s8(qi[i].add(base + v + 16));
                    if DOT {
                        lo[i] = sdot(lo[i], w0, x0);
                        hi[i] = sdot(hi[i], w1, x1);
                    } else {
                        lo[i] = dot4_mull(lo[i], w0, x0);
                        hi[i] = dot4_mull(hi[i], w1, x1);
                    }
                }
                v += 32;
            }
            if a.k4 {
                // The run's Q4K header: acc + ((A * d) * f32(isum) - B * ds), per half.
                let [(a0, bf0), (a1, bf1)] = k4_scales8(&row[2 * b0..2 * b0 + 16]);
                for i in 0..P {
                    let (d, dsq) = (&a.drow(p0 + i)[b0..b0 + 8], &a.ds[(p0 + i) * ds + b0..][..8]);
                    let (d0, d1) = (vld1q_f32(d.as_ptr()), vld1q_f32(d.as_ptr().add(4)));
                    let (s0, s1) = (vld1q_f32(dsq.as_ptr()), vld1q_f32(dsq.as_ptr().add(4)));
                    let t0 = vmulq_f32(vmulq_f32(a0, d0), vcvtq_f32_s32(lo[i]));
                    let t1 = vmulq_f32(vmulq_f32(a1, d1), vcvtq_f32_s32(hi[i]));
                    acc[i][0] = vaddq_f32(acc[i][0], vsubq_f32(t0, vmulq_f32(bf0, s0)));
                    acc[i][1] = vaddq_f32(acc[i][1], vsubq_f32(t1, vmulq_f32(bf1, s1)));
                }
                b0 += 8;
                continue;
            }
            let (ws0, ws1) = if nb == 8 {
                (scales4(row, b0), scales4(row, b0 + 4))
            } else {
                // Past the last block the scales are zero (not the next values' bytes).
                let mut buf = [0u8; 16];
                buf[..2 * nb].copy_from_slice(&row[2 * b0..2 * (b0 + nb)]);
                (scales4(&buf, 0), scales4(&buf, 4))
            };
            for i in 0..P {
                let d = &a.drow(p0 + i)[b0..b0 + 8];
                let (d0, d1) = (vld1q_f32(d.as_ptr()), vld1q_f32(d.as_ptr().add(4)));
                acc[i][0] = vaddq_f32(acc[i][0], vmulq_f32(vmulq_f32(ws0, d0), vcvtq_f32_s32(lo[i])));
                acc[i][1] = vaddq_f32(acc[i][1], vmulq_f32(vmulq_f32(ws1, d1), vcvtq_f32_s32(hi[i])));
            }
            b0 += 8;
        }
        for i in 0..P {
            let mut lanes = [0.0f32; 8];
            vst1q_f32(lanes.as_mut_ptr(), acc[i][0]);
            vst1q_f32(lanes.as_mut_ptr().add(4), acc[i][1]);
            out[i] = reduce8(lanes);
        }
    }
}
