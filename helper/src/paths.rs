//! Where colibri keeps things on this machine, and how `--model` names a model.
//!
//! Data directory (XDG base directories): `$XDG_DATA_HOME/colibri`, else
//! `~/.local/share/colibri` (on macOS `~/Library/Application Support/colibri`).
//! Installed models are its `models/` subdirectories: each one with a `config.json` is a
//! model whose id is the directory name.

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

/// Default directory of installed models.
pub fn models_dir() -> Option<PathBuf> {
    data_dir().map(|d| d.join("models"))
}

/// The built-in demo model in a source checkout (models/demo, committed; trained by
/// tools/train_demo.py): what `--model demo` finds on a fresh checkout when no `demo` is
/// installed in the models directory.
pub fn builtin_demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo")
}

/// A model id: a directory name of letters, digits, `.`, `_` and `-`, not starting with
/// a dot (so never `.` or `..`), at most 128 bytes.
pub fn is_valid_model_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What `--model` names: an existing directory, else the id of an installed model in
/// `models_dir` (default [`models_dir`]), else `demo` for the built-in demo model.
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
        for bad in ["", ".", "..", ".hidden", "a/b", "a\\b", "a b", "%2e%2e", "é"] {
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
