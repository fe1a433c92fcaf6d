//! The usage file: expert-use counts of a model, merged after native runs (load.rs) and
//! from browser reports (serve/usage.rs), read at start-up to choose the pinned experts.
//!
//! The file is `usage.json` in the model directory when that directory is writable,
//! else `<data dir>/usage/<id>.json` (docs/api.md). Every merge takes an advisory lock
//! (`<file>.lock`, flock), reads, adds, writes a temporary file and renames it over the
//! old one, so readers never see half a file and concurrent merges lose nothing.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use colibri_engine::experts::usage::ExpertUsage;

/// Which version of the model in `root` usage counts belong to: the xxh3 of its
/// colibri.json (hex); None for a model without one (a Hugging Face directory).
pub fn fingerprint(root: &Path) -> Option<String> {
    let bytes = std::fs::read(root.join(colibri_engine::format::MANIFEST_FILE)).ok()?;
    Some(colibri_engine::format::manifest::fingerprint(&bytes))
}

/// Where the usage file of model `id` in `root` lives; `fallback_dir` is used when
/// `root` is not writable.
pub fn usage_path(root: &Path, id: &str, fallback_dir: Option<&Path>) -> PathBuf {
    let local = root.join("usage.json");
    let writable = OpenOptions::new().create(true).append(true).open(root.join("usage.json.lock")).is_ok();
    match fallback_dir {
        Some(d) if !writable => d.join(format!("{}.json", id.replace('/', "--"))),
        _ => local,
    }
}

/// An exclusive advisory lock, released when dropped.
struct Lock(#[allow(dead_code)] File);

fn lock(path: &Path) -> Result<Lock> {
    let lock_path = path.with_extension("json.lock");
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&lock_path)
        .with_context(|| format!("{}: cannot create the lock file", lock_path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot lock the usage file");
        }
    }
    Ok(Lock(f))
}

/// Reads the usage file, or an empty table if it is missing or for another shape or
/// fingerprint (a replaced or retrained model): old counts of a different model must not
/// be merged.
pub fn read_usage(path: &Path, n_layers: usize, n_experts: usize, fingerprint: Option<&str>) -> ExpertUsage {
    match std::fs::read(path) {
        Ok(b) => ExpertUsage::from_json_bytes(&b, n_layers, n_experts, fingerprint).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), "ignoring the usage file: {e}");
            ExpertUsage::new(n_layers, n_experts)
        }),
        Err(_) => ExpertUsage::new(n_layers, n_experts),
    }
}

/// Adds `triples` to the file at `path` under the lock; returns the merged table.
pub fn merge_into_file(
    path: &Path,
    id: &str,
    shape: (usize, usize),
    fingerprint: Option<&str>,
    triples: &[(u64, u64, u64)],
) -> Result<ExpertUsage> {
    // Validate before touching anything.
    let mut add = ExpertUsage::new(shape.0, shape.1);
    add.merge_triples(triples)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    let _lock = lock(path)?;
    let mut usage = read_usage(path, shape.0, shape.1, fingerprint);
    usage.merge(&add)?;
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&usage.to_json_bytes(id, fingerprint))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("{}: cannot write", path.display()));
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_merges_lose_nothing() {
        let dir = std::env::temp_dir().join(format!("coli-usage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("usage.json");
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..25 {
                        merge_into_file(path, "m", (2, 3), Some("ab"), &[(0, 1, 1), (1, t % 3, 2)]).unwrap();
                    }
                });
            }
        });
        let u = read_usage(&path, 2, 3, Some("ab"));
        assert_eq!(u.get(0, 1), 100);
        assert_eq!(u.total(), 300);
        assert!(merge_into_file(&path, "m", (2, 3), Some("ab"), &[(2, 0, 1)]).is_err());
        assert_eq!(read_usage(&path, 2, 3, Some("ab")).total(), 300);
        // A file for another shape, or another version of the model, is not merged into:
        // the retrained model starts from its own counts.
        assert_eq!(read_usage(&path, 4, 3, Some("ab")).total(), 0);
        assert_eq!(read_usage(&path, 2, 3, Some("cd")).total(), 0);
        let u = merge_into_file(&path, "m", (2, 3), Some("cd"), &[(1, 1, 5)]).unwrap();
        assert_eq!(u.total(), 5);
        assert_eq!(read_usage(&path, 2, 3, Some("ab")).total(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
