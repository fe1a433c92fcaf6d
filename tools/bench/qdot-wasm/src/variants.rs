//! Variants of the one-position int4 kernel (group 32, whole rows), timed next to the
//! engine's: `run_b*` must give the engine's bits (their checksums are compared); `run_x*`
//! are ablations (wrong results on purpose) that show what each part of the kernel costs.
//! Relaxed-SIMD builds only (the threaded browser build's instruction set).
use core::arch::wasm32::*;

use colibri_engine::qdot::ActQ;

/// Engine helper copies (the engine keeps them private).
#[inline(always)]
fn reduce8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

#[inline(always)]
fn dot(acc: v128, w: v128, x: v128) -> v128 {
    i32x4_relaxed_dot_i8x16_i7x16_add(x, w, acc)
}

#[inline(always)]
fn hsum4(s0: v128, s1: v128, s2: v128, s3: v128) -> v128 {
    let t0 = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s0, s1), i32x4_shuffle::<2, 6, 3, 7>(s0, s1));
    let t1 = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s2, s3), i32x4_shuffle::<2, 6, 3, 7>(s2, s3));
    i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(t0, t1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1))
}

/// Block b's four partial sums; `U16` takes the high nibbles with a 16-bit shift and a
/// mask (the same bytes as i8x16.shr_u).
#[inline(always)]
unsafe fn block<const U16: bool>(vals: *const u8, q: *const i8, b: usize) -> v128 {
    let bytes = ld(vals.add(b * 16));
    let (x0, x1) = (ld(q.add(b * 32) as *const u8), ld(q.add(b * 32 + 16) as *const u8));
    let m = u8x16_splat(15);
    let hi = if U16 { v128_and(u16x8_shr(bytes, 4), m) } else { u8x16_shr(bytes, 4) };
    dot(dot(i32x4_splat(0), v128_and(bytes, m), x0), hi, x1)
}

/// Eight f16 scales that are all positive and finite (below 0x7c00, which also excludes
/// the sign bit) as two f32x4: exact (`half`'s bits); None if any is not.
#[inline(always)]
fn scales8_fast(row: &[u8], b: usize) -> Option<(v128, v128)> {
    let s = &row[2 * b..2 * b + 16];
    // SAFETY: `s` holds 16 bytes.
    let h = unsafe { ld(s.as_ptr()) };
    if v128_any_true(u16x8_ge(h, u16x8_splat(0x7c00))) {
        return None;
    }
    let k = f32x4_splat(f32::from_bits(0x7780_0000));
    let lo = f32x4_mul(i32x4_shl(u32x4_extend_low_u16x8(h), 13), k);
    let hi = f32x4_mul(i32x4_shl(u32x4_extend_high_u16x8(h), 13), k);
    Some((lo, hi))
}

/// Slow path: the engine's general conversion, one scale at a time.
fn scales8_slow(row: &[u8], b: usize) -> (v128, v128) {
    let f = |i: usize| half_to_f32(u16::from_le_bytes([row[2 * (b + i)], row[2 * (b + i) + 1]]));
    (f32x4(f(0), f(1), f(2), f(3)), f32x4(f(4), f(5), f(6), f(7)))
}

