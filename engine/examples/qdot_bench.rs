//! Times one stored format's matrix kernel alone, with the weights streamed from memory:
//! `MB` megabytes of ROWS x COLS (2048) matrices ([`kernels::bench::working_set`], the matrices
//! `coli bench-kernels` times), each multiplied by `POSITIONS` activation rows in turn,
//! `reps` times; prints the weight bytes read per second. The kernels' ceiling without the
//! rest of a forward pass (docs/kernels.md), and a small binary to profile one kernel
//! (`cargo build --profile profiling -p colibri-engine --example qdot_bench`, then
//! `perf record`).
//!
//!     [FORMAT=int4/g32] [POSITIONS=1] cargo run --release -p colibri-engine --example qdot_bench -- [MB] [reps] [threads]
//!
//! FORMAT is a name `coli bench-kernels` prints (int4/g32, int8/g64, mxfp4, fp8/b128, bf16,
//! ...). ROWS (1024) sets the matrices' rows: one call's size, which sets what a parallel
//! region's start and end cost against its work; COLS their columns (with it where the rows'
//! values start against a 64-byte line: int8/g128 at 2048 columns has 32 bytes of scales).
//! `COLIBRI_SIMD=avx2` (or another path name) forces a kernel, as everywhere.

use std::time::Instant;

use colibri_engine::kernels::{bench, matmul};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (mb, reps, threads) = (*args.first().unwrap_or(&600), *args.get(1).unwrap_or(&5), *args.get(2).unwrap_or(&1));
    let want = std::env::var("FORMAT").unwrap_or_else(|_| "int4/g32".into());
    let n: usize = std::env::var("POSITIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let Some(format) = bench::formats().into_iter().find(|f| f.dtype.to_string() == want) else {
        let names: Vec<String> = bench::formats().iter().map(|f| f.dtype.to_string()).collect();
        eprintln!("FORMAT={want}: not one of {}", names.join(", "));
        std::process::exit(2);
    };
    if rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build_global().is_err() {
        eprintln!("could not size the thread pool");
        return;
    }
    let rows: usize = std::env::var("ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1024).max(1);
    let cols: usize = std::env::var("COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    let mats = match bench::working_set(format.dtype, rows, cols, mb << 20) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let mut out = vec![0.0f32; n * rows];
    let total: f64 = mats.iter().map(|m| m.byte_len() as f64).sum();
    let mut check = 0.0f32;
    let mut best = 0.0f64;
    for rep in 0..=reps {
        let t = Instant::now();
        for m in &mats {
            matmul(m, &x, n, &mut out);
            check += out[0];
        }
        let gbs = total / t.elapsed().as_secs_f64() / 1e9;
        if rep > 0 {
            best = best.max(gbs);
            println!("rep {rep}: {gbs:.2} GB/s");
        }
    }
    println!(
        "best {best:.2} GB/s over {:.0} MB of {want} weights, {n} position(s), {threads} thread(s), simd {} (checksum {check})",
        total / 1e6,
        colibri_engine::qdot::Simd::active().name()
    );
}
