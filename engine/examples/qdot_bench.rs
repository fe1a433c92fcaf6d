//! Times the one-position (decode) int4 matrix product alone, with the weights streamed
//! from memory: `MB` megabytes of 1024 x 2048 int4 (group 32) matrices, each multiplied by
//! one activation row in turn, `reps` times; prints the weight bytes read per second.
//! The decode kernels' ceiling without the rest of a forward pass (docs/kernels.md).
//!
//!     cargo run --release -p colibri-engine --example qdot_bench -- [MB] [reps] [threads]
//!
//! `COLIBRI_SIMD=avx2` (or another path name) forces a kernel, as everywhere.

use std::time::Instant;

use colibri_engine::kernels::matmul;
use colibri_engine::tensor::{Bytes, DType, Mat};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (mb, reps, threads) = (*args.first().unwrap_or(&600), *args.get(1).unwrap_or(&5), *args.get(2).unwrap_or(&1));
    if rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build_global().is_err() {
        eprintln!("could not size the thread pool");
        return;
    }
    let (rows, cols, group) = (1024usize, 2048usize, 32usize);
    let dtype = DType::Int4 { group: group as u32 };
    let Some(rb) = dtype.row_bytes(cols) else { return };
    let count = (mb << 20).div_ceil(rows * rb).max(1);
    let mut seed = 1u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    let mats: Vec<Mat> = (0..count)
        .filter_map(|_| {
            // 64 bytes more, so the matrix can start on a cache line (as in a container).
            let mut bytes: Vec<u8> = (0..rows * rb + 64).map(|_| next() as u8).collect();
            let at = bytes.as_ptr().align_offset(64).min(64);
            for row in bytes[at..at + rows * rb].chunks_exact_mut(rb) {
                // Ordinary f16 scales (about 0.0078) in place of random bits.
                for s in row[..2 * (cols / group)].chunks_exact_mut(2) {
                    s.copy_from_slice(&(0x2000u16 + (next() as u16 & 0xff)).to_le_bytes());
                }
            }
            Mat::new(rows, cols, dtype, Bytes::from_vec(bytes).slice(at, rows * rb).ok()?).ok()
        })
        .collect();
    let x: Vec<f32> = (0..cols).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
    let mut out = vec![0.0f32; rows];
    let total = (count * rows * rb) as f64;
    let mut check = 0.0f32;
    let run = |out: &mut Vec<f32>, check: &mut f32| {
        for m in &mats {
            matmul(m, &x, 1, out);
            *check += out[0];
        }
    };
    let mut best = 0.0f64;
    for rep in 0..=reps {
        let t = Instant::now();
        if threads > 1 {
            rayon::scope(|_| run(&mut out, &mut check));
        } else {
            run(&mut out, &mut check);
        }
        let gbs = total / t.elapsed().as_secs_f64() / 1e9;
        if rep > 0 {
            best = best.max(gbs);
            println!("rep {rep}: {gbs:.2} GB/s");
        }
    }
    println!(
        "best {best:.2} GB/s over {:.0} MB of int4 weights, {threads} thread(s), simd {} (checksum {check})",
        total / 1e6,
        colibri_engine::qdot::Simd::active().name()
    );
}
