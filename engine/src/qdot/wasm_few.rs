//! One stored int8 row times a few positions in wasm SIMD128 (a prompt's positions in the
//! browser, a speculative step's drafts): each run of four blocks is loaded and decoded once
//! (relaxed builds: as stored, against the activations' halves [`ActQ::qh`] where the
//! matmul made them, else value + 128 split into nibbles; others: widened to i16), then applied to
//! up to eight positions; more positions take further passes over the row, from L1. Before,
//! every position ran [`super::wasm_rows::dot_row_simd128`] over the row again (int8 has no
//! prepared-row path in wasm). Per position the integer block sums and their float
//! combination are the one-position kernel's, so the bits are.

use core::arch::wasm32::*;

#[cfg(not(target_feature = "relaxed-simd"))]
use super::wasm::dot16;
#[cfg(target_feature = "relaxed-simd")]
use super::wasm::nibbles16;
use super::wasm::{finish, hsum4, load16, load_q, offset_shift, scales4, Consts};
use super::{round4, ActQ};

/// Positions per pass over the row.
const PASS: usize = 8;

/// `out[i]` = [`super::dot_row`] (SIMD128) of the int8 `row` and position `p0 + i` (positions inside
/// `a`: the caller's contract). Groups other than 32, 64 and 128, split activations and rows
/// whose values end inside a block go one position at a time.
pub fn dot_row_few_int8(row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    let (g, blocks) = (a.group, a.blocks);
    let inside = row.len() >= round4(blocks * 2) + blocks * g && a.q.len() >= (p0 + out.len()) * blocks * g;
    if !inside || a.split || !matches!(g, 32 | 64 | 128) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = super::dot_row(super::Simd::Simd128, false, row, a, p0 + i);
        }
        return;
    }
    // Relaxed builds: against the activations' halves where they were made, in the form
    // the load-time timing chose (the one-position kernel's sums: `wasm::block_lanes`).
    let halves = cfg!(target_feature = "relaxed-simd") && a.qh.len() >= (p0 + out.len()) * 2 * blocks * g;
    let w16 = halves && super::wasm::dot16_form();
    for (c, out) in out.chunks_mut(PASS).enumerate() {
        let p = p0 + c * PASS;
        match (g, halves, w16) {
            (32, false, _) => few::<32, false, false>(row, a, p, out),
            (64, false, _) => few::<64, false, false>(row, a, p, out),
            (_, false, _) => few::<128, false, false>(row, a, p, out),
            (32, true, false) => few::<32, true, false>(row, a, p, out),
            (64, true, false) => few::<64, true, false>(row, a, p, out),
            (_, true, false) => few::<128, true, false>(row, a, p, out),
            (32, true, true) => few::<32, true, true>(row, a, p, out),
            (64, true, true) => few::<64, true, true>(row, a, p, out),
            (_, true, true) => few::<128, true, true>(row, a, p, out),
        }
    }
}

