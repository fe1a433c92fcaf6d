//! `coli bench-kernels`: every stored weight format's matrix kernel on this machine, in
//! GB/s of stored weights per thread count, next to the measured memory read bandwidth
//! and the share of it (a table, or JSON with --json). `--check` is the format-ratio
//! guard of tools/test.sh: it fails when a format's one-position bytes/s falls below its
//! floor share of the fastest format's ([`floor`]: per path and kind of format), all
//! measured on one matrix shape in this one process.

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::kernels::bench::{self, Clock, Format};
use colibri_engine::qdot::Simd;
use colibri_engine::tensor::{DType, Mat};
use serde_json::{json, Value};

#[derive(Args)]
pub struct KernelBenchArgs {
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2])]
    pub threads: Vec<usize>,
    /// Positions per product: 1 is decode (memory-bound); more is prefill.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    pub positions: Vec<usize>,
    /// Stored bytes of each format's working set for one position, in MiB (many positions
    /// use an eighth of it); larger than the last-level cache measures memory. Default:
    /// 256, or twice the last-level cache where that is larger (some hosts report
    /// hundreds of MiB, which a 256 MiB set would partly be read from).
    #[arg(long)]
    pub mib: Option<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 0.5)]
    pub seconds: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The guard: one thread, one position, a small working set, each format measured
    /// three times in turn (best kept; three more where one is short); fails when one falls
    /// below its floor share of the fastest (with AVX-512: 40%, MXFP4 and FP8 20% (FP8 12% on
    /// AMD), q4_k and q5_k 25%; AVX2: 30%, 10% and 25%; other paths half).
    #[arg(long)]
    pub check: bool,
}

/// Matrix shape of every measurement: an OLMoE expert's gate/up projection.
const ROWS: usize = 1024;
const COLS: usize = 2048;

/// `--mib`, or its default: 256, or twice the last-level cache when that is larger.
fn working_set_mib(a: &KernelBenchArgs) -> usize {
    a.mib.unwrap_or_else(|| 256.max(last_level_cache().map_or(0, |b| ((2 * b) >> 20) as usize)))
}

/// Size in bytes of the highest cache level sysfs lists for CPU 0 (None where unknown).
fn last_level_cache() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let level: u32 = read(e.path().join("level"))?.parse().ok()?;
            let size = read(e.path().join("size"))?;
            let (num, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
            let n: u64 = num.parse().ok()?;
            let bytes = match unit {
                "K" => n << 10,
                "M" => n << 20,
                "G" => n << 30,
                "" => n,
                _ => return None,
            };
            Some((level, bytes))
        })
        .max()
        .map(|(_, b)| b)
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build().context("starting the thread pool")
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn run(a: KernelBenchArgs) -> Result<()> {
    if a.check {
        return check(&a);
    }
    if a.threads.contains(&0) || a.positions.contains(&0) || a.mib == Some(0) {
        bail!("--threads, --positions and --mib must be positive");
    }
    let mib = working_set_mib(&a);
    if !a.seconds.is_finite() || a.seconds <= 0.0 {
        bail!("--seconds must be positive, got {}", a.seconds);
    }
    let ws = mib << 20;
    // The bandwidth is read from the same kind of memory as the weights (bench::weight_memory).
    let buf = bench::weight_memory(ws, |b| b.fill(1))?;
    let mut mem = Vec::new();
    for &t in &a.threads {
        let gbs = pool(t)?.install(|| bench::read_rate(buf.as_ref(), a.seconds)) / 1e9;
        mem.push((t, gbs));
    }
    drop(buf);
    let mut rows = Vec::new();
    for f in bench::formats() {
        for &n in &a.positions {
            let set = bench::working_set(f.dtype, ROWS, COLS, if n == 1 { ws } else { ws / 8 })?;
            for &(t, mem_gbs) in &mem {
                let r = pool(t)?.install(|| bench::kernel_rate(&set, n, a.seconds, Clock::Wall));
                rows.push(Row { f, n, t, gbs: r.bytes_per_s / 1e9, gmacs: r.macs_per_s / 1e9, mem_gbs });
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report(&a, &mem, &rows))?);
    } else {
        print_table(&a, &mem, &rows);
    }
    Ok(())
}

