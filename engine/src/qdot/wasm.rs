//! wasm SIMD128 path of [`super::dot_row`]: values widened to i16 and summed with
//! `i32x4.dot_i16x8_s` (exact), or, where the build enables relaxed SIMD, nibbles times
//! int8 activations with `i32x4.relaxed_dot_i8x16_i7x16_add_s` (exact for nibbles): int4
//! values directly, int8 values as two nibbles of value + 128; the float combination as
//! in the reference, four blocks per f32x4 (lane l of the first vector is acc[8k + l], of
//! the second acc[8k + 4 + l]: the reference's order). Q4K rows (`ActQ::k4`) take the
//! int4 sums and the reference's Q4K step; Q5K rows (`ActQ::k5`) the same with each
//! nibble's fifth bit ORed in as 16 before the multiply (u <= 31): [`super::wasm_k`].
//!
//! This module holds the pieces; the others build on it and none is imported here (no
//! import loop): `wasm_k` (Q4K/Q5K rows), `wasm_int` (relaxed int4 rows), `wasm_rows` (the
//! one-position dispatch, [`super::dot_row`]'s and [`super::dot_rows`]' entry), `wasm_tile`
//! (a row prepared for many positions), `wasm_few` (int8 rows, a few positions).

use core::arch::wasm32::*;

use super::{padded, round4, scale, ActQ, CHUNK};
use crate::math::reduce8;

/// Bytes `[at, at + 16)` of `src`, zero-filled past its end (`CHECKED`; unchecked, the
/// caller has made sure the bytes are inside `src`).
#[inline(always)]
pub(super) fn load16<const CHECKED: bool>(src: &[u8], at: usize) -> v128 {
    if !CHECKED || at + 16 <= src.len() {
        // SAFETY: the 16 bytes are inside `src`; v128.load has no alignment requirement.
        unsafe { v128_load(src.as_ptr().add(at) as *const v128) }
    } else {
        let buf = padded::<16>(src, at);
        // SAFETY: `buf` holds 16 bytes.
        unsafe { v128_load(buf.as_ptr() as *const v128) }
    }
}

/// Activations `[at, at + 16)`; `CHECKED` as for [`load16`].
#[inline(always)]
pub(super) fn load_q<const CHECKED: bool>(q: &[i8], at: usize) -> v128 {
    if CHECKED {
        let s = &q[at..at + 16];
        // SAFETY: `s` holds 16 bytes (the slice above is bounds-checked).
        unsafe { v128_load(s.as_ptr() as *const v128) }
    } else {
        // SAFETY: the caller checked that q holds every block's values.
        unsafe { v128_load(q.as_ptr().add(at) as *const v128) }
    }
}

/// Sum of the 16 products of `w` (i16 halves `wl`, `wh`) and the 16 int8 values `x`.
#[inline(always)]
pub(super) fn dot16(acc: v128, wl: v128, wh: v128, x: v128) -> v128 {
    let a = i32x4_dot_i16x8(wl, i16x8_extend_low_i8x16(x));
    let b = i32x4_dot_i16x8(wh, i16x8_extend_high_i8x16(x));
    i32x4_add(acc, i32x4_add(a, b))
}

/// acc + the products of 16 nibble values `w` (0..=15) and 16 int8 values `x`.
///
/// With relaxed SIMD (the threaded build): `i32x4.relaxed_dot_i8x16_i7x16_add_s`, 16
/// products in one instruction. Its result is only implementation-defined when the second
/// operand has its top bit set or the 16-bit pair sums overflow; nibbles are at most 15
/// (Q5K's, with their fifth bit, 31), so a pair sums to at most 2 * 31 * 127 = 7874: the
/// exact integer sum on every engine. (Without relaxed SIMD: i16 products, i32 sums.)
#[inline(always)]
pub(super) fn nibbles16(acc: v128, w: v128, x: v128) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    {
        i32x4_relaxed_dot_i8x16_i7x16_add(x, w, acc)
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        dot16(acc, u16x8_extend_low_u8x16(w), u16x8_extend_high_u8x16(w), x)
    }
}

