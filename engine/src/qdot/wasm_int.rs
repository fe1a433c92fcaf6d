//! wasm SIMD128 one-position kernel of int4 rows of group 32 or 64 inside their bounds
//! (decode's experts) for relaxed builds, [`runs_int4`]: `wasm::body`'s sums, products and order, built for
//! how V8 compiles it as `wasm_k::runs_k` is.

use core::arch::wasm32::*;

use super::wasm::{finish, hsum4, nibble_chunk, scales4, Consts};
use super::{round4, ActQ, CHUNK};
use crate::math::reduce8;

/// `wasm::body` for an int4 row of group `G` (32 or 64) inside its bounds (`wasm_rows::row_form`
/// checks), `W16` as there: the same integer sums (integer adds, exact in any order), the
/// same float products, (scales * d) * f32(isum - 8 s), and per-lane order (four blocks per
/// step into lanes b mod 8; the blocks after the last multiple of four by `wasm::finish`),
/// so the same bits. Built for V8 as `wasm_k::runs_k` (docs/kernels.md "Q5_K rows"):
/// TurboFan moves the loads of a straight-line body to its start, so every block's vectors
/// of a step were live at once; a volatile store of the partial sums after every two blocks
/// of 32 values (each block of 64) keeps each piece's loads next to their use (a store stays
/// in place among the loads, what it stores is computed before it). Raw pointers after one
/// bounds assert per row, eight blocks per iteration, a function of its own (not inlined
/// into `wasm_rows::row_form`). tools/bench/qdot-wasm in Chromium, relaxed build (the threaded
/// one; `wasm_rows::row_form` takes this there alone): group 32 12-15% faster, 64 6-8%, from L2
/// and with ROWS=16384. Slower this way, so left on `wasm::body`: group 128 (10%), int8 of
/// group 128 (halves, W16: 10-20%, with a store per block, per chunk or none), and the plain
/// build's int4 (12% with a store per two blocks, as fast with one per block).
#[inline(never)]
pub(super) fn runs_int4<const G: usize, const W16: bool>(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let blocks = a.blocks;
    let at = round4(blocks * 2);
    let (q, d, s) = (a.qrow(p), a.drow(p), a.srow(p));
    let full = blocks / 4 * 4;
    assert!(row.len() >= at + blocks * G / 2 && q.len() >= blocks * G && d.len() >= full && s.len() >= full);
    let k = Consts::new();
    let mut sink = i32x4_splat(0);
    let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    // SAFETY: every pointer below stays inside `row`, `q`, `d` or `s` (asserted above:
    // block b < full reads values at + G b / 2.., activations G b.., d and s 4b..; v128
    // loads have no alignment requirement).
    unsafe {
        let vals = row.as_ptr().add(at);
        let (qp, dp, sp) = (q.as_ptr() as *const u8, d.as_ptr() as *const u8, s.as_ptr() as *const u8);
        // Blocks b..b + 4: acc + (scales * d) * f32(isum - (s << 3)), as `wasm::body`.
        let quad = |acc: v128, b: usize, sink: &mut v128| {
            let isum = quad_sums::<G, W16>(vals.add(b * G / 2), qp.add(b * G), &k, sink);
            let isum = i32x4_sub(isum, i32x4_shl(ld(sp.add(4 * b)), 3));
            let db = ld(dp.add(4 * b));
            f32x4_add(acc, f32x4_mul(f32x4_mul(scales4(row, b, &k), db), f32x4_convert_i32x4(isum)))
        };
        // Both halves written out (one quad per step with the accumulators swapped was
        // 7% slower from L2).
        let mut b = 0;
        while b + 8 <= full {
            acc0 = quad(acc0, b, &mut sink);
            acc1 = quad(acc1, b + 4, &mut sink);
            b += 8;
        }
        if b < full {
            acc0 = quad(acc0, b, &mut sink);
        }
    }
    if full == blocks {
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 f32; v128.store has no alignment requirement.
        unsafe {
            v128_store(out.as_mut_ptr() as *mut v128, acc0);
            v128_store(out.as_mut_ptr().add(4) as *mut v128, acc1);
        }
        return reduce8(out);
    }
    finish::<true, false, G, false, W16>([acc0, acc1], row, a, p, full, &k)
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

/// The integer sums of four consecutive blocks (`v` their nibbles, `q` their activations),
/// one per lane, as `wasm::hsum4` gives them (integer adds: exact in any order), without
/// int4's -8 sum(x): group 32 with a store into `sink` after each pair of blocks (as
/// `wasm_k::quad`), group 64 after each block (six loads each time).
#[inline(always)]
unsafe fn quad_sums<const G: usize, const W16: bool>(v: *const u8, q: *const u8, k: &Consts, sink: &mut v128) -> v128 {
    let blk = |j: usize| block::<G, W16>(v.add(j * G / 2), q.add(j * G), k);
    if G == CHUNK {
        let t0 = pair_sums(blk(0), blk(1));
        core::ptr::write_volatile(sink, t0);
        let t1 = pair_sums(blk(2), blk(3));
        core::ptr::write_volatile(sink, t1);
        return i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(t0, t1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1));
    }
    let mut s = [i32x4_splat(0); 4];
    for (j, s) in s.iter_mut().enumerate() {
        *s = blk(j);
        core::ptr::write_volatile(sink, *s);
    }
    hsum4(s[0], s[1], s[2], s[3])
}

/// `wasm::hsum4`'s first step for two blocks' partial sums.
#[inline(always)]
fn pair_sums(s0: v128, s1: v128) -> v128 {
    i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s0, s1), i32x4_shuffle::<2, 6, 3, 7>(s0, s1))
}

/// `wasm::block_lanes` of one int4 block (`v` its nibbles, `q` its activations) by raw
/// pointers: the same products into the same lanes.
#[inline(always)]
unsafe fn block<const G: usize, const W16: bool>(v: *const u8, q: *const u8, k: &Consts) -> v128 {
    let mut sum = i32x4_splat(0);
    for c in 0..G / CHUNK {
        let bytes = ld(v.add(16 * c));
        let (x0, x1) = (ld(q.add(32 * c)), ld(q.add(32 * c + 16)));
        let (lo, hi) = (v128_and(bytes, k.low4), v128_and(u16x8_shr(bytes, 4), k.low4));
        sum = nibble_chunk::<W16>(sum, lo, hi, x0, x1);
    }
    sum
}
