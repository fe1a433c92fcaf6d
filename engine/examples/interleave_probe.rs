//! Probe for issue #35 (not used by the engine): would int4/g32 rows stored 16 rows
//! interleaved make the few-position kernel cheap enough per position for a batch of four
//! to approach four times one?
//!
//! `x86_few` applies each loaded run of a row to every position, but per position and run
//! of eight blocks it folds the `vpdpbusd` lanes of each block into one sum (shuffles,
//! permutes) before the float combination: more instructions than the products themselves.
//! Here 16 rows are stored interleaved (per block: the 16 rows' f16 scales, then four
//! 64-byte vectors whose 32-bit lane r holds four bytes of nibbles of row r), so one
//! `vpdpbusd` against four broadcast activation values adds into each row's own lane: a
//! block's 16 row sums end in one register, with no fold, and the float combination is
//! the reference's lane by lane (acc[b mod 8] per row, then `reduce8`): the same bits,
//! which the probe checks against `qdot::dot_rows_many` before timing.
//!
//!     cargo run --release -p colibri-engine --example interleave_probe -- [MB] [reps]
//!
//! Prints JSON: for 1, 2, 4 and 8 positions, the weight GB/s of the engine's kernel
//! (`dot_rows` at one position, `dot_rows_many` at more: what `kernels::matmul` runs; one thread) and of the interleaved one over the same matrices
//! (1024 x 2048, an OLMoE expert's gate), streamed from memory. Needs AVX-512 VNNI.

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::time::Instant;

    use colibri_engine::kernels::bench;
    use colibri_engine::qdot::{dot_rows, dot_rows_many, ActQ, Simd};
    use colibri_engine::tensor::DType;

    /// Rows per interleaved group (one 32-bit lane each in a 512-bit vector).
    const R: usize = 16;
    /// Bytes per block of a group: 16 f16 scales, then 16 rows x 16 bytes of nibbles (int4)
    /// or 32 values (int8).
    const fn rec(int8: bool) -> usize {
        2 * R + if int8 { 32 } else { 16 } * R
    }
    /// Most positions the probe's kernel takes.
    const MAX_N: usize = 8;

    /// The rows of a stored int4/g32 or int8/g32 matrix (`rb` bytes each, a multiple of 16
    /// rows) in the interleaved layout; int8 values stored as w + 128 (`vpdpbusd`'s unsigned
    /// side).
    fn repack(bytes: &[u8], rb: usize, rows: usize, cols: usize, int8: bool) -> Vec<u8> {
        let (blocks, size) = (cols / 32, rec(int8));
        let (head, per) = (blocks.div_ceil(2) * 4, if int8 { 32 } else { 16 });
        let flip = if int8 { 0x80 } else { 0 };
        let mut out = vec![0u8; rows / R * blocks * size];
        for (g, recs) in out.chunks_exact_mut(blocks * size).enumerate() {
            for (b, rec) in recs.chunks_exact_mut(size).enumerate() {
                for r in 0..R {
                    let row = &bytes[(g * R + r) * rb..][..rb];
                    rec[2 * r..2 * r + 2].copy_from_slice(&row[2 * b..2 * b + 2]);
                    for k in 0..per / 4 {
                        let at = head + per * b + 4 * k;
                        for (d, s) in rec[2 * R + 64 * k + 4 * r..][..4].iter_mut().zip(&row[at..at + 4]) {
                            *d = s ^ flip;
                        }
                    }
                }
            }
        }
        out
    }

    mod avx512 {
        use std::arch::x86_64::*;

        use super::{rec, ActQ, MAX_N, R};

        /// `out[row * n + p]` for every row of `packed` (groups of 16) and position p < n of
        /// `a` (int4/g32 rows with split activations, or int8/g32 with unsplit ones), in the
        /// reference's float order.
        ///
        /// SAFETY (caller): AVX-512 F/BW/VNNI and F16C present; `packed` from `repack` of rows of
        /// `a.cols` columns; n <= MAX_N and n <= a.n; `out` holds rows * n values.
        #[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub unsafe fn rows(int8: bool, packed: &[u8], a: &ActQ, n: usize, out: &mut [f32], ahead: usize) {
            // SAFETY: the caller's contract. The count known to the compiler keeps one or two
            // positions' accumulators in registers.
            unsafe {
                match (int8, n) {
                    (false, 1) => rows_n::<1, false>(packed, a, 1, out, ahead),
                    (false, 2) => rows_n::<2, false>(packed, a, 2, out, ahead),
                    (false, _) => rows_n::<MAX_N, false>(packed, a, n, out, ahead),
                    (true, 1) => rows_n::<1, true>(packed, a, 1, out, ahead),
                    (true, 2) => rows_n::<2, true>(packed, a, 2, out, ahead),
                    (true, _) => rows_n::<MAX_N, true>(packed, a, n, out, ahead),
                }
            }
        }

        /// [`rows`] with up to `N` positions' accumulators.
        #[inline(always)]
        unsafe fn rows_n<const N: usize, const INT8: bool>(
            packed: &[u8],
            a: &ActQ,
            n: usize,
            out: &mut [f32],
            ahead: usize,
        ) {
            let (blocks, size) = (a.blocks, rec(INT8));
            let (ds, qs) = (a.dstride(), blocks * 32);
            // SAFETY: the caller's contract: each group is blocks * REC bytes of `packed`; the
            // activations hold qs values and ds scales and sums per position.
            unsafe {
                let low4 = _mm512_set1_epi8(0x0f);
                let mut acc = [[_mm512_setzero_ps(); 8]; N];
                for (g, group) in packed.chunks_exact(blocks * size).enumerate() {
                    for a in acc.iter_mut().take(n) {
                        *a = [_mm512_setzero_ps(); 8];
                    }
                    for b in 0..blocks {
                        let rec = group.as_ptr().add(b * size);
                        if ahead > 0 {
                            // The stream's next lines (a wrapping pointer: prefetches past the
                            // end are harmless).
                            let at = rec.wrapping_add(ahead);
                            for l in 0..size.div_ceil(64) {
                                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * l) as *const i8);
                            }
                        }
                        let ws = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                        // int4: the low nibbles of the four vectors, then their high ones;
                        // int8: the eight stored vectors. Vector k meets the activations'
                        // values 4k..4k + 4 of the block (int4: in split order).
                        let mut w = [_mm512_setzero_si512(); 8];
                        for k in 0..if INT8 { 8 } else { 4 } {
                            let v = _mm512_loadu_si512(rec.add(2 * R + 64 * k) as *const __m512i);
                            if INT8 {
                                w[k] = v;
                            } else {
                                w[k] = _mm512_and_si512(v, low4);
                                w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                            }
                        }
                        for (p, acc) in acc.iter_mut().enumerate().take(n) {
                            let q = a.q.as_ptr().add(p * qs + b * 32) as *const i32;
                            // Four independent sums (integers: any order is exact), so that
                            // `vpdpbusd`'s latency overlaps.
                            let mut part = [_mm512_setzero_si512(); 4];
                            for (k, &wk) in w.iter().enumerate() {
                                let x = _mm512_set1_epi32(q.add(k).read_unaligned());
                                part[k % 4] = _mm512_dpbusd_epi32(part[k % 4], wk, x);
                            }
                            let isum = _mm512_add_epi32(
                                _mm512_add_epi32(part[0], part[1]),
                                _mm512_add_epi32(part[2], part[3]),
                            );
                            // The stored values are w + 8 (int4) or w + 128 (int8): minus that
                            // times the block's activation sum.
                            let bias = *a.s.get_unchecked(p * ds + b) << if INT8 { 7 } else { 3 };
                            let isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(bias));
                            let wd = _mm512_mul_ps(ws, _mm512_set1_ps(*a.d.get_unchecked(p * ds + b)));
                            let j = b % 8;
                            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(wd, _mm512_cvtepi32_ps(isum)));
                        }
                    }
                    for (p, a) in acc.iter().enumerate().take(n) {
                        // math::reduce8's tree, lane by lane.
                        let s = _mm512_add_ps(
                            _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                            _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
                        );
                        let mut lanes = [0.0f32; R];
                        _mm512_storeu_ps(lanes.as_mut_ptr(), s);
                        for (r, v) in lanes.iter().enumerate() {
                            out[(g * R + r) * n + p] = *v;
                        }
                    }
                }
            }
        }
    }

    pub fn main() {
        let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
        let (mb, reps) = (*args.first().unwrap_or(&256), *args.get(1).unwrap_or(&3));
        let simd = Simd::active();
        if simd != Simd::Avx512 {
            eprintln!("interleave_probe needs the AVX-512 VNNI path (this CPU's: {})", simd.name());
            std::process::exit(2);
        }
        // FORMAT=int8/g32 probes the int8 rows (the default attention, dense and output
        // projection); int4/g32 (the default experts) otherwise.
        let int8 = std::env::var("FORMAT").is_ok_and(|f| f == "int8/g32");
        let dtype = if int8 { DType::Int8 { group: 32 } } else { DType::Int4 { group: 32 } };
        let (rows, cols) = (1024, 2048);
        let mats = match bench::working_set(dtype, rows, cols, mb << 20) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let rb = mats[0].row_bytes();
        let packed: Vec<Vec<u8>> = mats.iter().map(|m| repack(m.bytes.as_ref(), rb, rows, cols, int8)).collect();
        // AHEAD: how many bytes ahead the interleaved kernel prefetches (0: none); by default
        // four records at one or two positions, sixteen from three (the best of 0, 576 .. 18432
        // on Zen 4).
        let ahead_env: Option<usize> = std::env::var("AHEAD").ok().and_then(|v| v.parse().ok());
        let total: f64 = mats.iter().map(|m| m.byte_len() as f64).sum();
        let mut results = Vec::new();
        let counts: Vec<usize> = match std::env::var("POSITIONS") {
            Ok(v) => v.split(',').filter_map(|c| c.parse().ok()).filter(|&c| (1..=MAX_N).contains(&c)).collect(),
            Err(_) => vec![1, 2, 4, 8],
        };
        for n in counts {
            let ahead = ahead_env.unwrap_or(match n {
                1 => 0,
                2 => 4 * rec(int8),
                _ => 16 * rec(int8),
            });
            let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
            let mut a = ActQ::default();
            a.quantize(&x, n, cols, 32, !int8);
            if !int8 {
                a.quad();
            }
            // What `kernels::matmul` runs: the one-position rows kernel at one position, the
            // few-position one above.
            let engine = |rows: &[u8], out: &mut [f32], scratch: &mut Vec<u8>| {
                if n == 1 {
                    dot_rows(simd, !int8, rows, rb, &a, out);
                } else {
                    dot_rows_many(simd, !int8, rows, rb, &a, out, scratch);
                }
            };
            let (mut want, mut got) = (vec![0.0f32; rows * n], vec![0.0f32; rows * n]);
            let mut scratch = Vec::new();
            for (m, p) in mats.iter().zip(&packed).take(4) {
                engine(m.bytes.as_ref(), &mut want, &mut scratch);
                // SAFETY: Simd::Avx512 is active (the CPU reported AVX-512 VNNI); `p` is this
                // matrix repacked; n <= MAX_N.
                unsafe { avx512::rows(int8, p, &a, n, &mut got, ahead) };
                let same = want.iter().zip(&got).all(|(w, g)| w.to_bits() == g.to_bits());
                if !same {
                    eprintln!("{dtype}, {n} positions: the interleaved kernel's bits differ from the engine's");
                    std::process::exit(1);
                }
            }
            let time = |f: &mut dyn FnMut(usize)| {
                let mut best = 0.0f64;
                for rep in 0..=reps {
                    let t = Instant::now();
                    for i in 0..mats.len() {
                        f(i);
                    }
                    if rep > 0 {
                        best = best.max(total / t.elapsed().as_secs_f64() / 1e9);
                    }
                }
                best
            };
            // ONLY=engine or ONLY=interleaved times one of them (for `perf stat`).
            let only = std::env::var("ONLY").unwrap_or_default();
            let engine = if only == "interleaved" {
                0.0
            } else {
                time(&mut |i| engine(mats[i].bytes.as_ref(), &mut want, &mut scratch))
            };
            // SAFETY: as above.
            let inter = if only == "engine" {
                0.0
            } else {
                time(&mut |i| unsafe { avx512::rows(int8, &packed[i], &a, n, &mut got, ahead) })
            };
            results.push(format!(
                "{{\"positions\": {n}, \"ahead\": {ahead}, \"engine_gbs\": {engine:.2}, \"interleaved_gbs\": {inter:.2}, \"ratio\": {:.2}}}",
                inter / engine
            ));
        }
        println!(
            "{{\"format\": \"{dtype}\", \"rows\": {rows}, \"cols\": {cols}, \"mb\": {mb}, \"threads\": 1, \"same_bits\": true, \"runs\": [{}]}}",
            results.join(", ")
        );
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    probe::main();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("interleave_probe needs x86-64 with AVX-512 VNNI");
    std::process::exit(2);
}