/// acc + the products of 16 nibble values `w` (0..=31 with Q5K's fifth bits: i16 products,
/// i32 sums, exact) and 16 int8 values `x`, lane k getting the four products of bytes
/// 4k..4k + 4 (the interleaved layout keeps one block per 4-byte word), for builds without
/// relaxed SIMD: the widening `i32x4.dot_i16x8_s` pairs bytes (2k, 2k + 1), so its pair
/// sums are added word by word with two shuffles. (Relaxed builds sum i16 pairs in
/// `wasm_tile::tile` instead.)
#[cfg(not(target_feature = "relaxed-simd"))]
#[inline(always)]
pub(super) fn words16(acc: v128, w: v128, x: v128) -> v128 {
    let lo = i32x4_dot_i16x8(u16x8_extend_low_u8x16(w), i16x8_extend_low_i8x16(x));
    let hi = i32x4_dot_i16x8(u16x8_extend_high_u8x16(w), i16x8_extend_high_i8x16(x));
    let words = i32x4_add(i32x4_shuffle::<0, 2, 4, 6>(lo, hi), i32x4_shuffle::<1, 3, 5, 7>(lo, hi));
    i32x4_add(acc, words)
}

/// Whether the one-position kernels use the 16-bit form ([`super::wasm_form`]).
#[inline(always)]
pub(super) fn dot16_form() -> bool {
    #[cfg(target_feature = "relaxed-simd")]
    return super::wasm_form::dot16();
    #[cfg(not(target_feature = "relaxed-simd"))]
    false
}

/// Whether these kernels take Q5K activations `a` (`ActQ::k5`): split, group 32, whole
/// runs of eight blocks (`cols` a multiple of 256), `ds` made. One position reads `q`, many
/// the interleaved layout where it is made ([`super::dot_row_many`] checks it).
pub fn k5_takes(a: &ActQ) -> bool {
    a.k5_whole()
}

/// [`each_row`] touches one byte every `TOUCH_STRIDE` bytes of its rows up to
/// `TOUCH_AHEAD` bytes past the row it starts: wasm has no prefetch instruction, and these
/// loads start the page walks and cache misses (and the hardware's stream prefetch) of the
/// pages the kernel reaches next. Measured with tools/bench/qdot-wasm in Chromium 156 on an
/// Intel Xeon (docs/kernels.md): 4.6 -> 6.4 GB/s best from memory (int4 and int8 alike), no
/// loss from cache; a touch per 64-byte line read 6.9 GB/s from memory but lost a quarter
/// in cache.
const TOUCH_STRIDE: usize = 4096;
const TOUCH_AHEAD: usize = 16384;

/// Row ranges of at least this many bytes are read as two streams ([`each_row`]).
const TWO_STREAMS_MIN: usize = 1 << 16;

/// `out[r] = f(row r)` for the rows of `rb` bytes in `rows` (as many as both hold), with
/// the touches ahead described at [`TOUCH_STRIDE`]. Rows spanning [`TWO_STREAMS_MIN`]
/// bytes or more are taken from their two halves in turn (row `i`, then row `h + i`): two
/// pages read at once, twice the misses in flight, which one stream with its touches leaves
/// on the table (tools/bench/qdot-wasm in Chromium 156, Intel Xeon, from memory: int4 5.4
/// -> 6.5 GB/s, int8 5.6 -> 6.7; from L3 no loss; a decode step reads each weight once:
/// docs/kernels.md "Two streams"). The one-position int4/int8 rows and MXFP4's use it.
pub fn each_row(rows: &[u8], rb: usize, out: &mut [f32], mut f: impl FnMut(&[u8]) -> f32) {
    let rb = rb.max(1);
    let n = out.len().min(rows.len() / rb);
    let h = if n * rb >= TWO_STREAMS_MIN { n.div_ceil(2) } else { n };
    let mut streams = [Stream::new(0, h * rb), Stream::new(h * rb, n * rb)];
    let mut touched = 0u8;
    for i in 0..h {
        for (s, r) in [(0, i), (1, h + i)] {
            if r < n {
                touched ^= streams[s].touch(rows, r * rb);
                out[r] = f(&rows[r * rb..(r + 1) * rb]);
            }
        }
    }
    core::hint::black_box(touched);
}

/// One stream of [`each_row`]: the bytes `next..end` not yet touched.
struct Stream {
    next: usize,
    end: usize,
}

impl Stream {
    fn new(start: usize, end: usize) -> Self {
        Stream { next: start, end }
    }

    /// Touches the stream's bytes up to `TOUCH_AHEAD` past `at`; their xor.
    #[inline(always)]
    fn touch(&mut self, rows: &[u8], at: usize) -> u8 {
        let until = (at + TOUCH_AHEAD).min(self.end);
        let mut t = 0;
        while self.next < until {
            t ^= rows[self.next];
            self.next += TOUCH_STRIDE;
        }
        t
    }
}

