//! The staging directory of `coli pull` (`<models>/.pull/<owner>--<name>@<rev>`) and what
//! both kinds of pull ([`super::pull`]: safetensors shards; [`super::pull_gguf`]: one GGUF
//! file) do in it: the markers of each file's state, the room check before anything is
//! written, what is already downloaded, and the final install into the models directory.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::commands::info::human;
use crate::commands::list::{locate, remove, STAGING_ID_FILE};

/// The marker of `name`'s `state` (`verified`, `converted`) in the staging `src`.
pub(crate) fn marker(src: &Path, name: &str, state: &str) -> PathBuf {
    src.join(format!(".{name}.{state}"))
}

/// Creates (and syncs) an empty marker file.
pub(crate) fn touch(p: &Path) -> Result<()> {
    File::create(p).with_context(|| format!("{}: cannot create", p.display()))?.sync_all()?;
    Ok(())
}

/// Creates the staging directory's `src` and the file that names the pull (what `coli
/// list --partial` and `coli rm` read).
pub(crate) fn create_staging(staging: &Path, repo: &str, rev: &str) -> Result<PathBuf> {
    let src = staging.join("src");
    std::fs::create_dir_all(&src).with_context(|| format!("{}: cannot create", src.display()))?;
    let id = staging.join(STAGING_ID_FILE);
    if !id.is_file() {
        std::fs::write(&id, format!("{repo}@{rev}\n")).with_context(|| format!("{}: cannot create", id.display()))?;
    }
    Ok(src)
}

/// Bytes of `dest` already on disk: the whole file if it has `size` bytes, else its
/// `.part` (a download to resume).
pub(crate) fn have(dest: &Path, size: u64) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    if len(dest) == size {
        return size;
    }
    len(&crate::hub::part_path(dest)).min(size)
}

/// Refuses, before anything is written, a pull that needs more than the free space of the
/// file system of the models directory.
pub(crate) fn ensure_room(models: &Path, need: u64, what: &str) -> Result<()> {
    if let Some(free) = crate::hub::free_bytes(models) {
        if need > free {
            bail!("{what} needs {} of free disk in {}, {} is free", human(need), models.display(), human(free));
        }
    }
    Ok(())
}

/// Moves the converted model `out` to `<models>/<repo>` and removes the staging
/// directory. An installed model it replaces (`--force`) is removed as `coli rm` removes
/// it: never through a link out of the models directory.
pub(crate) fn install(repo: &str, out: &Path, staging: &Path, models: &Path) -> Result<()> {
    let dest = &models.join(repo);
    let home = models.canonicalize().with_context(|| format!("cannot resolve {}", models.display()))?;
    if let Some(old) = locate(&home, repo)? {
        remove(&old).with_context(|| format!("cannot replace {}", dest.display()))?;
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(out, dest).with_context(|| format!("cannot move the model into {}", dest.display()))?;
    std::fs::remove_dir_all(staging).with_context(|| format!("cannot remove {}", staging.display()))?;
    if let Some(pulls) = staging.parent() {
        let _ = std::fs::remove_dir(pulls);
    }
    eprintln!("installed {repo} in {} (coli chat --model {repo})", dest.display());
    Ok(())
}