fn half_to_f32(h: u16) -> f32 {
    let (sign, em) = (((h & 0x8000) as u32) << 16, (h & 0x7fff) as u32);
    if em >= 0x7c00 {
        let man = (em & 0x3ff) << 13;
        return f32::from_bits(sign | 0x7f80_0000 | man | if man != 0 { 0x40_0000 } else { 0 });
    }
    f32::from_bits(sign | (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits())
}

/// Candidate: eight blocks per step, one scale check per eight, the 16-bit nibble shift.
pub fn dot_b<const U16: bool>(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    assert!(a.group == 32 && blocks.is_multiple_of(8) && row.len() >= blocks * 18 && a.q.len() >= blocks * 32);
    let vals = row[blocks * 2..].as_ptr();
    let q = a.q.as_ptr();
    let (d, s) = (a.drow(0), a.srow(0));
    let mut acc = [f32x4_splat(0.0); 2];
    let mut b = 0;
    while b < blocks {
        // SAFETY: asserted above: blocks b..b + 8 are inside the row and the activations.
        let (i0, i1) = unsafe {
            let v: [v128; 8] = core::array::from_fn(|j| block::<U16>(vals, q, b + j));
            (hsum4(v[0], v[1], v[2], v[3]), hsum4(v[4], v[5], v[6], v[7]))
        };
        let (sq, dq) = (&s[b..b + 8], &d[b..b + 8]);
        // SAFETY: bounds-checked slices of 8 values.
        let (s0, s1, d0, d1) = unsafe {
            let (sp, dp) = (sq.as_ptr() as *const u8, dq.as_ptr() as *const u8);
            (ld(sp), ld(sp.add(16)), ld(dp), ld(dp.add(16)))
        };
        let i0 = i32x4_sub(i0, i32x4_shl(s0, 3));
        let i1 = i32x4_sub(i1, i32x4_shl(s1, 3));
        let (w0, w1) = scales8_fast(row, b).unwrap_or_else(|| scales8_slow(row, b));
        acc[0] = f32x4_add(acc[0], f32x4_mul(f32x4_mul(w0, d0), f32x4_convert_i32x4(i0)));
        acc[1] = f32x4_add(acc[1], f32x4_mul(f32x4_mul(w1, d1), f32x4_convert_i32x4(i1)));
        b += 8;
    }
    let mut out = [0.0f32; 8];
    // SAFETY: 8 f32.
    unsafe {
        v128_store(out.as_mut_ptr() as *mut v128, acc[0]);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc[1]);
    }
    reduce8(out)
}

/// Ablation: `dot_b` with every scale 1 (no conversion).
pub fn dot_x_noscale(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    assert!(a.group == 32 && blocks.is_multiple_of(8) && row.len() >= blocks * 18 && a.q.len() >= blocks * 32);
    let vals = row[blocks * 2..].as_ptr();
    let q = a.q.as_ptr();
    let (d, s) = (a.drow(0), a.srow(0));
    let mut acc = [f32x4_splat(0.0); 2];
    let mut b = 0;
    while b < blocks {
        // SAFETY: as in dot_b.
        let (i0, i1) = unsafe {
            let v: [v128; 8] = core::array::from_fn(|j| block::<true>(vals, q, b + j));
            (hsum4(v[0], v[1], v[2], v[3]), hsum4(v[4], v[5], v[6], v[7]))
        };
        let (sq, dq) = (&s[b..b + 8], &d[b..b + 8]);
        // SAFETY: as in dot_b.
        let (s0, s1, d0, d1) = unsafe {
            let (sp, dp) = (sq.as_ptr() as *const u8, dq.as_ptr() as *const u8);
            (ld(sp), ld(sp.add(16)), ld(dp), ld(dp.add(16)))
        };
        let i0 = i32x4_sub(i0, i32x4_shl(s0, 3));
        let i1 = i32x4_sub(i1, i32x4_shl(s1, 3));
        acc[0] = f32x4_add(acc[0], f32x4_mul(d0, f32x4_convert_i32x4(i0)));
        acc[1] = f32x4_add(acc[1], f32x4_mul(d1, f32x4_convert_i32x4(i1)));
        b += 8;
    }
    f32x4_extract_lane::<0>(f32x4_add(acc[0], acc[1]))
}

/// Ablation: the integer core only (every block's products into one sum, no hsum, no floats).
pub fn dot_x_core(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    assert!(a.group == 32 && row.len() >= blocks * 18 && a.q.len() >= blocks * 32);
    let vals = row[blocks * 2..].as_ptr();
    let q = a.q.as_ptr();
    let mut acc = [i32x4_splat(0); 4];
    let mut b = 0;
    while b + 4 <= blocks {
        for (j, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as in dot_b.
            *acc = i32x4_add(*acc, unsafe { block::<true>(vals, q, b + j) });
        }
        b += 4;
    }
    let s = i32x4_add(i32x4_add(acc[0], acc[1]), i32x4_add(acc[2], acc[3]));
    i32x4_extract_lane::<0>(s) as f32
}

/// Ablation: the weight and activation loads only.
pub fn dot_x_load(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    assert!(a.group == 32 && row.len() >= blocks * 18 && a.q.len() >= blocks * 32);
    let vals = row[blocks * 2..].as_ptr();
    let q = a.q.as_ptr() as *const u8;
    let mut acc = [i32x4_splat(0); 4];
    let mut b = 0;
    while b + 4 <= blocks {
        for (j, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as in dot_b.
            unsafe {
                let x = v128_xor(ld(q.add((b + j) * 32)), ld(q.add((b + j) * 32 + 16)));
                *acc = v128_xor(*acc, v128_xor(ld(vals.add((b + j) * 16)), x));
            }
        }
        b += 4;
    }
    let s = v128_xor(v128_xor(acc[0], acc[1]), v128_xor(acc[2], acc[3]));
    i32x4_extract_lane::<0>(s) as f32
}

