//! wasm SIMD128 one-position kernels of Q4K rows (`ActQ::k4`) and Q5K rows (`ActQ::k5`),
//! and the pieces the many-position tile shares with them ([`k4_scales8`], [`fifth16`]):
//! the int4 nibble sums (u = nibble, or nibble + 16 * fifth bit for Q5K: at most 31, so
//! the relaxed dot is exact on every engine, `wasm::nibbles16`) and the reference's Q4K
//! step per block, (A_b * d_b) * f32(isum_b) - B_b * ds_b, four blocks per f32x4 in the
//! reference's lanes (docs/kernels.md "Q4_K rows", "Q5_K rows").

use core::arch::wasm32::*;

use super::wasm::{block_lanes, finish, hsum4, load16, load_q, nibble_chunk, Consts};
use super::{round4, ActQ, CHUNK, K4_INDEX};
use crate::math::reduce8;

/// The constants of [`runs_k`] and [`k4_scales8`], opaque as `wasm::Consts` (V8 would
/// otherwise rebuild each `v128.const` where it is used). The product by [`KConsts::mul`]
/// must stay a product: LLVM turns a product by known powers of two into a shift per lane,
/// which wasm lacks, and splits it into 8 scalar shifts with 16 lane moves.
#[derive(Clone, Copy)]
pub(super) struct KConsts {
    low4: v128,
    /// 0x10 per byte: a Q5K value's fifth bit.
    five: v128,
    /// 2^(8 - s) per 16-bit half of lane j, s = 6j mod 8 (`K4_SHIFT`: 0, 6, 4, 2).
    mul: v128,
    /// 63 per 16-bit half: a 6-bit field.
    six: v128,
    /// The low 16-bit half of each 32-bit lane.
    low16: v128,
}

impl KConsts {
    #[inline(always)]
    pub(super) fn new() -> KConsts {
        core::hint::black_box(KConsts {
            low4: u8x16_splat(15),
            five: u8x16_splat(0x10),
            mul: i16x8(256, 256, 4, 4, 16, 16, 64, 64),
            six: i16x8_splat(63),
            low16: i32x4_splat(0xffff),
        })
    }
}

/// A Q4K header's factors (A, B of tensor::q4k_scales) for blocks 0-3 and 4-7 of its run:
/// per half, one swizzle puts in lane l the two bytes holding sc_j (j = 4h + l, bit 6j of
/// the header's string) in its low 16-bit half and the two holding m_j (bit 48 + 6j: the
/// same offset s = 6j mod 8 in its byte) in its high half; a 16-bit product by 2^(8 - s)
/// moves bits s..s + 6 to 8..14 (inside the half: nothing of the field is lost) and a
/// 16-bit shift by 8 brings them to bit 0 of their half, the mask keeps the six (wasm
/// shifts all lanes alike). d and dmin convert once ([`f16_to_f32`]); the products d * sc
/// and dmin * m are exact.
#[inline(always)]
pub(super) fn k4_scales8(head: &[u8], kc: &KConsts) -> [(v128, v128); 2] {
    let head = &head[..16];
    // SAFETY: `head` holds the header's 16 bytes (bounds-checked slice).
    k4_factors(unsafe { v128_load(head.as_ptr() as *const v128) }, kc)
}

/// [`k4_scales8`] of the header `v` (its 16 bytes, loaded).
#[inline(always)]
fn k4_factors(v: v128, kc: &KConsts) -> [(v128, v128); 2] {
    let half = |x: u16| f32x4_splat(f16_to_f32(x));
    let (d, dmin) = (half(u16x8_extract_lane::<0>(v)), half(u16x8_extract_lane::<1>(v)));
    [0, 1].map(|h| {
        // SAFETY: each half of the table holds 16 bytes.
        let idx = unsafe { v128_load(K4_INDEX[16 * h..].as_ptr() as *const v128) };
        let w = v128_and(u16x8_shr(i16x8_mul(i8x16_swizzle(v, idx), kc.mul), 8), kc.six);
        let (sc, m) = (v128_and(w, kc.low16), u32x4_shr(w, 16));
        (f32x4_mul(d, f32x4_convert_i32x4(sc)), f32x4_mul(dmin, f32x4_convert_i32x4(m)))
    })
}

