//! The usage file: expert-use counts of a model, merged after native runs (load.rs) and
//! from browser reports (serve/usage.rs), read at start-up to choose the pinned experts.
//!
//! The file is `usage.json` in the model directory when that directory is writable,
//! else `<data dir>/usage/<id>.json` (docs/api.md). Every merge takes an advisory lock
//! (`<file>.lock`, flock), reads, adds, writes a temporary file and renames it over the
//! old one, so readers never see half a file and concurrent merges lose nothing. A lock
//! held by another process is never waited for: the counts wait in memory for the next
//! merge. Lock, temporary and usage files are 0600, their directories 0700 (crate::paths).

use std::fs::File;
#[cfg(test)]
use std::fs::OpenOptions;
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
/// `root` is not writable, or writable by everyone.
pub fn usage_path(root: &Path, id: &str, fallback_dir: Option<&Path>) -> PathBuf {
    let local = root.join("usage.json");
    // Not in a world-writable directory (o+w): there another user could plant the lock
    // or the file itself. The fallback directory is created 0700.
    let private = {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(root).is_ok_and(|m| m.permissions().mode() & 0o002 == 0)
        }
        #[cfg(not(unix))]
        {
            true
        }
    };
    // The probe creates the lock file as every other use does: 0600, no symlink followed.
    let writable = private && crate::paths::open_private(&root.join("usage.json.lock"), false).is_ok();
    match fallback_dir {
        Some(d) if !writable => d.join(format!("{}.json", id.replace('/', "--"))),
        _ => local,
    }
}

/// An exclusive advisory lock, released when dropped.
struct Lock(#[allow(dead_code)] File);

/// Why a merge did not take the lock.
enum LockError {
    /// Another process holds it: the counts wait in memory for a later merge.
    Busy,
    Other(anyhow::Error),
}

/// Takes the lock of the usage file at `path`: `<file>.lock`, readable and writable by
/// this user only (flock needs no more than read access, so a lock file that others can
/// open would let any local user stall every merge). Never waits: a lock held by another
/// process (a merge takes milliseconds; one held longer is someone stalling us) is
/// [`LockError::Busy`], and the request that wanted to merge goes on without delay.
fn lock(path: &Path) -> std::result::Result<Lock, LockError> {
    let lock_path = path.with_extension("json.lock");
    let f = crate::paths::open_private(&lock_path, false).map_err(|e| {
        LockError::Other(anyhow::Error::new(e).context(format!("{}: cannot create the lock file", lock_path.display())))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        loop {
            // SAFETY: flock on a file descriptor we own; no memory is involved.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(LockError::Busy);
            }
            return Err(LockError::Other(anyhow::Error::new(e).context("cannot lock the usage file")));
        }
    }
    Ok(Lock(f))
}

/// Counts that could not be merged because another process held the lock, by usage file:
/// merged by the next merge into that file that gets the lock.
static PENDING: std::sync::Mutex<Vec<(PathBuf, Triples)>> = std::sync::Mutex::new(Vec::new());

/// (layer, expert, count) triples of a usage report.
type Triples = Vec<(u64, u64, u64)>;
/// Merges of this process into one file never race each other for the flock.
static MERGING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn take_pending(path: &Path) -> Vec<(u64, u64, u64)> {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    match p.iter().position(|(q, _)| q == path) {
        Some(i) => p.swap_remove(i).1,
        None => Vec::new(),
    }
}

fn keep_pending(path: &Path, triples: Vec<(u64, u64, u64)>) {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    match p.iter_mut().find(|(q, _)| q == path) {
        Some((_, t)) => t.extend(triples),
        None => p.push((path.to_path_buf(), triples)),
    }
}

/// What a merge did.
pub struct Merged {
    /// The counts after it: the file's, plus what waits in memory when `deferred`.
    pub usage: ExpertUsage,
    /// The lock was held by another process: nothing was written; the counts are kept in
    /// memory and written by the next merge that gets the lock.
    pub deferred: bool,
}

/// Removes temporary usage files (`*.json.tmp.<pid>`) in `dir` that a writer killed
/// mid-write left behind: those whose process is gone.
pub fn clean_temp_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in rd.flatten().take(10_000) {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.split_once(".json.tmp.")).map(|(_, p)| p.to_owned()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !process_alive(pid) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// Reads the usage file, or an empty table if it is missing or for another shape or
/// fingerprint (a replaced or retrained model): old counts of a different model must not
/// be merged.
pub fn read_usage(path: &Path, n_layers: usize, n_experts: usize, fingerprint: Option<&str>) -> ExpertUsage {
    match colibri_engine::fsio::read_limited(path, colibri_engine::fsio::MAX_JSON_BYTES) {
        Ok(b) => ExpertUsage::from_json_bytes(&b, n_layers, n_experts, fingerprint).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), "ignoring the usage file: {e}");
            ExpertUsage::new(n_layers, n_experts)
        }),
        Err(_) => ExpertUsage::new(n_layers, n_experts),
    }
}