/// The engine's body, its scale conversion chosen by `S`: 0 = none (ablation), 1 = the
/// exponent moved by an integer add for positive normal scales (one check per four), 2 =
/// the engine's conversion inlined (multiply by 2^112, sign and special handling).
pub fn dot_c<const S: u8, const U16: bool>(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    if S == 3 && !row_normal(row, blocks) {
        return dot_c::<2, U16>(row, a);
    }
    assert!(a.group == 32 && blocks.is_multiple_of(8) && row.len() >= blocks * 18 && a.q.len() >= blocks * 32);
    let vals = row[blocks * 2..].as_ptr();
    let q = a.q.as_ptr();
    let (d, s) = (a.drow(0), a.srow(0));
    let mut acc = [f32x4_splat(0.0); 2];
    let mut b = 0;
    while b < blocks {
        // SAFETY: asserted above.
        let isum = unsafe {
            hsum4(
                block::<U16>(vals, q, b),
                block::<U16>(vals, q, b + 1),
                block::<U16>(vals, q, b + 2),
                block::<U16>(vals, q, b + 3),
            )
        };
        let (sq, dq) = (&s[b..b + 4], &d[b..b + 4]);
        // SAFETY: bounds-checked slices of 4 values.
        let (s0, d0) = unsafe { (ld(sq.as_ptr() as *const u8), ld(dq.as_ptr() as *const u8)) };
        let isum = i32x4_sub(isum, i32x4_shl(s0, 3));
        let f = f32x4_convert_i32x4(isum);
        let prod = match S {
            0 => f32x4_mul(d0, f),
            1 => f32x4_mul(f32x4_mul(scales4_int(row, b), d0), f),
            3 => f32x4_mul(f32x4_mul(scales4_unchecked(row, b), d0), f),
            _ => f32x4_mul(f32x4_mul(scales4_engine(row, b), d0), f),
        };
        let k = (b / 4) & 1;
        acc[k] = f32x4_add(acc[k], prod);
        b += 4;
    }
    let mut out = [0.0f32; 8];
    // SAFETY: 8 f32.
    unsafe {
        v128_store(out.as_mut_ptr() as *mut v128, acc[0]);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc[1]);
    }
    reduce8(out)
}

/// Four scales: positive normal halves (0x0400 <= h < 0x7c00) by moving the exponent with
/// an integer add (the same bits as the multiply by 2^112); anything else the slow way.
#[inline(always)]
fn scales4_int(row: &[u8], b: usize) -> v128 {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds 8 bytes.
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(bytes.as_ptr() as *const u64) });
    // h - 0x400 < 0x7800 (unsigned) <=> positive normal.
    let bad = u32x4_ge(i32x4_sub(h, i32x4_splat(0x400)), i32x4_splat(0x7800));
    if v128_any_true(bad) {
        return scales4_engine(row, b);
    }
    i32x4_add(i32x4_shl(h, 13), i32x4_splat(112 << 23))
}

/// The engine's `scales4`.
#[inline(always)]
fn scales4_engine(row: &[u8], b: usize) -> v128 {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds the 8 bytes read.
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(bytes.as_ptr() as *const u64) });
    let sign = i32x4_shl(v128_and(h, i32x4_splat(0x8000)), 16);
    let em = v128_and(h, i32x4_splat(0x7fff));
    let finite = f32x4_mul(i32x4_shl(em, 13), f32x4_splat(f32::from_bits(0x7780_0000)));
    let is_special = i32x4_ge(em, i32x4_splat(0x7c00));
    if !v128_any_true(is_special) {
        return v128_or(sign, finite);
    }
    let man = i32x4_shl(v128_and(em, i32x4_splat(0x3ff)), 13);
    let quiet = v128_and(v128_not(i32x4_eq(man, i32x4_splat(0))), i32x4_splat(0x40_0000));
    let special = v128_or(v128_or(i32x4_splat(0x7f80_0000), man), quiet);
    v128_or(sign, v128_bitselect(special, finite, is_special))
}