/// `half::f16::to_f32`'s bits (its software conversion, which wasm uses): a normal value
/// by integer work (exponent and mantissa moved into place, the bias moved by 112), a
/// subnormal one as its mantissa times 2^-24 (exact, and neither operand subnormal),
/// exponent 31 as f32's all-ones exponent with a NaN's quiet bit. Once per run of eight blocks, twice. The earlier form multiplied the
/// subnormal f32 em << 13 by 2^112 for every value: the same bits, but on Intel each such
/// product with a subnormal operand takes a microcode assist, and a Q5_K block's d is
/// often an f16 subnormal (the OLMoE-shaped Q5_K_M import: the browser decoded at 0.32x
/// of native, its `runs_k` 3.3x q4_k's time for 1.2x the bytes; docs/kernels.md).
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let (sign, em) = ((h as u32 & 0x8000) << 16, h as u32 & 0x7fff);
    if em >= 0x7c00 {
        let man = (em & 0x3ff) << 13;
        return f32::from_bits(sign | 0x7f80_0000 | man | if man != 0 { 0x40_0000 } else { 0 });
    }
    if em >= 0x400 {
        return f32::from_bits(sign | ((em << 13) + (112 << 23)));
    }
    f32::from_bits(sign | (em as f32 * f32::from_bits(0x3380_0000)).to_bits())
}

/// The fifth bits of block `b` of a Q5K row (`high`: the row's fifth-bit bytes, 32 per run
/// of eight blocks, tensor::q5k_bit) as 0x10 bytes over the block's 16 nibble bytes: (for
/// the low nibbles, for the high ones). Sub-block j = b mod 8 keeps those of nibble byte m
/// in byte 16 (j / 4) + m, bits 2 (j mod 4) and 2 (j mod 4) + 1: a 16-bit shift right by
/// 2 (j mod 4) <= 6 brings them to bits 0 and 1 of their byte (what crosses from the byte
/// above lands at bit 2 or higher), shifts left by 4 and 3 to bit 4, which the mask keeps
/// (what crosses into the byte above lands in its bits 0-3).
#[inline(always)]
pub(super) fn fifth16<const CHECKED: bool>(high: &[u8], b: usize, kc: &Consts) -> (v128, v128) {
    let h = load16::<CHECKED>(high, 32 * (b / 8) + 16 * (b % 8 / 4));
    let h = u16x8_shr(h, 2 * (b % 4) as u32);
    (v128_and(u16x8_shl(h, 4), kc.five), v128_and(u16x8_shl(h, 3), kc.five))
}

/// `wasm::block_lanes` of block `b` of a Q5K row (group 32): u = nibble + 16 * fifth bit
/// ([`fifth16`]), at most 31, summed as int4's nibbles (`wasm::nibble_chunk`; exact).
#[inline(always)]
fn block_lanes_k5<const CHECKED: bool, const W16: bool>(
    vals: &[u8],
    high: &[u8],
    q: &[i8],
    b: usize,
    kc: &Consts,
) -> v128 {
    let c = b * CHUNK;
    let (x0, x1) = (load_q::<CHECKED>(q, c), load_q::<CHECKED>(q, c + 16));
    let bytes = load16::<CHECKED>(vals, c / 2);
    let (l5, h5) = fifth16::<CHECKED>(high, b, kc);
    let lo = v128_or(v128_and(bytes, kc.low4), l5);
    let hi = v128_or(v128_and(u16x8_shr(bytes, 4), kc.low4), h5);
    nibble_chunk::<W16>(i32x4_splat(0), lo, hi, x0, x1)
}

/// `wasm::body` for a Q4K row (`ActQ::k4`: group 32, whole runs of eight blocks, `ds`
/// made) or, `K5`, a Q5K row ([`block_lanes_k5`]) whose bytes may end early (`CHECKED`:
/// zero-filled loads; rows inside their bounds take [`runs_k`]): per block
/// (A_b * d_b) * f32(isum_b) - B_b * ds_b, A and B from the run's header ([`k4_scales8`]),
/// four blocks per step into the reference's lanes.
#[inline(always)]
pub(super) fn body_k<const CHECKED: bool, const W16: bool, const K5: bool>(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let blocks = a.blocks;
    let vals = &row[round4(blocks * 2)..];
    // Q5K: the fifth-bit bytes after the nibbles.
    let high = if K5 { vals.get(blocks * CHUNK / 2..).unwrap_or(&[]) } else { &[][..] };
    let ds = &a.ds[p * a.dstride()..(p + 1) * a.dstride()];
    let (q, d) = (a.qrow(p), a.drow(p));
    let (k, kk) = (Consts::new(), KConsts::new());
    let lanes = |b: usize| {
        if K5 {
            block_lanes_k5::<CHECKED, W16>(vals, high, q, b, &k)
        } else {
            block_lanes::<true, CHECKED, 32, false, W16>(vals, q, b, CHUNK, &k)
        }
    };
    let mut acc = [f32x4_splat(0.0); 2];
    // Whole runs of eight blocks (a Q4K row has no other), each header decoded once.
    for run in 0..blocks / 8 {
        let f = k4_scales8(&row[16 * run..16 * run + 16], &kk);
        for (h, (am, bm)) in f.into_iter().enumerate() {
            let b = 8 * run + 4 * h;
            let (s0, s1, s2, s3) = (lanes(b), lanes(b + 1), lanes(b + 2), lanes(b + 3));
            let (dq, dsq) = (&d[b..b + 4], &ds[b..b + 4]);
            // SAFETY: `dq` and `dsq` hold 4 f32 (bounds-checked slices).
            let (db, dsb) = unsafe { (v128_load(dq.as_ptr() as *const v128), v128_load(dsq.as_ptr() as *const v128)) };
            let t1 = f32x4_mul(f32x4_mul(am, db), f32x4_convert_i32x4(hsum4(s0, s1, s2, s3)));
            acc[h] = f32x4_add(acc[h], f32x4_sub(t1, f32x4_mul(bm, dsb)));
        }
    }
    finish::<true, CHECKED, 32, false, W16>(acc, row, a, p, blocks, &k)
}

