//! Brief measurements of this machine for `coli bench` and `coli plan`: how fast the disk
//! gives expert-sized reads that miss the page cache, and how many weight bytes per second
//! the CPU kernels get through in a decode step (one position, integer weights).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use colibri_engine::experts::source::{ByteSource, FileSource};
use colibri_engine::format::manifest::Manifest;
use colibri_engine::tensor::{Bytes, DType, Mat};

/// Drops the file's pages from the page cache (clean pages only; works without root).
#[cfg(target_os = "linux")]
pub fn evict(file: &std::fs::File) -> bool {
    use std::os::unix::io::AsRawFd;
    // SAFETY: posix_fadvise on a descriptor we own; no memory is involved.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 }
}

#[cfg(not(target_os = "linux"))]
pub fn evict(_: &std::fs::File) -> bool {
    false
}

/// Reads `spans` (offset, length) of `source`, `threads` at a time: bytes/s.
fn timed_reads(source: &FileSource, spans: &[(u64, usize)], threads: usize) -> Result<f64> {
    let total: u64 = spans.iter().map(|s| s.1 as u64).sum();
    let t = Instant::now();
    let threads = threads.max(1);
    let pool = colibri_engine::experts::reader::BufferPool::new(threads);
    std::thread::scope(|sc| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let pool = &pool;
                sc.spawn(move || -> Result<()> {
                    for &(off, len) in spans.iter().skip(k).step_by(threads) {
                        let mut b = pool.take(len)?;
                        source.read_aligned(off, b.full_mut(), len)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("a probe thread failed"))??;
        }
        Ok(())
    })?;
    Ok(total as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// A seeded pseudo-random choice of distinct `spans` adding up to about `bytes`.
fn pick(spans: &[(u64, usize)], bytes: u64) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let (mut total, mut s) = (0u64, 0x2545_F491_4F6C_DD1Du64);
    while total < bytes && out.len() < spans.len() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let i = (s % spans.len() as u64) as usize;
        if seen.insert(i) {
            total += spans[i].1 as u64;
            out.push(spans[i]);
        }
    }
    out
}

/// Cold reads of pseudo-random experts of a converted model (its manifest `m`, its data
/// file `source`, whose pages are evicted first), `threads` at a time: (bytes/s, bytes read).
pub fn expert_reads(m: &Manifest, source: &FileSource, bytes: u64, threads: usize) -> Result<(f64, u64)> {
    let spans: Vec<(u64, usize)> =
        m.experts.layers.iter().flat_map(|l| &l.experts).map(|e| (e.offset, e.length as usize)).collect();
    if spans.is_empty() || bytes == 0 {
        return Ok((0.0, 0));
    }
    evict(source.file());
    let chosen = pick(&spans, bytes);
    let total = chosen.iter().map(|s| s.1 as u64).sum();
    Ok((timed_reads(source, &chosen, threads)?, total))
}

/// Where there is no model file yet (a hub repository): writes `bytes` to a scratch file
/// in `dir`, syncs it, evicts it from the page cache and reads it back in `chunk`-sized
/// pieces in a shuffled order, `threads` at a time, with O_DIRECT where the file system
/// takes it. Returns (bytes/s, how it read). The file is deleted.
pub fn scratch_reads(dir: &Path, bytes: u64, chunk: usize, threads: usize) -> Result<(f64, String)> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!(".coli-plan-probe-{}", std::process::id()));
    let result = (|| -> Result<(f64, String)> {
        let mut f = std::fs::File::create(&path).with_context(|| format!("cannot write {}", path.display()))?;
        // Not zeros: a file system may compress or skip them.
        let block: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut written = 0u64;
        while written < bytes {
            f.write_all(&block)?;
            written += block.len() as u64;
        }
        f.sync_all()?;
        evict(&f);
        drop(f);
        let source = FileSource::open_with(&path, true)?;
        let how = match &source.direct_note {
            None => "O_DIRECT".to_string(),
            Some(n) => format!("buffered after evicting the page cache ({n})"),
        };
        let chunk = chunk.clamp(4096, 64 << 20) / 4096 * 4096;
        let spans: Vec<(u64, usize)> = (0..written / chunk as u64).map(|k| (k * chunk as u64, chunk)).collect();
        let chosen = pick(&spans, written);
        Ok((timed_reads(&source, &chosen, threads)?, how))
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Weight bytes per second of one decode-step matrix-vector product on the CPU kernels
/// (int4 with groups of 32, as converted experts are), on the global thread pool, timed
/// for about `budget`: the compute side of a token's cost.
pub fn matvec_bandwidth(budget: Duration) -> Result<f64> {
    // 4096 x 8192 int4 (18 MiB): bigger than the caches, so memory bandwidth counts.
    let (rows, cols) = (4096usize, 8192usize);
    let dtype = DType::Int4 { group: 32 };
    let row = dtype.row_bytes(cols).context("int4 row size")?;
    // Every f16 scale is then 0x5A5A = 203.25: finite, like every product.
    let w = Mat::new(rows, cols, dtype, Bytes::from_vec(vec![0x5Au8; rows * row]))?;
    let x: Vec<f32> = (0..cols).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let mut out = vec![0f32; rows];
    colibri_engine::kernels::matmul(&w, &x, 1, &mut out); // warm-up: pool, activations
    let (t, mut n) = (Instant::now(), 0u64);
    while n < 3 || t.elapsed() < budget {
        colibri_engine::kernels::matmul(&w, &x, 1, &mut out);
        n += 1;
    }
    Ok((rows * row) as f64 * n as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pick_is_distinct_and_sized() {
        let spans: Vec<(u64, usize)> = (0..100).map(|k| (k * 4096, 4096)).collect();
        let p = pick(&spans, 10 * 4096);
        assert_eq!(p.len(), 10);
        let distinct: std::collections::HashSet<_> = p.iter().collect();
        assert_eq!(distinct.len(), 10);
        assert_eq!(pick(&spans, u64::MAX).len(), 100, "never more than there is");
    }

    #[test]
    fn probes_measure_something() {
        let dir = std::env::temp_dir().join(format!("coli-probe-test-{}", std::process::id()));
        let (bw, how) = scratch_reads(&dir, 4 << 20, 256 << 10, 2).unwrap();
        assert!(bw > 0.0 && !how.is_empty());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the scratch file is gone");
        let _ = std::fs::remove_dir(&dir);
        assert!(matvec_bandwidth(Duration::from_millis(20)).unwrap() > 0.0);
    }
}
