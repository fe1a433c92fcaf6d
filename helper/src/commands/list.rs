//! `coli list`: the installed models (the models directory, `$COLI_HOME`), one line each:
//! id, family, quantization, size on disk, resident versus streamed bytes, directory.
//! `coli rm ID` removes one.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

use crate::commands::info::{human, summarize};
use crate::paths::{installed_models, is_valid_model_id, models_dir};

#[derive(Args)]
pub struct ListArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct RmArgs {
    /// Id of the installed model to delete (see `coli list`).
    pub id: String,
    /// Delete without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Bytes of the regular files under `dir` (not following symlinks).
pub fn disk_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}

fn the_models_dir() -> Result<PathBuf> {
    models_dir().context("no models directory: set COLI_HOME or HOME")
}

pub fn list(a: ListArgs) -> Result<()> {
    let dir = the_models_dir()?;
    let mut rows = Vec::new();
    for (id, path) in installed_models(&dir) {
        let size = disk_size(&path);
        let row = match summarize(&path) {
            Ok(s) => json!({
                "id": id, "family": s.cfg.model_type, "quantization": s.quant_short, "size": size,
                "resident_bytes": s.resident, "streamed_bytes": s.streamed, "path": path.display().to_string(),
            }),
            Err(e) => json!({
                "id": id, "size": size, "path": path.display().to_string(), "error": format!("{e:#}"),
            }),
        };
        rows.push(row);
    }
    if a.json {
        println!("{}", json!({"models_dir": dir.display().to_string(), "models": rows}));
        return Ok(());
    }
    if rows.is_empty() {
        println!("no models installed in {} (coli pull OWNER/NAME installs one)", dir.display());
        return Ok(());
    }
    let text = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or("?").to_string();
    let bytes = |v: &serde_json::Value, k: &str| v[k].as_u64().map(human).unwrap_or_else(|| "?".into());
    let w = rows.iter().map(|r| text(r, "id").len()).max().unwrap_or(2).max(2);
    println!(
        "{:<w$}  {:<10} {:<10} {:>10} {:>10} {:>10}  PATH",
        "ID", "FAMILY", "QUANT", "SIZE", "RESIDENT", "STREAMED"
    );
    for r in &rows {
        if let Some(err) = r["error"].as_str() {
            println!("{:<w$}  unreadable: {err}", text(r, "id"));
            continue;
        }
        println!(
            "{:<w$}  {:<10} {:<10} {:>10} {:>10} {:>10}  {}",
            text(r, "id"),
            text(r, "family"),
            text(r, "quantization"),
            bytes(r, "size"),
            bytes(r, "resident_bytes"),
            bytes(r, "streamed_bytes"),
            text(r, "path")
        );
    }
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let dir = the_models_dir()?;
    if !is_valid_model_id(&a.id) {
        bail!("{:?} is not a model id (name or owner/name; see coli list)", a.id);
    }
    let path = dir.join(&a.id);
    if !path.join("config.json").is_file() {
        bail!("{}: no installed model of that id in {}", a.id, dir.display());
    }
    // A model linked into the models directory: the link goes, what it points to stays.
    let is_link = std::fs::symlink_metadata(&path).map(|m| m.file_type().is_symlink()).unwrap_or(false);
    let target = if is_link { path.clone() } else { inside(&dir, &path)? };
    let size = if is_link { 0 } else { disk_size(&target) };
    let what = if is_link {
        format!("the link {} (its target stays)", path.display())
    } else {
        format!("{} ({})", target.display(), human(size))
    };
    if !a.yes && !confirm(&format!("delete {} = {what}?", a.id))? {
        bail!("{} kept", a.id);
    }
    if is_link {
        std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    } else {
        std::fs::remove_dir_all(&target).with_context(|| format!("cannot remove {}", target.display()))?;
    }
    if let Some((owner, _)) = a.id.split_once('/') {
        // Drops the owner's directory once its last model is gone (fails harmlessly if not).
        let _ = std::fs::remove_dir(dir.join(owner));
    }
    eprintln!("removed {} ({} freed)", a.id, human(size));
    Ok(())
}

/// `path` with every link resolved, if that is strictly inside the models directory `dir`
/// (an owner directory linked to elsewhere is not deleted through).
fn inside(dir: &Path, path: &Path) -> Result<PathBuf> {
    let home = dir.canonicalize().with_context(|| format!("cannot resolve {}", dir.display()))?;
    let real = path.canonicalize().with_context(|| format!("cannot resolve {}", path.display()))?;
    if real == home || !real.starts_with(&home) {
        bail!(
            "{} resolves to {}, outside the models directory {}: not deleting it",
            path.display(),
            real.display(),
            home.display()
        );
    }
    Ok(real)
}

/// Asks on the terminal; without one, refuses (scripts pass --yes).
fn confirm(question: &str) -> Result<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        bail!("{question} stdin is not a terminal: pass --yes to delete without asking");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}