/// [`body_k`] for a row inside its bounds (every row of a model: `wasm_rows::row_form` checks),
/// the same products, sums and order (so the same bits), built for how V8 compiles it
/// (tools/bench/qdot-wasm, KQUANT=4|5 or FORMATS; docs/kernels.md "Q5_K rows"):
/// - V8 (TurboFan) moves the loads of a straight-line body to its start and groups the
///   rest by operation. With eight blocks in one body (the loop over a run's halves
///   unrolled) every block's vectors were live at once and most went through the stack.
///   A store stays where it is among the loads, and what it stores is computed before it:
///   after each pair of blocks their partial sums are stored (volatile, so LLVM keeps the
///   store; one store per two blocks), and the next pair's loads come after.
/// - The header's factors by [`k4_scales8`] (a 16-bit product, not scalar shifts).
/// - A Q5K half-run's 16 fifth-bit bytes are loaded once, and each sub-block's bits are
///   brought to bit 4 by constant shifts ([`fifth`]).
/// - Raw pointers: the bounds are asserted once per row.
/// - A function of its own (not inlined into `wasm_rows::row_form`, whose many paths V8
///   compiles as one function).
#[inline(never)]
pub(super) fn runs_k<const W16: bool, const K5: bool>(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let (blocks, runs) = (a.blocks, a.blocks / 8);
    let ds = &a.ds[p * a.dstride()..(p + 1) * a.dstride()];
    let (q, d) = (a.qrow(p), a.drow(p));
    // Per run: 16 header bytes, 128 nibble bytes and (Q5K) 32 fifth-bit bytes.
    let rb = runs * if K5 { 176 } else { 144 };
    assert!(row.len() >= rb && q.len() >= blocks * CHUNK && d.len() >= blocks && ds.len() >= blocks);
    let kc = KConsts::new();
    let mut sink = i32x4_splat(0);
    let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    // SAFETY: every pointer below stays inside `row`, `q`, `d` or `ds` (asserted above:
    // run r reads header bytes 16r.., nibbles 16 runs + 128r.., fifth bits 144 runs + 32r..,
    // activations 256r.., factors 8r..; v128 loads have no alignment requirement).
    unsafe {
        let vals = row.as_ptr().add(16 * runs);
        let high = vals.add(128 * runs);
        let (q, d, ds) = (q.as_ptr() as *const u8, d.as_ptr() as *const u8, ds.as_ptr() as *const u8);
        // Blocks 4h..4h + 4 of run r: acc + ((A * d) * f32(isum) - B * ds).
        let half = |acc: v128, r: usize, h: usize, (am, bm): (v128, v128), sink: &mut v128| {
            let at = 8 * r + 4 * h;
            let i = quad::<W16, K5>(vals.add(16 * at), q.add(32 * at), high.add(16 * (2 * r + h)), &kc, sink);
            let (db, dsb) = (ld(d.add(4 * at)), ld(ds.add(4 * at)));
            let t1 = f32x4_mul(f32x4_mul(am, db), f32x4_convert_i32x4(i));
            f32x4_add(acc, f32x4_sub(t1, f32x4_mul(bm, dsb)))
        };
        for r in 0..runs {
            let [f0, f1] = k4_factors(ld(row.as_ptr().add(16 * r)), &kc);
            // The two halves written out (a loop over them stayed a loop: V8 then ran half
            // as many blocks per iteration, with a select of the accumulator).
            acc0 = half(acc0, r, 0, f0, &mut sink);
            acc1 = half(acc1, r, 1, f1, &mut sink);
        }
    }
    let mut out = [0.0f32; 8];
    // SAFETY: `out` holds 8 f32; v128.store has no alignment requirement.
    unsafe {
        v128_store(out.as_mut_ptr() as *mut v128, acc0);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc1);
    }
    reduce8(out)
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

