//! The output directory of `coli convert`: what may be written into (never the source,
//! nor a directory holding other files unless forced), the journal a rerun resumes from,
//! and making renames durable.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use colibri_engine::format::is_container;
use colibri_engine::format::manifest;

/// The journal of the items written so far (one line each: item, checksum).
pub(super) const JOURNAL: &str = "convert.journal";

/// Journaled (item, checksum) pairs of a previous run with the same fingerprint.
pub(super) fn read_journal(path: &Path, header: &str) -> Vec<(usize, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some(header) {
        return Vec::new();
    }
    lines
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| {
            let (a, b) = l.trim_end().split_once(' ')?;
            Some((a.parse().ok()?, manifest::parse_checksum(b)?))
        })
        .collect()
}

/// Refuses an output directory that would destroy data: the source itself, one inside the
/// source or holding it, or an existing directory with other files in it (unless `force`;
/// an unfinished conversion, with its journal, is resumed).
pub(super) fn check_output_dir(src: &Path, out: &Path, force: bool) -> Result<()> {
    let src = src.canonicalize().with_context(|| format!("{}: cannot open", src.display()))?;
    // The output may not exist yet: canonicalize its nearest existing ancestor.
    let mut existing = out.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(p), Some(n)) => {
                rest.push(n.to_owned());
                existing = if p.as_os_str().is_empty() { PathBuf::from(".") } else { p.to_path_buf() };
            }
            _ => break,
        }
    }
    let mut out_abs = existing.canonicalize().with_context(|| format!("{}: cannot open", out.display()))?;
    for n in rest.iter().rev() {
        out_abs.push(n);
    }
    if out_abs == src {
        bail!("{}: the output directory is the source; choose another one with -o", out.display());
    }
    if out_abs.starts_with(&src) {
        bail!("{}: the output directory is inside the source {}; choose another one", out.display(), src.display());
    }
    if src.starts_with(&out_abs) {
        bail!("{}: the output directory holds the source {}; choose another one", out.display(), src.display());
    }
    if out_abs.exists() && !out_abs.is_dir() {
        bail!("{}: exists and is not a directory", out.display());
    }
    let resumable = out_abs.join(JOURNAL).is_file() || is_container(&out_abs);
    let has_files = std::fs::read_dir(&out_abs).map(|mut d| d.next().is_some()).unwrap_or(false);
    if has_files && !resumable && !force {
        bail!(
            "{}: the directory exists and holds other files; choose an empty or new directory (or pass --force to write into it)",
            out.display()
        );
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) {
    // Makes renames durable on unix; not possible (nor needed) everywhere.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}
