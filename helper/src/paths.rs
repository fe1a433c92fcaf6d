//! Where colibri keeps things on this machine, and how `--model` names a model.
//!
//! Data directory (XDG base directories): `$XDG_DATA_HOME/colibri`, else
//! `~/.local/share/colibri` (on macOS `~/Library/Application Support/colibri`).
//! Installed models live in the models directory, `$COLI_HOME` when set, else the data
//! directory's `models/`. A subdirectory with a `config.json` is a model whose id is its
//! name (`demo`); one without holds the models of one hub owner, `owner/name` (what
//! `coli pull owner/name` installs).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

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

/// The built-in demo model in a source checkout (models/demo, committed; trained by
/// tools/train_demo.py): what `--model demo` finds on a fresh checkout when no `demo` is
/// installed in the models directory.
pub fn builtin_demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo")
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
    if id == "demo" && builtin_demo().join("config.json").is_file() {
        return Ok(builtin_demo());
    }
    match dir {
        Some(d) => bail!("{id}: no such model directory, and no installed model of that name in {}", d.display()),
        None => bail!("{id}: no such model directory"),
    }
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
}