/// The kernels' vector constants, made opaque once per call (`black_box`). V8 emits a
/// `v128.const` where it is used, inside the loop (several instructions each); as plain
/// values they stay in registers. The one-position kernel ran about 15% faster this way
/// (tools/bench/qdot-wasm in Chromium, eleventh session).
#[derive(Clone, Copy)]
pub(super) struct Consts {
    pub(super) low4: v128,
    /// 0x10 per byte: a Q5K value's fifth bit ([`fifth16`]).
    pub(super) five: v128,
    #[cfg(target_feature = "relaxed-simd")]
    pub(super) flip: v128,
    sign: v128,
    exp_man: v128,
    pow112: v128,
    special: v128,
}

impl Consts {
    /// Opaque: for loops that use the constants every step and have registers to spare.
    #[inline(always)]
    pub(super) fn new() -> Consts {
        core::hint::black_box(Consts::literal())
    }

    /// As `v128.const`s where they are used: for `wasm_tile::tile`, whose inner loop needs every
    /// register and uses the constants only once per eight blocks.
    #[inline(always)]
    pub(super) fn literal() -> Consts {
        Consts {
            low4: u8x16_splat(15),
            five: u8x16_splat(0x10),
            #[cfg(target_feature = "relaxed-simd")]
            flip: u8x16_splat(0x80),
            sign: i32x4_splat(0x8000),
            exp_man: i32x4_splat(0x7fff),
            pow112: f32x4_splat(f32::from_bits(0x7780_0000)),
            special: i32x4_splat(0x7c00),
        }
    }
}

/// How much of the activations' block sum [`block_lanes`] leaves to subtract, as a shift:
/// int4 stores w + 8 (8 = 1 << 3), relaxed int8 sums w + 128 (1 << 7), the widening int8
/// path and the halves (`halves`: [`ActQ::halves`]) w itself (none).
pub(super) const fn offset_shift(int4: bool, halves: bool) -> Option<u32> {
    if int4 {
        Some(3)
    } else if halves && cfg!(target_feature = "relaxed-simd") {
        None
    } else if cfg!(target_feature = "relaxed-simd") {
        Some(7)
    } else {
        None
    }
}

/// The integer sum of block `b`, without the correction of [`offset_shift`], as four
/// partial lanes. `G`: the group when it is known at compile time (then `g` is ignored),
/// else 0. `H` (int8, relaxed builds): `q` is the position's row of [`ActQ::qh`]. `W16`
/// (relaxed builds, int4 and `H`): the 16-bit form of [`super::wasm_form`].
#[inline(always)]
pub(super) fn block_lanes<const INT4: bool, const CHECKED: bool, const G: usize, const H: bool, const W16: bool>(
    vals: &[u8],
    q: &[i8],
    b: usize,
    g: usize,
    kc: &Consts,
) -> v128 {
    let g = if G > 0 { G } else { g };
    #[cfg(target_feature = "relaxed-simd")]
    if H && !INT4 {
        // Every int8 value w (-128 included) times the activations' halves, both 0..=127:
        // products of at most 128 * 127, a pair's sum inside i16, so the relaxed dot is the
        // exact sum on every engine; w x = w max(x, 0) - w max(-x, 0).
        // In 16 bits: the two pair sums' difference is w x's own pair sum, inside i16 too,
        // so the wrapping subtraction is exact before the one widening.
        let (mut sum, mut neg) = (i32x4_splat(0), i32x4_splat(0));
        for k in 0..g / 16 {
            let c = b * g + k * 16;
            let w = load16::<CHECKED>(vals, c);
            let (xp, xn) = (load_q::<CHECKED>(q, 2 * c), load_q::<CHECKED>(q, 2 * c + 16));
            if W16 {
                let d = i16x8_sub(i16x8_relaxed_dot_i8x16_i7x16(w, xp), i16x8_relaxed_dot_i8x16_i7x16(w, xn));
                sum = i32x4_add(sum, i32x4_extadd_pairwise_i16x8(d));
            } else {
                sum = i32x4_relaxed_dot_i8x16_i7x16_add(w, xp, sum);
                neg = i32x4_relaxed_dot_i8x16_i7x16_add(w, xn, neg);
            }
        }
        return i32x4_sub(sum, neg);
    }
    let mut sum = i32x4_splat(0);
    // The relaxed int8 path's high nibbles' sums.
    #[allow(unused_mut)]
    let mut high = i32x4_splat(0);
    // Not `tile`'s i16 sums over several chunks (for one position: 5.5 against 6.4 tok/s
    // in Chromium on an EPYC with AVX-512 VNNI): at most one chunk's pairs in i16, and only
    // where the load-time timing chose it (`W16`, [`super::wasm_form`]).
    for k in 0..g / CHUNK {
        let c = b * g + k * CHUNK;
        let (x0, x1) = (load_q::<CHECKED>(q, c), load_q::<CHECKED>(q, c + 16));
        if INT4 {
            let bytes = load16::<CHECKED>(vals, c / 2);
            // High nibbles by a 16-bit shift and the mask: the bytes of i8x16.shr_u, which
            // V8 lowers to more instructions (about 5% in Chromium's kernel timing).
            let (lo, hi) = (v128_and(bytes, kc.low4), v128_and(u16x8_shr(bytes, 4), kc.low4));
            sum = nibble_chunk::<W16>(sum, lo, hi, x0, x1);
        } else {
            let (w0, w1) = (load16::<CHECKED>(vals, c), load16::<CHECKED>(vals, c + 16));
            #[cfg(target_feature = "relaxed-simd")]
            {
                // u = w + 128 (the sign bit flipped) = lo + 16 hi with lo, hi in 0..=15:
                // two nibble dots, exact on every engine, as one of int4 (hi's sums are
                // kept apart and weighed by 16 once per block; -128 sum(x) is the caller's).
                let (u0, u1) = (v128_xor(w0, kc.flip), v128_xor(w1, kc.flip));
                sum = nibbles16(sum, v128_and(u0, kc.low4), x0);
                high = nibbles16(high, v128_and(u16x8_shr(u0, 4), kc.low4), x0);
                sum = nibbles16(sum, v128_and(u1, kc.low4), x1);
                high = nibbles16(high, v128_and(u16x8_shr(u1, 4), kc.low4), x1);
            }
            #[cfg(not(target_feature = "relaxed-simd"))]
            {
                sum = dot16(sum, i16x8_extend_low_i8x16(w0), i16x8_extend_high_i8x16(w0), x0);
                sum = dot16(sum, i16x8_extend_low_i8x16(w1), i16x8_extend_high_i8x16(w1), x1);
            }
        }
    }
    if !INT4 && !H && cfg!(target_feature = "relaxed-simd") {
        sum = i32x4_add(sum, i32x4_shl(high, 4));
    }
    sum
}

