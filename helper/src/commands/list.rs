//! `coli list`: the installed models (the models directory, `$COLI_HOME`), one line each:
//! id, family, quantization, size on disk, resident versus streamed bytes, directory;
//! `coli list --partial`, the unfinished pulls (`<models>/.pull/*`, kept so that `coli
//! pull` resumes them). `coli rm ID` removes a model and its unfinished pulls, never
//! anything outside the models directory: an owner directory linked to elsewhere is
//! refused, a model that is a link loses only the link, and links inside a model's
//! directory are removed, not followed.

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
    /// List the unfinished pulls instead (staging data that `coli pull ID` resumes and
    /// `coli rm ID` removes).
    #[arg(long)]
    pub partial: bool,
}

#[derive(Args)]
pub struct RmArgs {
    /// Id of the installed model to delete, with its unfinished pulls (see `coli list`,
    /// `coli list --partial`).
    pub id: String,
    /// Delete without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Bytes of the regular files under `dir` (not following symlinks).
pub fn disk_size(dir: &Path) -> u64 {
    sum_files(dir, |m| m.len())
}

/// Bytes allocated on disk to the files under `dir` (not following symlinks): a pull's
/// sparse placeholders count for what they really hold.
pub fn allocated_size(dir: &Path) -> u64 {
    #[cfg(unix)]
    use std::os::unix::fs::MetadataExt;
    #[cfg(unix)]
    return sum_files(dir, |m| m.blocks() * 512);
    #[cfg(not(unix))]
    return sum_files(dir, |m| m.len());
}

/// `size` summed over the regular files under `dir` (symlinks neither followed nor counted).
fn sum_files(dir: &Path, size: impl Fn(&std::fs::Metadata) -> u64) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) if m.is_file() => total += size(&m),
                _ => {}
            }
        }
    }
    total
}

/// The directory under the models directory where `coli pull` stages its downloads.
pub const PULLS_DIR: &str = ".pull";
/// The file in a staging directory that names what it is a pull of (`owner/name@rev`).
pub const STAGING_ID_FILE: &str = ".id";

/// An unfinished `coli pull`: its staging directory.
pub struct PartialPull {
    pub id: String,
    pub rev: String,
    pub path: PathBuf,
    /// Bytes allocated on disk.
    pub bytes: u64,
}

/// Every staging directory under `<models>/.pull`, sorted by id and revision. The id is
/// what the directory's [`STAGING_ID_FILE`] says, else read from its name
/// (`owner--name@rev`, as pulls before that file named them).
pub fn partial_pulls(models: &Path) -> Vec<PartialPull> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(models.join(PULLS_DIR)) else { return out };
    for e in rd.flatten().take(10_000) {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let said = std::fs::read(path.join(STAGING_ID_FILE)).ok().filter(|b| b.len() <= 1024);
        let said = said.and_then(|b| String::from_utf8(b).ok()).map(|s| s.trim().to_string());
        let (id, rev) = match said.as_deref().and_then(|s| s.split_once('@')) {
            Some((id, rev)) => (id.to_string(), rev.to_string()),
            None => {
                let (repo, rev) = name.split_once('@').unwrap_or((&name, "main"));
                (repo.replacen("--", "/", 1), rev.replace("--", "/"))
            }
        };
        let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(false);
        let bytes = if is_link { 0 } else { allocated_size(&path) };
        out.push(PartialPull { id, rev, path, bytes });
    }
    out.sort_by(|a, b| (&a.id, &a.rev).cmp(&(&b.id, &b.rev)));
    out
}

fn partial_json(p: &PartialPull) -> serde_json::Value {
    json!({"id": p.id, "revision": p.rev, "bytes": p.bytes, "path": p.path.display().to_string()})
}

fn list_partial(dir: &Path, json_out: bool) -> Result<()> {
    let pulls = partial_pulls(dir);
    if json_out {
        let rows: Vec<_> = pulls.iter().map(partial_json).collect();
        println!("{}", json!({"models_dir": dir.display().to_string(), "partial": rows}));
        return Ok(());
    }
    if pulls.is_empty() {
        println!("no unfinished pulls in {}", dir.join(PULLS_DIR).display());
        return Ok(());
    }
    let w = pulls.iter().map(|p| p.id.len()).max().unwrap_or(2).max(2);
    println!("{:<w$}  {:<12} {:>10}  PATH", "ID", "REVISION", "ON DISK");
    for p in &pulls {
        println!("{:<w$}  {:<12} {:>10}  {}", p.id, p.rev, human(p.bytes), p.path.display());
    }
    println!("(coli pull ID resumes one, coli rm ID removes it)");
    Ok(())
}

fn the_models_dir() -> Result<PathBuf> {
    models_dir().context("no models directory: set COLI_HOME or HOME")
}