struct Row {
    f: Format,
    n: usize,
    t: usize,
    gbs: f64,
    gmacs: f64,
    mem_gbs: f64,
}

fn bytes_per_weight(d: DType) -> f64 {
    d.row_bytes(COLS).unwrap_or(0) as f64 / COLS as f64
}

fn report(a: &KernelBenchArgs, mem: &[(usize, f64)], rows: &[Row]) -> Value {
    json!({
        "cpu": cpu_model(),
        "simd": Simd::active().name(),
        "load_average": load_average(),
        "shape": [ROWS, COLS],
        "working_set_mib": working_set_mib(a),
        "last_level_cache_bytes": last_level_cache(),
        "memory_read_gbs": mem.iter().map(|(t, g)| json!({"threads": t, "gbs": round(*g)})).collect::<Vec<_>>(),
        "kernels": rows.iter().map(|r| json!({
            "format": r.f.dtype.to_string(),
            "source": r.f.source,
            "bytes_per_weight": round(bytes_per_weight(r.f.dtype)),
            "positions": r.n,
            "threads": r.t,
            "gbs": round(r.gbs),
            "share_of_memory": round(r.gbs / r.mem_gbs),
            "gmacs": round(r.gmacs),
        })).collect::<Vec<_>>(),
    })
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn print_table(a: &KernelBenchArgs, mem: &[(usize, f64)], rows: &[Row]) {
    println!("cpu: {} ({}), load average {}", cpu_model(), Simd::active().name(), load_average());
    let mib = working_set_mib(a);
    println!("matrix [{ROWS}, {COLS}], working set {mib} MiB per format (many positions: {} MiB)", mib / 8);
    let m: Vec<String> = mem.iter().map(|(t, g)| format!("{g:.1} GB/s at {t} thread(s)")).collect();
    println!("memory read: {}", m.join(", "));
    println!();
    println!(
        "{:<12} {:>6} {:>9} {:>7} {:>9} {:>8} {:>8}",
        "format", "B/wt", "positions", "threads", "GB/s", "memory", "GMAC/s"
    );
    for r in rows {
        println!(
            "{:<12} {:>6.3} {:>9} {:>7} {:>9.2} {:>7.0}% {:>8.2}",
            r.f.dtype.to_string(),
            bytes_per_weight(r.f.dtype),
            r.n,
            r.t,
            r.gbs,
            100.0 * r.gbs / r.mem_gbs,
            r.gmacs
        );
    }
}

/// The guard: the same shape for every format, one thread, one position, a working set
/// of 16 MiB each (small, so that it takes seconds even in a debug build), timed in the
/// thread's own CPU time (time other processes hold the core does not count) and as a
/// ratio of the formats in one process (what load still changes, caches and memory
/// contention, slows them alike); each format's best of three alternating rounds is kept.
fn check(a: &KernelBenchArgs) -> Result<()> {
    let formats = bench::formats();
    let sets: Vec<Vec<Mat>> =
        formats.iter().map(|f| bench::working_set(f.dtype, ROWS, COLS, 16 << 20)).collect::<Result<_, _>>()?;
    let secs = a.seconds.min(0.2);
    let simd = Simd::active();
    let mut best = vec![0.0f64; formats.len()];
    let below = |best: &[f64]| {
        let top = best.iter().cloned().fold(0.0, f64::max);
        formats.iter().zip(best).any(|(f, b)| b / top < floor(f.dtype, simd))
    };
    // Three alternating rounds; where a format is then below its floor, three more (a busy
    // second hyperthread slows the compute-bound formats most, for seconds at a time).
    pool(1)?.install(|| {
        for round in 0..6 {
            if round == 3 && !below(&best) {
                break;
            }
            for (b, set) in best.iter_mut().zip(&sets) {
                *b = b.max(bench::kernel_rate(set, 1, secs, Clock::Thread).bytes_per_s);
            }
        }
    });
    let top = best.iter().cloned().fold(0.0, f64::max);
    let mut slow = Vec::new();
    for (f, b) in formats.iter().zip(&best) {
        let (share, floor) = (b / top, floor(f.dtype, simd));
        println!(
            "{:<12} {:>8.2} GB/s  {:>4.0}% of the fastest (floor {:.0}%)",
            f.dtype.to_string(),
            b / 1e9,
            100.0 * share,
            100.0 * floor
        );
        if share < floor {
            slow.push(format!("{} ({:.0}% < {:.0}%)", f.dtype, 100.0 * share, 100.0 * floor));
        }
    }
    if !slow.is_empty() {
        bail!("kernel guard: below its floor share of the fastest format's bytes/s: {}", slow.join(", "));
    }
    println!("kernel guard: every format at or above its floor ({} path)", simd.name());
    Ok(())
}

/// The share of the fastest format's bytes/s (f32's, in every run so far) a format must
/// reach on the path `simd`. The working set is in cache on most hosts, so f32, which does
/// one product and one sum per four bytes, reads at cache speed, and what the floors
/// measure is each format's operations per byte. They sit at two thirds to four fifths of
/// the lowest share measured on any host, busy ones included (docs/benchmarks.md "Kernel guard"), so
/// a format that falls by half or more fails, which is the size of what the guard exists
/// to catch (an intrinsic called out of line made int8 four to five times slower):
/// - int4, int8, bf16, f16 (integer dots, or a widening and a product): 40% with AVX-512,
///   30% on the AVX2 path (a Zen 2 EPYC without VNNI read 37-48% under load);
/// - MXFP4 and FP8 keep f32 precision, so their operations per byte are several times
///   int8's (MXFP4 multiplies each weight by four activation bytes; FP8 takes f32's two
///   products and a sum per weight, one byte instead of four, plus the decode): 20% with
///   AVX-512 (34-65% measured on Intel; MXFP4 25-28% on a Zen 4 EPYC), but FP8 12% on AMD
///   (Zen 4: 15-17% of an f32 that reads 50-60 GB/s there since the loops are aligned,
///   19-20% before; on Intel 20% still fails the FP8 helpers called out of line, 19%),
///   10% on AVX2 (14-35%);
/// - q4_k (GGUF Q4_K kept) is int4/g32 with a header to decode and a second product per
///   block of 32: 85-90% of int4/g32's rate measured (Zen 1, AVX2), so its floors were five
///   sixths of the integer ones; at 35-37% on Zen 4 (AVX-512) they are 25% on both paths;
///   q5_k (GGUF Q5_K kept) has the same floors (Zen 1: 37% of the fastest where q4_k had
///   41%; Zen 4 30-42%; it runs AVX2's kernels on AVX-512 hosts too);
/// - other paths (scalar, NEON, SIMD128: not measured by the guard here): half.
fn floor(dtype: DType, simd: Simd) -> f64 {
    let f32_precision = matches!(dtype, DType::Mxfp4 | DType::Fp8 { .. });
    match (simd, f32_precision, matches!(dtype, DType::Q4K | DType::Q5K)) {
        (Simd::Avx512 | Simd::Avx2, _, true) => 0.25,
        (Simd::Avx512, false, _) => 0.4,
        (Simd::Avx512, true, _) if matches!(dtype, DType::Fp8 { .. }) && !colibri_engine::qdot::cpu_is_intel() => 0.12,
        (Simd::Avx512, true, _) => 0.2,
        (Simd::Avx2, false, _) => 0.3,
        (Simd::Avx2, true, _) => 0.1,
        _ => 0.5,
    }
}