/// acc + the products of a chunk's 32 values as `lo` (its even values, times `x0`) and `hi`
/// (odd, times `x1`), each 0..=31 (int4's nibbles, Q5K's with their fifth bit), in the form
/// `W16` (relaxed builds) or by [`nibbles16`].
#[inline(always)]
pub(super) fn nibble_chunk<const W16: bool>(acc: v128, lo: v128, hi: v128, x0: v128, x1: v128) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    if W16 {
        // Pairs of at most 2 * 31 * 127 = 7874, two of them added (15748): inside i16.
        let lo = i16x8_relaxed_dot_i8x16_i7x16(x0, lo);
        let hi = i16x8_relaxed_dot_i8x16_i7x16(x1, hi);
        return i32x4_add(acc, i32x4_extadd_pairwise_i16x8(i16x8_add(lo, hi)));
    }
    nibbles16(nibbles16(acc, lo, x0), hi, x1)
}

/// [sum of s0's lanes, s1's, s2's, s3's]: integer adds, exact in any order.
#[inline(always)]
pub(super) fn hsum4(s0: v128, s1: v128, s2: v128, s3: v128) -> v128 {
    let t0 = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s0, s1), i32x4_shuffle::<2, 6, 3, 7>(s0, s1));
    let t1 = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s2, s3), i32x4_shuffle::<2, 6, 3, 7>(s2, s3));
    i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(t0, t1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1))
}

/// The f16 scales of blocks `b..b + 4` of a stored row as f32, with the bits of
/// `half::f16::to_f32` (the software conversion wasm uses): exponent and mantissa shifted
/// into place and multiplied by 2^112, which is exact for normal and subnormal values;
/// infinities and NaNs (exponent 31) get f32's all-ones exponent, NaNs their quiet bit.
/// A subnormal scale makes its product by 2^112 one with a subnormal operand, which Intel
/// CPUs run through a microcode assist (about 100 cycles). Unlike a Q4_K header's d
/// (`wasm_k::f16_to_f32`, where it is common), an int4/int8 group's scale is subnormal only
/// where its largest weight is below 6.1e-5 times 7 (int4) or 127 (int8): rare, and testing
/// for it here cost int4's one-position kernel 5% in Chromium (three operations per four
/// blocks; measured, tools/bench/qdot-wasm), so the product stays.
#[inline(always)]
pub(super) fn scales4(row: &[u8], b: usize, k: &Consts) -> v128 {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds the 8 bytes read (the slice above is bounds-checked).
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(bytes.as_ptr() as *const u64) });
    let sign = i32x4_shl(v128_and(h, k.sign), 16);
    let em = v128_and(h, k.exp_man);
    let finite = f32x4_mul(i32x4_shl(em, 13), k.pow112);
    let is_special = i32x4_ge(em, k.special);
    if !v128_any_true(is_special) {
        // Every real row: four finite scales, half the instructions of the general case.
        return v128_or(sign, finite);
    }
    let man = i32x4_shl(v128_and(em, i32x4_splat(0x3ff)), 13);
    let quiet = v128_and(v128_not(i32x4_eq(man, i32x4_splat(0))), i32x4_splat(0x40_0000));
    let special = v128_or(v128_or(i32x4_splat(0x7f80_0000), man), quiet);
    v128_or(sign, v128_bitselect(special, finite, is_special))
}

