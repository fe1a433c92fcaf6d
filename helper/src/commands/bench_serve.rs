//! `coli bench-serve`: a bounded load test of the helper's Range API. Many clients fetch
//! random expert-sized ranges of one file over loopback HTTP for a fixed time, every byte
//! checked against the file; then the same number of threads read the same kind of
//! ranges straight from the file (pread). Prints one JSON record with both rates.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use colibri_engine::format::byteranges::{parse_content_range, parse_multipart, range_len, Part};

use crate::serve::client::Conn;
use crate::serve::files::read_exact_at;
use crate::serve::ServeArgs;

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Model directory holding the file to fetch (default: a synthetic model in a
    /// temporary directory).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// File inside the model directory (default: its largest file).
    #[arg(long)]
    pub file: Option<String>,
    /// Size of the synthetic file (K, M, G suffixes).
    #[arg(long, default_value = "256M", value_parser = crate::flags::parse_bytes)]
    pub size: u64,
    /// Concurrent clients (each one keep-alive connection and one thread).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Duration of each phase (HTTP, then pread).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Bytes per range: about one expert.
    #[arg(long, default_value = "2M", value_parser = crate::flags::parse_bytes)]
    pub range_bytes: u64,
    /// Ranges per request (more than one: multipart/byteranges).
    #[arg(long, default_value_t = 1)]
    pub ranges_per_request: usize,
    /// Check only status and lengths, not every byte (shows what verifying costs the
    /// client, which shares the machine with the server).
    #[arg(long)]
    pub no_verify: bool,
}

/// Deterministic per-thread random numbers (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A 4 KiB-aligned offset where `len` bytes fit in `size`.
    fn offset(&mut self, size: u64, len: u64) -> u64 {
        let slots = (size - len) / 4096 + 1;
        (self.next() % slots) * 4096
    }
}