/// The integer sums of four consecutive blocks (sub-blocks 4h..4h + 4 of a run: `v` their
/// 64 nibble bytes, `q` their 128 activations, `h` the half-run's 16 fifth-bit bytes, read
/// where `K5`), one per lane, as `hsum4` gives them (integer adds: exact in any order),
/// with a store into `sink` after each pair ([`runs_k`]).
#[inline(always)]
unsafe fn quad<const W16: bool, const K5: bool>(
    v: *const u8,
    q: *const u8,
    h: *const u8,
    kc: &KConsts,
    sink: &mut v128,
) -> v128 {
    let h = if K5 { ld(h) } else { i32x4_splat(0) };
    let t0 = pair_sums(block::<W16, K5, 0>(v, q, h, kc), block::<W16, K5, 1>(v, q, h, kc));
    core::ptr::write_volatile(sink, t0);
    let t1 = pair_sums(block::<W16, K5, 2>(v, q, h, kc), block::<W16, K5, 3>(v, q, h, kc));
    core::ptr::write_volatile(sink, t1);
    i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(t0, t1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1))
}

/// `hsum4`'s first step for two blocks' partial sums: [s0 lanes 0 + 2, s1 lanes 0 + 2,
/// s0 1 + 3, s1 1 + 3].
#[inline(always)]
fn pair_sums(s0: v128, s1: v128) -> v128 {
    i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s0, s1), i32x4_shuffle::<2, 6, 3, 7>(s0, s1))
}

/// Block `J` (0..4) of a quad ([`quad`]) as four partial sums: u = nibble (+ 16 * fifth
/// bit, [`fifth`]), summed by `wasm::nibble_chunk` in the form `W16`.
#[inline(always)]
unsafe fn block<const W16: bool, const K5: bool, const J: usize>(
    v: *const u8,
    q: *const u8,
    h: v128,
    kc: &KConsts,
) -> v128 {
    let bytes = ld(v.add(16 * J));
    let (x0, x1) = (ld(q.add(32 * J)), ld(q.add(32 * J + 16)));
    let mut lo = v128_and(bytes, kc.low4);
    let mut hi = v128_and(u16x8_shr(bytes, 4), kc.low4);
    if K5 {
        let (l5, h5) = fifth::<J>(h, kc);
        (lo, hi) = (v128_or(lo, l5), v128_or(hi, h5));
    }
    nibble_chunk::<W16>(i32x4_splat(0), lo, hi, x0, x1)
}

/// [`fifth16`] of sub-block J of a half-run (bits 2J and 2J + 1 of each byte of `h`) by
/// one constant 16-bit shift each: the bit that lands at bit 4 of a byte comes from the
/// same byte (a shift left by s <= 4 takes bit 4 - s of the low byte and bit 12 - s >= 8 of
/// the high one, a shift right by s <= 3 bits 4 + s <= 7 and 12 + s <= 15), and the mask
/// keeps bit 4 alone.
#[inline(always)]
fn fifth<const J: usize>(h: v128, kc: &KConsts) -> (v128, v128) {
    let (lo, hi) = match J {
        0 => (u16x8_shl(h, 4), u16x8_shl(h, 3)),
        1 => (u16x8_shl(h, 2), u16x8_shl(h, 1)),
        2 => (h, u16x8_shr(h, 1)),
        _ => (u16x8_shr(h, 2), u16x8_shr(h, 3)),
    };
    (v128_and(lo, kc.five), v128_and(hi, kc.five))
}

/// Both wasm f16 conversions ([`f16_to_f32`], `wasm::scales4`) against `half` for every
/// one of the 65536 f16 values (NaNs: both NaN), for `super::check::check_paths`. Returns
/// how many were compared, or the first difference.
pub(super) fn check_f16() -> Result<usize, String> {
    let k = super::wasm::Consts::new();
    let mut row = [0u8; 8];
    for h in 0..=u16::MAX {
        let want = half::f16::from_bits(h).to_f32();
        let same = |got: f32| got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
        row[2 * (h as usize % 4)..][..2].copy_from_slice(&h.to_le_bytes());
        let mut lanes = [0f32; 4];
        // SAFETY: `lanes` holds 4 f32; v128.store has no alignment requirement.
        unsafe { v128_store(lanes.as_mut_ptr() as *mut v128, super::wasm::scales4(&row, 0, &k)) };
        let (one, four) = (f16_to_f32(h), lanes[h as usize % 4]);
        if !same(one) || !same(four) {
            return Err(format!("f16 {h:#06x}: {one:e} / scales4 {four:e} vs {want:e}"));
        }
    }
    Ok(1 << 16)
}