/// Four blocks per step: their integer sums gathered into one vector, then
/// (ws_b * d_b) * f32(isum_b) for the four at once, added to acc lanes b mod 8 (blocks
/// 8k..8k+4 in the first vector, 8k+4..8k+8 in the second): the reference's products and
/// per-lane order. The blocks after the last multiple of four run one at a time.
#[inline(always)]
pub(super) fn body<const INT4: bool, const CHECKED: bool, const G: usize, const H: bool, const W16: bool>(
    row: &[u8],
    a: &ActQ,
    p: usize,
) -> f32 {
    let (g, blocks) = (if G > 0 { G } else { a.group }, a.blocks);
    let vals = &row[round4(blocks * 2)..];
    let (q, d, s) = (if H { a.qhrow(p) } else { a.qrow(p) }, a.drow(p), a.srow(p));
    let k = Consts::new();
    let mut acc = [f32x4_splat(0.0); 2];
    let full = blocks / 4 * 4;
    let mut b = 0;
    while b < full {
        let s0 = block_lanes::<INT4, CHECKED, G, H, W16>(vals, q, b, g, &k);
        let s1 = block_lanes::<INT4, CHECKED, G, H, W16>(vals, q, b + 1, g, &k);
        let s2 = block_lanes::<INT4, CHECKED, G, H, W16>(vals, q, b + 2, g, &k);
        let s3 = block_lanes::<INT4, CHECKED, G, H, W16>(vals, q, b + 3, g, &k);
        let mut isum = hsum4(s0, s1, s2, s3);
        let (dq, sq) = (&d[b..b + 4], &s[b..b + 4]);
        let half = (b / 4) & 1;
        if let Some(shift) = offset_shift(INT4, H) {
            // SAFETY: `sq` holds 4 i32 (bounds-checked slice); v128.load is unaligned.
            isum = i32x4_sub(isum, i32x4_shl(unsafe { v128_load(sq.as_ptr() as *const v128) }, shift));
        }
        // SAFETY: `dq` holds 4 f32 (bounds-checked slice).
        let db = unsafe { v128_load(dq.as_ptr() as *const v128) };
        let prod = f32x4_mul(f32x4_mul(scales4(row, b, &k), db), f32x4_convert_i32x4(isum));
        acc[half] = f32x4_add(acc[half], prod);
        b += 4;
    }
    finish::<INT4, CHECKED, G, H, W16>(acc, row, a, p, full, &k)
}

/// A position's result from its accumulators `acc` (blocks before `full`, a multiple of
/// four): the blocks from `full` on one at a time, added to the lanes b mod 8, then the
/// reference's final sum. `G` as in [`block_lanes`].
#[inline(always)]
pub(super) fn finish<const INT4: bool, const CHECKED: bool, const G: usize, const H: bool, const W16: bool>(
    acc: [v128; 2],
    row: &[u8],
    a: &ActQ,
    p: usize,
    full: usize,
    k: &Consts,
) -> f32 {
    let (g, vals) = (if G > 0 { G } else { a.group }, &row[round4(a.blocks * 2)..]);
    let (q, d, s) = (if H { a.qhrow(p) } else { a.qrow(p) }, a.drow(p), a.srow(p));
    let mut out = [0.0f32; 8];
    // SAFETY: `out` holds 8 f32; v128.store has no alignment requirement.
    unsafe {
        v128_store(out.as_mut_ptr() as *mut v128, acc[0]);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc[1]);
    }
    for b in full..a.blocks {
        let v = block_lanes::<INT4, CHECKED, G, H, W16>(vals, q, b, g, k);
        let mut isum = i32x4_extract_lane::<0>(v)
            + i32x4_extract_lane::<1>(v)
            + i32x4_extract_lane::<2>(v)
            + i32x4_extract_lane::<3>(v);
        if let Some(shift) = offset_shift(INT4, H) {
            isum -= s[b] << shift;
        }
        out[b % 8] += (scale(row, b) * d[b]) * isum as f32;
    }
    reduce8(out)
}