/// Whether every scale of the row is a positive normal half (one pass over the scales).
#[inline(always)]
fn row_normal(row: &[u8], blocks: usize) -> bool {
    let s = &row[..2 * blocks];
    let mut bad = i16x8_splat(0);
    let mut i = 0;
    while i + 16 <= s.len() {
        // SAFETY: i + 16 <= s.len().
        let h = unsafe { ld(s.as_ptr().add(i)) };
        bad = v128_or(bad, u16x8_ge(i16x8_sub(h, i16x8_splat(0x400)), u16x8_splat(0x7800)));
        i += 16;
    }
    !v128_any_true(bad)
}

/// Four positive normal scales (checked by `row_normal`) by the exponent add.
#[inline(always)]
fn scales4_unchecked(row: &[u8], b: usize) -> v128 {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds 8 bytes.
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(bytes.as_ptr() as *const u64) });
    i32x4_add(i32x4_shl(h, 13), i32x4_splat(112 << 23))
}

/// Loop constants made opaque once per row (`black_box`), so that V8 keeps them in
/// registers instead of materializing each v128.const where it is used.
#[derive(Clone, Copy)]
struct K {
    m15: v128,
    sign: v128,
    em: v128,
    pow112: v128,
    special: v128,
}

impl K {
    #[inline(always)]
    fn new() -> K {
        core::hint::black_box(K {
            m15: u8x16_splat(15),
            sign: i32x4_splat(0x8000),
            em: i32x4_splat(0x7fff),
            pow112: f32x4_splat(f32::from_bits(0x7780_0000)),
            special: i32x4_splat(0x7c00),
        })
    }
}

#[inline(always)]
unsafe fn block_k(vals: *const u8, q: *const i8, b: usize, k: &K) -> v128 {
    let bytes = ld(vals.add(b * 16));
    let (x0, x1) = (ld(q.add(b * 32) as *const u8), ld(q.add(b * 32 + 16) as *const u8));
    dot(dot(i32x4_splat(0), v128_and(bytes, k.m15), x0), v128_and(u16x8_shr(bytes, 4), k.m15), x1)
}

#[inline(always)]
fn scales4_k(row: &[u8], b: usize, k: &K) -> v128 {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds the 8 bytes read.
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(bytes.as_ptr() as *const u64) });
    let sign = i32x4_shl(v128_and(h, k.sign), 16);
    let em = v128_and(h, k.em);
    let finite = f32x4_mul(i32x4_shl(em, 13), k.pow112);
    if !v128_any_true(i32x4_ge(em, k.special)) {
        return v128_or(sign, finite);
    }
    scales4_engine(row, b)
}

/// `dot_c::<2, true>` with the constants of `K`.
pub fn dot_d(row: &[u8], a: &ActQ) -> f32 {
    let blocks = a.blocks;
    assert!(a.group == 32 && blocks.is_multiple_of(8) && row.len() >= blocks * 18 && a.q.len() >= blocks * 32);
    let k = K::new();
    let vals = row[blocks * 2..].as_ptr();
    let q = a.q.as_ptr();
    let (d, s) = (a.drow(0), a.srow(0));
    let mut acc = [f32x4_splat(0.0); 2];
    let mut b = 0;
    while b < blocks {
        // SAFETY: asserted above.
        let isum = unsafe {
            hsum4(
                block_k(vals, q, b, &k),
                block_k(vals, q, b + 1, &k),
                block_k(vals, q, b + 2, &k),
                block_k(vals, q, b + 3, &k),
            )
        };
        let (sq, dq) = (&s[b..b + 4], &d[b..b + 4]);
        // SAFETY: bounds-checked slices of 4 values.
        let (s0, d0) = unsafe { (ld(sq.as_ptr() as *const u8), ld(dq.as_ptr() as *const u8)) };
        let isum = i32x4_sub(isum, i32x4_shl(s0, 3));
        let prod = f32x4_mul(f32x4_mul(scales4_k(row, b, &k), d0), f32x4_convert_i32x4(isum));
        let j = (b / 4) & 1;
        acc[j] = f32x4_add(acc[j], prod);
        b += 4;
    }
    let mut out = [0.0f32; 8];
    // SAFETY: 8 f32.
    unsafe {
        v128_store(out.as_mut_ptr() as *mut v128, acc[0]);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc[1]);
    }
    reduce8(out)
}