/// Up to [`PASS`] positions, group `G`; the shapes checked by [`dot_row_few_int8`]. `H`
/// (relaxed builds): the stored bytes as they are against [`ActQ::qh`], summed in the
/// 16-bit form where `W16` (as `wasm::block_lanes` does).
#[inline(always)]
fn few<const G: usize, const H: bool, const W16: bool>(row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    let blocks = a.blocks;
    let vals = &row[round4(blocks * 2)..];
    let k = Consts::new();
    let mut acc = [[f32x4_splat(0.0); 2]; PASS];
    let full = blocks / 4 * 4;
    // Four blocks' values, two vectors per 16 (relaxed: the nibbles of value + 128; else
    // the values widened to i16); 4 * G / 8 vectors, at most 64.
    let mut w = [i32x4_splat(0); 64];
    let mut b = 0;
    while b < full {
        for j in 0..4 {
            for h in 0..G / 16 {
                let bytes = load16::<false>(vals, (b + j) * G + h * 16);
                let at = 2 * (j * G / 16 + h);
                #[cfg(target_feature = "relaxed-simd")]
                if H {
                    w[at] = bytes;
                } else {
                    let u = v128_xor(bytes, k.flip);
                    w[at] = v128_and(u, k.low4);
                    w[at + 1] = v128_and(u16x8_shr(u, 4), k.low4);
                }
                #[cfg(not(target_feature = "relaxed-simd"))]
                {
                    w[at] = i16x8_extend_low_i8x16(bytes);
                    w[at + 1] = i16x8_extend_high_i8x16(bytes);
                }
            }
        }
        let ws = scales4(row, b, &k);
        for (i, acc) in acc.iter_mut().enumerate().take(out.len()) {
            let p = p0 + i;
            let (q, d, s) = (a.qrow(p), a.drow(p), a.srow(p));
            let mut lanes = [i32x4_splat(0); 4];
            for (j, lane) in lanes.iter_mut().enumerate() {
                let (mut sum, mut _high) = (i32x4_splat(0), i32x4_splat(0));
                #[cfg(target_feature = "relaxed-simd")]
                if H {
                    let qh = a.qhrow(p);
                    for h in 0..G / 16 {
                        let c = (b + j) * G + h * 16;
                        let (xp, xn) = (load_q::<false>(qh, 2 * c), load_q::<false>(qh, 2 * c + 16));
                        let wv = w[2 * (j * G / 16 + h)];
                        if W16 {
                            let dd =
                                i16x8_sub(i16x8_relaxed_dot_i8x16_i7x16(wv, xp), i16x8_relaxed_dot_i8x16_i7x16(wv, xn));
                            sum = i32x4_add(sum, i32x4_extadd_pairwise_i16x8(dd));
                        } else {
                            sum = i32x4_relaxed_dot_i8x16_i7x16_add(wv, xp, sum);
                            _high = i32x4_relaxed_dot_i8x16_i7x16_add(wv, xn, _high);
                        }
                    }
                    *lane = i32x4_sub(sum, _high);
                    continue;
                }
                for h in 0..G / 16 {
                    let x = load_q::<false>(q, (b + j) * G + h * 16);
                    let at = 2 * (j * G / 16 + h);
                    #[cfg(target_feature = "relaxed-simd")]
                    {
                        sum = nibbles16(sum, w[at], x);
                        _high = nibbles16(_high, w[at + 1], x);
                    }
                    #[cfg(not(target_feature = "relaxed-simd"))]
                    {
                        sum = dot16(sum, w[at], w[at + 1], x);
                    }
                }
                // Relaxed: the high nibbles weigh 16 (block_lanes' combination).
                #[cfg(target_feature = "relaxed-simd")]
                {
                    sum = i32x4_add(sum, i32x4_shl(_high, 4));
                }
                *lane = sum;
            }
            let mut isum = hsum4(lanes[0], lanes[1], lanes[2], lanes[3]);
            let (dq, sq) = (&d[b..b + 4], &s[b..b + 4]);
            if let Some(shift) = offset_shift(false, H) {
                // SAFETY: `sq` holds 4 i32 (bounds-checked slice); v128.load is unaligned.
                isum = i32x4_sub(isum, i32x4_shl(unsafe { v128_load(sq.as_ptr() as *const v128) }, shift));
            }
            // SAFETY: `dq` holds 4 f32 (bounds-checked slice).
            let db = unsafe { v128_load(dq.as_ptr() as *const v128) };
            let half = (b / 4) & 1;
            acc[half] = f32x4_add(acc[half], f32x4_mul(f32x4_mul(ws, db), f32x4_convert_i32x4(isum)));
        }
        b += 4;
    }
    // The blocks after the last multiple of four, as the one-position kernel does them.
    for (i, (o, &acc)) in out.iter_mut().zip(acc.iter()).enumerate() {
        *o = finish::<false, false, G, H, W16>(acc, row, a, p0 + i, full, &k);
    }
}