fn write_synthetic(path: &std::path::Path, size: u64) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::io::BufWriter::new(File::create(path).with_context(|| format!("{}: cannot create", path.display()))?);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut left = size;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            c.copy_from_slice(&rng.next().to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// Counters of one phase.
#[derive(Default)]
struct Phase {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

/// What the HTTP clients fetch and check against.
struct Target<'a> {
    addr: SocketAddr,
    url: &'a str,
    file: &'a File,
    size: u64,
    args: &'a BenchArgs,
}

fn http_client(t: &Target, seed: u64, until: Instant, ph: &Phase) -> Vec<f64> {
    let (addr, url, file, size, a) = (t.addr, t.url, t.file, t.size, t.args);
    let mut lat = Vec::new();
    let mut rng = Rng(seed | 1);
    let mut conn = None;
    while Instant::now() < until {
        let ranges: Vec<(u64, u64)> = (0..a.ranges_per_request)
            .map(|_| {
                let o = rng.offset(size, a.range_bytes);
                (o, o + a.range_bytes - 1)
            })
            .collect();
        let spec: Vec<String> = ranges.iter().map(|(s, e)| format!("{s}-{e}")).collect();
        let header = format!("bytes={}", spec.join(","));
        let t = Instant::now();
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::open(addr) {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    ph.errors.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        let ok = match c.request("GET", url, &[("Range", &header)], b"") {
            Ok(r) => {
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                check(&r, &ranges, file, size, !a.no_verify)
            }
            Err(_) => false,
        };
        if ok {
            ph.ops.fetch_add(1, Ordering::Relaxed);
            ph.bytes.fetch_add(a.range_bytes * a.ranges_per_request as u64, Ordering::Relaxed);
        } else {
            ph.errors.fetch_add(1, Ordering::Relaxed);
            conn = None;
        }
    }
    lat
}

/// The response's status, parts and lengths, and (`bytes`) every byte against the file.
fn check(r: &crate::serve::client::Response, ranges: &[(u64, u64)], file: &File, size: u64, bytes: bool) -> bool {
    if r.status != 206 {
        return false;
    }
    let parts: Vec<Part> = match r.header("content-type").and_then(|t| t.split_once("boundary=")) {
        // The parser checks each part's length against its Content-Range.
        Some((_, b)) => match parse_multipart(&r.body, b) {
            Ok(p) => p,
            Err(_) => return false,
        },
        None => match r.header("content-range").and_then(parse_content_range) {
            Some((a, b, complete)) if range_len(a, b) == r.body.len() as u64 => {
                vec![Part { offset: a, data: r.body.clone(), complete }]
            }
            _ => return false,
        },
    };
    let mut covered = 0u64;
    for p in &parts {
        if p.complete != Some(size)
            || (bytes && read_exact_at(file, p.offset, p.data.len()).ok().as_deref() != Some(p.data.as_slice()))
        {
            return false;
        }
        covered += p.data.len() as u64;
    }
    // Coalesced parts may cover more than asked, never less.
    covered >= ranges.iter().map(|(s, e)| e + 1 - s).max().unwrap_or(0)
        && ranges.iter().all(|&(s, e)| parts.iter().any(|p| p.offset <= s && e < p.offset + p.data.len() as u64))
}

fn pread_client(file: &File, size: u64, a: &BenchArgs, seed: u64, until: Instant, ph: &Phase) {
    let mut rng = Rng(seed | 1);
    let mut buf = vec![0u8; a.range_bytes as usize];
    while Instant::now() < until {
        for _ in 0..a.ranges_per_request {
            let o = rng.offset(size, a.range_bytes);
            let ok = {
                #[cfg(unix)]
                {
                    use std::os::unix::fs::FileExt;
                    file.read_exact_at(&mut buf, o).is_ok()
                }
                #[cfg(not(unix))]
                {
                    read_exact_at(file, o, buf.len()).is_ok()
                }
            };
            if ok {
                ph.bytes.fetch_add(a.range_bytes, Ordering::Relaxed);
            } else {
                ph.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        ph.ops.fetch_add(1, Ordering::Relaxed);
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs the benchmark and returns its JSON record.
pub fn bench(a: &BenchArgs) -> Result<Value> {
    if a.clients == 0 || a.ranges_per_request == 0 || a.range_bytes == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        bail!("--clients, --ranges-per-request, --range-bytes and --seconds must be positive");
    }
    let tmp = std::env::temp_dir().join(format!("colibri-bench-serve-{}", std::process::id()));
    let (model_dir, file_name, synthetic) = match &a.model {
        Some(m) => {
            let dir = crate::paths::resolve_model(m, None)?;
            let name = match &a.file {
                Some(f) => f.clone(),
                None => crate::serve::models::list_files(&dir.canonicalize()?)
                    .into_iter()
                    .max_by_key(|(_, s)| *s)
                    .map(|(p, _)| p)
                    .context("the model directory has no files")?,
            };
            (dir, name, false)
        }
        None => {
            let dir = tmp.join("bench");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("config.json"), b"{\"model_type\": \"bench\"}\n")?;
            write_synthetic(&dir.join("data.bin"), a.size)?;
            (dir, "data.bin".to_string(), true)
        }
    };
    let path = model_dir.join(&file_name);
    let file = File::open(&path).with_context(|| format!("{}: cannot open", path.display()))?;
    let size = file.metadata()?.len();
    if size < a.range_bytes {
        bail!("{}: {size} bytes is smaller than one range ({})", path.display(), a.range_bytes);
    }
    // Warm the page cache so both phases read from memory.
    let mut off = 0;
    while off < size {
        let n = (size - off).min(8 << 20);
        read_exact_at(&file, off, n as usize)?;
        off += n;
    }

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let serve = ServeArgs { host: None, port: 0, models: vec![model_dir.clone()], max_queue: 8, ..Default::default() };
    let bound = rt.block_on(crate::serve::bind(&serve))?;
    let addr = bound.addr;
    let id = bound.state.registry.list().first().map(|m| m.id.clone()).context("no model")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        rt.block_on(crate::serve::run(bound, async {
            let _ = stop_rx.await;
        }))
    });
    let url = format!("/models/{id}/{file_name}");

    let dur = Duration::from_secs_f64(a.seconds);
    let http = Phase::default();
    let start = Instant::now();
    let until = start + dur;
    let target = Target { addr, url: &url, file: &file, size, args: a };
    let mut lat: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.clients)
            .map(|i| {
                let (target, http) = (&target, &http);
                s.spawn(move || http_client(target, 0x1234_5678 + i as u64 * 7919, until, http))
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let http_secs = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(());
    let _ = server.join();

    let pread = Phase::default();
    let start = Instant::now();
    let until = start + dur;
    std::thread::scope(|s| {
        for i in 0..a.clients {
            let (file, pread) = (&file, &pread);
            s.spawn(move || pread_client(file, size, a, 0x1234_5678 + i as u64 * 7919, until, pread));
        }
    });
    let pread_secs = start.elapsed().as_secs_f64();
    if synthetic {
        let _ = std::fs::remove_dir_all(&tmp);
    }

    let g = |p: &Phase, secs: f64| {
        let (ops, bytes) = (p.ops.load(Ordering::Relaxed), p.bytes.load(Ordering::Relaxed));
        (ops, bytes, ops as f64 / secs, bytes as f64 / secs / 1e9, p.errors.load(Ordering::Relaxed))
    };
    let (h_ops, h_bytes, h_rps, h_gbs, h_err) = g(&http, http_secs);
    let (p_ops, p_bytes, p_rps, p_gbs, p_err) = g(&pread, pread_secs);
    Ok(json!({
        "bench": "helper-http-range",
        "version": env!("CARGO_PKG_VERSION"),
        "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "file": if synthetic { "synthetic".to_string() } else { path.display().to_string() },
        "file_bytes": size,
        "clients": a.clients,
        "seconds": a.seconds,
        "range_bytes": a.range_bytes,
        "ranges_per_request": a.ranges_per_request,
        "cache": "warm (page cache)",
        "http": {"requests": h_ops, "requests_per_s": h_rps, "bytes": h_bytes, "gb_per_s": h_gbs, "errors": h_err,
                 "latency_ms_p50": percentile(&mut lat, 0.5), "latency_ms_p99": percentile(&mut lat, 0.99), "verified_every_byte": !a.no_verify},
        "pread": {"requests": p_ops, "requests_per_s": p_rps, "bytes": p_bytes, "gb_per_s": p_gbs, "errors": p_err},
        "http_over_pread": if p_gbs > 0.0 { h_gbs / p_gbs } else { 0.0 },
    }))
}

pub fn run(a: BenchArgs) -> Result<()> {
    let out = bench(&a)?;
    println!("{out}");
    if out["http"]["errors"].as_u64() != Some(0) {
        bail!("{} HTTP requests failed or returned wrong bytes", out["http"]["errors"]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_load_test_verifies_every_byte() {
        let a = BenchArgs {
            model: None,
            file: None,
            size: 16 << 20,
            clients: 4,
            seconds: 1.0,
            range_bytes: 256 << 10,
            ranges_per_request: 3,
            no_verify: false,
        };
        let out = bench(&a).unwrap();
        assert_eq!(out["http"]["errors"], 0, "{out}");
        assert!(out["http"]["requests"].as_u64().unwrap() > 0, "{out}");
        assert!(out["pread"]["gb_per_s"].as_f64().unwrap() > 0.0, "{out}");
    }
}