/// Adds `triples` to the file at `path` under the lock, with the counts an earlier merge
/// had to leave in memory; returns the merged table. When another process holds the lock,
/// nothing waits: the counts stay in memory for the next merge ([`Merged::deferred`]).
pub fn merge_into_file(
    path: &Path,
    id: &str,
    shape: (usize, usize),
    fingerprint: Option<&str>,
    triples: &[(u64, u64, u64)],
) -> Result<Merged> {
    // Validate before touching anything.
    let mut add = ExpertUsage::new(shape.0, shape.1);
    add.merge_triples(triples)?;
    // A missing directory (the fallback `<data dir>/usage`) is created 0700; an existing
    // one (the model's own directory) is left as it is.
    if let Some(dir) = path.parent().filter(|d| !d.is_dir()) {
        crate::paths::private_dir(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    let _serial = MERGING.lock().unwrap_or_else(|e| e.into_inner());
    let pending = take_pending(path);
    // Counts kept for a file of another shape (the model was replaced) are dropped.
    let mut earlier = ExpertUsage::new(shape.0, shape.1);
    let pending = if earlier.merge_triples(&pending).is_ok() { pending } else { Vec::new() };
    let mut all = pending;
    all.extend_from_slice(triples);
    let _lock = match lock(path) {
        Ok(l) => l,
        Err(LockError::Busy) => {
            let mut usage = read_usage(path, shape.0, shape.1, fingerprint);
            let mut waiting = ExpertUsage::new(shape.0, shape.1);
            waiting.merge_triples(&all)?;
            usage.merge(&waiting)?;
            keep_pending(path, all);
            return Ok(Merged { usage, deferred: true });
        }
        Err(LockError::Other(e)) => {
            keep_pending(path, all[..all.len() - triples.len()].to_vec());
            return Err(e);
        }
    };
    let mut usage = read_usage(path, shape.0, shape.1, fingerprint);
    let mut add = ExpertUsage::new(shape.0, shape.1);
    add.merge_triples(&all)?;
    usage.merge(&add)?;
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = crate::paths::open_private(&tmp, true)?;
        f.write_all(&usage.to_json_bytes(id, fingerprint))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        keep_pending(path, all[..all.len() - triples.len()].to_vec());
        return Err(e).with_context(|| format!("{}: cannot write", path.display()));
    }
    Ok(Merged { usage, deferred: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_held_lock_defers_the_counts_without_waiting() {
        use std::os::unix::io::AsRawFd;
        let dir = std::env::temp_dir().join(format!("coli-usage-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("usage.json");
        let other = OpenOptions::new().create(true).append(true).open(dir.join("usage.json.lock")).unwrap();
        // SAFETY: flock on a descriptor we own (another open file description, as another process would have).
        assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX) }, 0);
        let t = std::time::Instant::now();
        let m = merge_into_file(&path, "m", (1, 2), None, &[(0, 0, 1)]).unwrap();
        assert!(m.deferred && m.usage.get(0, 0) == 1);
        let m = merge_into_file(&path, "m", (1, 2), None, &[(0, 1, 2)]).unwrap();
        assert!(m.deferred && m.usage.total() == 3);
        assert!(t.elapsed() < std::time::Duration::from_millis(500), "{:?}", t.elapsed());
        assert!(!path.exists(), "nothing written without the lock");
        drop(other);
        let m = merge_into_file(&path, "m", (1, 2), None, &[(0, 0, 1)]).unwrap();
        assert!(!m.deferred);
        let u = read_usage(&path, 1, 2, None);
        assert_eq!((u.get(0, 0), u.get(0, 1)), (2, 2), "the deferred counts were written with the next merge");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_world_writable_model_directory_keeps_no_usage_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("coli-usage-shared-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fallback = dir.join("fallback");
        assert_eq!(usage_path(&dir, "m", Some(&fallback)), dir.join("usage.json"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(usage_path(&dir, "m", Some(&fallback)), fallback.join("m.json"));
        assert!(!merge_into_file(&fallback.join("m.json"), "m", (1, 1), None, &[(0, 0, 1)]).unwrap().deferred);
        let mode = std::fs::metadata(&fallback).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
                        let m = merge_into_file(path, "m", (2, 3), Some("ab"), &[(0, 1, 1), (1, t % 3, 2)]);
                        assert!(!m.unwrap().deferred, "merges of one process wait for each other");
                    }
                });
            }
        });
        let u = read_usage(&path, 2, 3, Some("ab"));
        assert_eq!(u.get(0, 1), 100);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("usage.json.lock")).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the lock file is private: {mode:o}");
        }
        // A killed writer's temporary file goes; a live one's stays.
        std::fs::write(dir.join("usage.json.tmp.999999999"), b"{").unwrap();
        std::fs::write(dir.join(format!("usage.json.tmp.{}", std::process::id())), b"{").unwrap();
        assert_eq!(clean_temp_files(&dir), 1);
        assert!(dir.join(format!("usage.json.tmp.{}", std::process::id())).exists());
        std::fs::remove_file(dir.join(format!("usage.json.tmp.{}", std::process::id()))).unwrap();
        assert_eq!(u.total(), 300);
        assert!(merge_into_file(&path, "m", (2, 3), Some("ab"), &[(2, 0, 1)]).is_err());
        assert_eq!(read_usage(&path, 2, 3, Some("ab")).total(), 300);
        // A file for another shape, or another version of the model, is not merged into:
        // the retrained model starts from its own counts.
        assert_eq!(read_usage(&path, 4, 3, Some("ab")).total(), 0);
        assert_eq!(read_usage(&path, 2, 3, Some("cd")).total(), 0);
        let u = merge_into_file(&path, "m", (2, 3), Some("cd"), &[(1, 1, 5)]).unwrap().usage;
        assert_eq!(u.total(), 5);
        assert_eq!(read_usage(&path, 2, 3, Some("ab")).total(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