pub fn list(a: ListArgs) -> Result<()> {
    let dir = the_models_dir()?;
    if a.partial {
        return list_partial(&dir, a.json);
    }
    let partial = partial_pulls(&dir);
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
    // The demo model built into coli, until its first use installs it here.
    let demo_here = rows.iter().any(|r| r["id"] == "demo");
    if a.json {
        let partial: Vec<_> = partial.iter().map(partial_json).collect();
        let builtin = if demo_here { json!([]) } else { json!(["demo"]) };
        println!(
            "{}",
            json!({"models_dir": dir.display().to_string(), "models": rows, "partial": partial, "built_in": builtin})
        );
        return Ok(());
    }
    let builtin = || {
        if !demo_here {
            println!(
                "demo: built into coli, installed into {} on first use (coli run demo)",
                dir.join("demo").display()
            );
        }
    };
    let note = || {
        if !partial.is_empty() {
            let bytes = partial.iter().map(|p| p.bytes).sum::<u64>();
            println!("{} unfinished pull(s), {} on disk: coli list --partial", partial.len(), human(bytes));
        }
    };
    if rows.is_empty() {
        println!("no models installed in {} (coli pull OWNER/NAME installs one)", dir.display());
        builtin();
        note();
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
    builtin();
    note();
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let dir = the_models_dir()?;
    if !is_valid_model_id(&a.id) {
        bail!("{:?} is not a model id (name or owner/name; see coli list)", a.id);
    }
    let none =
        || anyhow::anyhow!("{}: no installed model of that id in {} (nor an unfinished pull)", a.id, dir.display());
    let home = match dir.canonicalize() {
        Ok(h) => h,
        Err(_) if !dir.exists() => return Err(none()),
        Err(e) => return Err(e).with_context(|| format!("cannot resolve {}", dir.display())),
    };
    let model = locate(&home, &a.id)?;
    let pulls: Vec<PartialPull> = match pulls_dir(&home)? {
        Some(p) => partial_pulls(p.parent().unwrap_or(&home)).into_iter().filter(|p| p.id == a.id).collect(),
        None => Vec::new(),
    };
    if model.is_none() && pulls.is_empty() {
        return Err(none());
    }
    let mut what = Vec::new();
    let mut freed = 0;
    if let Some(m) = &model {
        if m.link {
            what.push(format!("the link {} (its target stays)", m.path.display()));
        } else {
            let size = disk_size(&m.path);
            freed += size;
            what.push(format!("{} ({})", m.path.display(), human(size)));
        }
    }
    for p in &pulls {
        freed += p.bytes;
        what.push(format!("the unfinished pull {} ({})", p.path.display(), human(p.bytes)));
    }
    if !a.yes && !confirm(&format!("delete {} = {}?", a.id, what.join(" and ")))? {
        bail!("{} kept", a.id);
    }
    if let Some(m) = &model {
        remove(m)?;
        if let Some((owner, _)) = a.id.split_once('/') {
            // Drops the owner's directory once its last model is gone (fails harmlessly
            // if not; never a link).
            let o = home.join(owner);
            if std::fs::symlink_metadata(&o).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_dir(o);
            }
        }
    }
    for p in &pulls {
        remove(&Located {
            link: std::fs::symlink_metadata(&p.path).is_ok_and(|m| m.is_symlink()),
            path: p.path.clone(),
        })?;
    }
    let _ = std::fs::remove_dir(home.join(PULLS_DIR));
    let kind = match (model.is_some(), pulls.len()) {
        (true, 0) => String::new(),
        (true, n) => format!(" and {n} unfinished pull(s)"),
        (false, n) => format!(": {n} unfinished pull(s)"),
    };
    eprintln!("removed {}{kind} ({} freed)", a.id, human(freed));
    Ok(())
}

/// An installed model found inside the models directory.
pub struct Located {
    /// Strictly inside the (resolved) models directory, reached through no link that leads
    /// out of it; the model's own entry may be a link.
    pub path: PathBuf,
    /// The entry is a symbolic link: removing it removes the link only.
    pub link: bool,
}

/// The installed model `id` in the resolved models directory `home`, if there is one. Its
/// owner directory, for an `owner/name` id, must resolve inside `home`: a link that leads
/// elsewhere is refused, never deleted through.
pub fn locate(home: &Path, id: &str) -> Result<Option<Located>> {
    let (parent, name) = match id.split_once('/') {
        Some((owner, name)) => (home.join(owner), name),
        None => (home.to_path_buf(), id),
    };
    if !parent.exists() {
        return Ok(None);
    }
    let real_parent = parent.canonicalize().with_context(|| format!("cannot resolve {}", parent.display()))?;
    if !real_parent.starts_with(home) {
        bail!(
            "{} leads to {}, outside the models directory {}: not deleting anything through it",
            parent.display(),
            real_parent.display(),
            home.display()
        );
    }
    let path = real_parent.join(name);
    let Ok(meta) = std::fs::symlink_metadata(&path) else { return Ok(None) };
    if !path.join("config.json").is_file() {
        return Ok(None);
    }
    Ok(Some(Located { link: meta.file_type().is_symlink(), path }))
}

/// `<home>/.pull` if it exists and is inside `home` (a link out of it is refused).
fn pulls_dir(home: &Path) -> Result<Option<PathBuf>> {
    let p = home.join(PULLS_DIR);
    if !p.exists() {
        return Ok(None);
    }
    let real = p.canonicalize().with_context(|| format!("cannot resolve {}", p.display()))?;
    if real != p {
        bail!("{} leads to {}: not deleting anything through it", p.display(), real.display());
    }
    Ok(Some(real))
}

/// Removes a located entry: a link itself, or a directory and everything in it, links
/// inside removed as links, never followed (std's remove_dir_all).
pub fn remove(m: &Located) -> Result<()> {
    if m.link {
        std::fs::remove_file(&m.path).with_context(|| format!("cannot remove {}", m.path.display()))
    } else {
        std::fs::remove_dir_all(&m.path).with_context(|| format!("cannot remove {}", m.path.display()))
    }
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
