//! Where colibri keeps things on this machine, and how `--model` names a model.
//!
//! Data directory (XDG base directories): `$XDG_DATA_HOME/colibri`, else
//! `~/.local/share/colibri` (on macOS `~/Library/Application Support/colibri`).
//! Installed models live in the models directory, `$COLI_HOME` when set, else the data
//! directory's `models/`. A subdirectory with a `config.json` is a model whose id is its
//! name (`demo`); one without holds the models of one hub owner, `owner/name` (what
//! `coli pull owner/name` installs).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

/// `$XDG_DATA_HOME/colibri` or its platform default; None without a home directory.
pub fn data_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()).map(PathBuf::from) {
        if x.is_absolute() {
            return Some(x.join("colibri"));
        }
    }
    let home = home()?;
    if cfg!(target_os = "macos") {
        Some(home.join("Library/Application Support/colibri"))
    } else {
        Some(home.join(".local/share/colibri"))
    }
}

/// `$XDG_CONFIG_HOME` or `~/.config`.
pub fn config_home() -> Option<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()).map(PathBuf::from) {
        Some(x) if x.is_absolute() => Some(x),
        _ => home().map(|h| h.join(".config")),
    }
}

/// The directory of installed models: `$COLI_HOME`, else `<data dir>/models`.
pub fn models_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("COLI_HOME").filter(|h| !h.is_empty()).map(PathBuf::from) {
        return Some(std::path::absolute(&h).unwrap_or(h));
    }
    data_dir().map(|d| d.join("models"))
}

include!(concat!(env!("OUT_DIR"), "/demo_model.rs"));

/// Written into an installed demo: says the directory came from this binary (and may be
/// replaced by a newer one), not from the user.
const DEMO_MARKER: &str = ".builtin-demo";

/// Whether `dir` holds the demo files of this binary, byte for byte where it matters
/// (every file of the same length, the manifest and config equal).
fn demo_is_current(dir: &Path) -> bool {
    DEMO_FILES.iter().all(|(name, bytes)| {
        let p = dir.join(name);
        match *name {
            "colibri.json" | "config.json" => std::fs::read(&p).is_ok_and(|b| b == *bytes),
            _ => std::fs::metadata(&p).is_ok_and(|m| m.len() == bytes.len() as u64),
        }
    })
}

/// The built-in demo model (a small qwen3_moe trained by tools/train_demo.py, embedded in
/// this binary by build.rs) as `demo` in `models`: installed there from the embedded bytes
/// when missing, or replaced when an older `coli` installed another version. A `demo` the
/// user put there (no marker) is left as it is. Written beside and renamed into place, so
/// that two processes installing it at once both end with one whole copy.
pub fn install_demo(models: &Path) -> std::io::Result<PathBuf> {
    let dest = models.join("demo");
    let ours = dest.join(DEMO_MARKER).is_file();
    if dest.join("config.json").is_file() && (!ours || demo_is_current(&dest)) {
        return Ok(dest);
    }
    std::fs::create_dir_all(models)?;
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = models.join(format!(".demo-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp)?;
    let written = (|| {
        for (name, bytes) in DEMO_FILES {
            std::fs::write(tmp.join(name), bytes)?;
        }
        std::fs::write(tmp.join(DEMO_MARKER), "installed by coli from the demo model built into it\n")
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // An older built-in demo (or a partial one) goes first; its usage counts with it.
    if dest.exists() {
        let old = models.join(format!(".demo-old-{}-{n}", std::process::id()));
        if std::fs::rename(&dest, &old).is_ok() {
            let _ = std::fs::remove_dir_all(&old);
        }
    }
    match std::fs::rename(&tmp, &dest) {
        Ok(()) => Ok(dest),
        // Another process put its copy in place first.
        Err(_) if demo_is_current(&dest) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dest)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The built-in demo model's directory: installed into `models` (default [`models_dir`]),
/// or, where that cannot be written (no home directory, a read-only one), into a private
/// directory under the system's temporary directory.
pub fn builtin_demo(models: Option<&Path>) -> std::io::Result<PathBuf> {
    let dir = models.map(Path::to_path_buf).or_else(models_dir);
    if let Some(Ok(p)) = dir.as_deref().map(install_demo) {
        return Ok(p);
    }
    let uid = {
        #[cfg(unix)]
        {
            // SAFETY: getuid has no preconditions and cannot fail.
            unsafe { libc::getuid() }
        }
        #[cfg(not(unix))]
        {
            0
        }
    };
    let tmp = std::env::temp_dir().join(format!("colibri-demo-{uid}"));
    private_dir(&tmp)?;
    install_demo(&tmp)
}

/// One part of a model id: a directory name of letters, digits, `.`, `_` and `-`, not
/// starting with a dot (so never `.` or `..`), at most 128 bytes.
fn is_valid_id_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 128
        && !part.starts_with('.')
        && part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A model id: `name` or `owner/name` (a hub repository), each part a plain directory name.
pub fn is_valid_model_id(id: &str) -> bool {
    match id.split_once('/') {
        None => is_valid_id_part(id),
        Some((owner, name)) => is_valid_id_part(owner) && is_valid_id_part(name),
    }
}

/// Every model installed in `dir` as (id, directory), sorted by id: subdirectories with a
/// `config.json`, and one level further down for `owner/name` ids.
pub fn installed_models(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    // A directory of symlinks to itself must not take minutes: every entry looked at
    // (at both levels together) counts against one budget.
    let budget = std::cell::Cell::new(20_000usize);
    let names = |d: &Path| -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(d) else { return Vec::new() };
        let left = budget.get();
        let v: Vec<String> = rd
            .flatten()
            .take(left)
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| is_valid_id_part(n))
            .collect();
        budget.set(left.saturating_sub(v.len()));
        v
    };
    for owner in names(dir) {
        let p = dir.join(&owner);
        if p.join("config.json").is_file() {
            out.push((owner, p));
        } else if p.is_dir() {
            for name in names(&p) {
                let q = p.join(&name);
                if q.join("config.json").is_file() {
                    out.push((format!("{owner}/{name}"), q));
                }
            }
        }
    }
    out.sort();
    out
}

/// What `--model` names, for every command: an existing directory, else the id of an
/// installed model in `models_dir` (default [`models_dir`]), else `demo` for the built-in
/// demo model.
pub fn resolve_model(arg: &Path, models_dir: Option<&Path>) -> Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let id = arg.to_str().filter(|s| is_valid_model_id(s));
    let Some(id) = id else { bail!("{}: no such model directory", arg.display()) };
    let dir = models_dir.map(Path::to_path_buf).or_else(self::models_dir);
    if let Some(d) = &dir {
        let p = d.join(id);
        if p.join("config.json").is_file() {
            return Ok(p);
        }
    }
    if id == "demo" {
        return builtin_demo(dir.as_deref()).context("cannot install the built-in demo model");
    }
    match dir {
        Some(d) => bail!("{id}: no such model directory, and no installed model of that name in {}", d.display()),
        None => bail!("{id}: no such model directory"),
    }
}

/// Creates `dir` and its missing parents as 0700, and closes `dir` itself to other users
/// when it exists already with more (a directory an older coli created 0755). The one
/// way colibri makes the directories of its caches, usage counts and locks, whoever runs it.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::symlink_metadata(dir)?;
        if !m.is_dir() {
            return Err(std::io::Error::other(format!("{} is not a directory", dir.display())));
        }
        // SAFETY: geteuid has no preconditions.
        if m.permissions().mode() & 0o077 != 0 && m.uid() == unsafe { libc::geteuid() } {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Opens (creating it 0600 when missing) the private file `path` of a cache, usage count or
/// lock: never through a symlink (O_NOFOLLOW), never blocking on a FIFO, only a regular
/// file, and closed to other users if an older coli left it readable. With `truncate`
/// opened for writing from an empty file, else for appending; for reading as well.
pub fn open_private(path: &Path, truncate: bool) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).create(true);
    if truncate {
        o.write(true).truncate(true);
    } else {
        o.append(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    }
    let f = o.open(path)?;
    check_private_file(&f, path)?;
    Ok(f)
}

/// Opens the existing cache file `path` for reading only: never through a symlink, never
/// blocking on a FIFO (refused: not a regular file).
pub fn open_private_read(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    }
    let f = o.open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or directory)",
        ));
    }
    Ok(f)
}

fn check_private_file(f: &std::fs::File, path: &Path) -> std::io::Result<()> {
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: not a regular file (a FIFO, device or directory)", path.display()),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if m.permissions().mode() & 0o077 != 0 {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_plain_directory_names() {
        for ok in ["demo", "qwen3_moe", "Mixtral-8x7B-v0.1", "a.b"] {
            assert!(is_valid_model_id(ok), "{ok}");
        }
        assert!(is_valid_model_id("allenai/OLMoE-1B-7B-0924"));
        for bad in ["", ".", "..", ".hidden", "a/b/c", "/a", "a/", "a/..", "../a", "a\\b", "a b", "%2e%2e", "é"] {
            assert!(!is_valid_model_id(bad), "{bad}");
        }
    }

    #[test]
    fn resolves_paths_then_installed_ids() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let direct = fixtures.join("olmoe");
        assert_eq!(resolve_model(&direct, None).unwrap(), direct);
        assert_eq!(resolve_model(Path::new("olmoe"), Some(&fixtures)).unwrap(), fixtures.join("olmoe"));
        let err = resolve_model(Path::new("no-such-model"), Some(&fixtures)).unwrap_err().to_string();
        assert!(err.contains("no-such-model") && err.contains("tests/fixtures"), "{err}");
        assert!(resolve_model(Path::new("../x/y"), Some(&fixtures)).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn private_dirs_and_files_are_closed_to_others() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("coli-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let d = base.join("a/b");
        private_dir(&d).unwrap();
        for p in [base.join("a"), d.clone()] {
            assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700, "{}", p.display());
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        let f = d.join("f");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_private(&f, false).unwrap());
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        drop(open_private(&d.join("g"), true).unwrap());
        assert_eq!(std::fs::metadata(d.join("g")).unwrap().permissions().mode() & 0o777, 0o600);
        std::os::unix::fs::symlink(&f, d.join("link")).unwrap();
        assert!(open_private(&d.join("link"), false).is_err(), "a symlink is not followed");
        assert!(open_private_read(&d.join("link")).is_err());
        let fifo = std::ffi::CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(open_private_read(&d.join("fifo")).is_err(), "a FIFO is refused without blocking");
        assert!(open_private(&d.join("fifo"), false).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
