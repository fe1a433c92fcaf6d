//! `coli pull` of a repository of GGUF files (llama.cpp's format, e.g.
//! `Qwen/Qwen3-30B-A3B-GGUF`): one GGUF is chosen (`--gguf NAME_OR_TAG`, or the only one),
//! downloaded into `<models>/.pull/<owner>--<name>@<rev>/src` (resuming its `.part`,
//! size and sha256 checked against the hub, fetched again once if corrupted), then
//! converted exactly as `coli convert FILE.gguf -o DIR` converts it (the conversion's
//! journal lets a killed run resume), and installed. A split GGUF
//! (`NAME-00001-of-00003.gguf`) is all of its parts, each downloaded and checked the same
//! way. The disk needed is the GGUF plus the container; the files are deleted once
//! installed.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::convert::Quant;
use super::convert::{convert_pass, ConvertArgs};
use super::info::human;
use super::pull_staging::{create_staging, ensure_room, have, install, marker, touch};
use crate::hub::{Hub, RemoteFile};

/// A GGUF model file (not a multimodal projector, which has no language model in it).
pub fn is_gguf_name(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    base.ends_with(".gguf") && !base.starts_with("mmproj")
}

/// `(part, parts)` of a split GGUF's name (`NAME-00001-of-00003.gguf`, as
/// llama-gguf-split names them).
fn split_part(path: &str) -> Option<(u32, u32)> {
    let stem = path.to_ascii_lowercase();
    let stem = stem.strip_suffix(".gguf")?;
    let (rest, of) = stem.rsplit_once("-of-")?;
    let (_, part) = rest.rsplit_once('-')?;
    let ok = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !ok(part) || !ok(of) {
        return None;
    }
    Some((part.parse().ok()?, of.parse().ok()?))
}

/// Every file of the GGUF that `path` is: `path` itself, or all parts of its split, which
/// must all be in `files`.
fn parts_of(repo: &str, path: &str, files: &[&str]) -> Result<Vec<String>> {
    let Some((_, n)) = split_part(path).filter(|&(_, n)| n > 1) else {
        return Ok(vec![path.to_string()]);
    };
    // "-NNNNN-of-NNNNN.gguf" is 20 ASCII bytes (split_part checked the digits).
    let (prefix, ext) = (&path[..path.len() - 20], &path[path.len() - 5..]);
    let parts: Vec<String> = (1..=n).map(|i| format!("{prefix}-{i:05}-of-{n:05}{ext}")).collect();
    if let Some((i, p)) = parts.iter().enumerate().find(|(_, p)| !files.contains(&p.as_str())) {
        bail!("{repo} lacks part {} of {n} of the split GGUF {path}: no {p}", i + 1);
    }
    Ok(parts)
}

/// The GGUF file to pull: `want` as a file name (or path in the repository), else the one
/// GGUF whose name contains it (case-insensitively: a quant tag such as Q4_K_M; a split
/// GGUF counts once, by its first part); with no `want`, the repository's only GGUF.
fn choose<'a>(repo: &str, all: &[&'a str], want: Option<&str>) -> Result<&'a str> {
    let files: Vec<&'a str> = all.iter().copied().filter(|f| split_part(f).is_none_or(|(no, _)| no == 1)).collect();
    let list = || files.join(", ");
    if files.is_empty() {
        bail!("{repo} has no *.gguf files");
    }
    let Some(want) = want else {
        if let [one] = files.as_slice() {
            return Ok(one);
        }
        bail!(
            "{repo} holds {} GGUF files ({}): choose one with --gguf NAME or a quantization such as --gguf Q4_K_M",
            files.len(),
            list()
        );
    };
    let base = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
    if let Some(f) = all.iter().find(|f| **f == want || base(f) == want) {
        return Ok(f);
    }
    let w = want.to_ascii_lowercase();
    let hits: Vec<&&str> = files.iter().filter(|f| f.to_ascii_lowercase().contains(&w)).collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => bail!("no GGUF file of {repo} matches --gguf {want:?} (it has {})", list()),
        many => {
            let names: Vec<&str> = many.iter().map(|f| **f).collect();
            bail!(
                "--gguf {want:?} matches {} GGUF files of {repo} ({}): give more of the name",
                names.len(),
                names.join(", ")
            )
        }
    }
}

pub fn pull_gguf(
    hub: &Hub,
    repo: &str,
    rev: &str,
    listed: &[RemoteFile],
    (gguf, quant, group_size): (Option<&str>, Option<Quant>, Option<u32>),
    staging: &Path,
    dest: &Path,
) -> Result<()> {
    let files: Vec<&str> = listed.iter().map(|f| f.path.as_str()).filter(|p| is_gguf_name(p)).collect();
    let chosen = choose(repo, &files, gguf)?;
    let paths = parts_of(repo, chosen, &files)?;
    let src = staging.join("src");
    let out = staging.join("out");
    let mut stats = Vec::with_capacity(paths.len());
    for path in &paths {
        // The local name is the file's own (it is what `coli info` reports as the source).
        let name = path.rsplit('/').next().unwrap_or(path);
        if name.is_empty() || name.starts_with('.') || name.contains('\\') {
            bail!("{path}: not a usable file name");
        }
        stats.push((name, hub.stat(repo, rev, path)?));
    }
    // Every part is on disk at once, before the conversion writes the container.
    let need: u64 = stats.iter().map(|(name, f)| f.size - have(&src.join(name), f.size)).sum();
    let models = dest.ancestors().nth(2).unwrap_or(dest);
    ensure_room(models, need, &format!("{repo}: {chosen}"))?;
    create_staging(staging, repo, rev)?;
    let mut first = None;
    for (i, (path, (name, f))) in paths.iter().zip(stats).enumerate() {
        let of = if paths.len() > 1 { format!(" (part {} of {})", i + 1, paths.len()) } else { String::new() };
        eprintln!("pulling {path}{of} of {repo}@{rev} from {}: {}", hub.endpoint(), human(f.size));
        let local = src.join(name);
        let verified = marker(&src, name, "verified");
        if !verified.exists() || std::fs::metadata(&local).map(|m| m.len()).ok() != Some(f.size) {
            let _ = std::fs::remove_file(&verified);
            hub.download(repo, rev, &f, &local)?;
            touch(&verified)?;
        }
        first.get_or_insert(local);
    }
    let (Some(local), Some(name)) = (first, paths.first()) else { bail!("{repo}: no GGUF file chosen") };
    let name = name.rsplit('/').next().unwrap_or(name);
    let args = ConvertArgs {
        src: local,
        out: Some(out.clone()),
        quant,
        group_size,
        embed: None,
        lm_head: None,
        attn: None,
        experts: None,
        mlp: None,
        force: false,
    };
    if !colibri_engine::format::is_container(&out) {
        convert_pass(&args, None).with_context(|| format!("{repo}: converting {name}"))?;
    }
    install(repo, &out, staging, models)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choosing_a_file() {
        let files = ["Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf", "sub/Tiny-F16.gguf"];
        assert_eq!(choose("r", &files, Some("q8_0")).unwrap(), "Tiny-Q8_0.gguf");
        assert_eq!(choose("r", &files, Some("Tiny-F16.gguf")).unwrap(), "sub/Tiny-F16.gguf");
        assert!(choose("r", &files, None).unwrap_err().to_string().contains("holds 3 GGUF files"));
        assert!(choose("r", &files, Some("Tiny-Q")).unwrap_err().to_string().contains("matches 2"));
        assert!(choose("r", &files, Some("Q2_K")).unwrap_err().to_string().contains("no GGUF file"));
        assert_eq!(choose("r", &files[1..2], None).unwrap(), "Tiny-Q8_0.gguf");
        assert!(is_gguf_name("a/B.GGUF") && !is_gguf_name("mmproj-F16.gguf") && !is_gguf_name("x.bin"));
        assert_eq!(split_part("Big-Q4_K_M-00002-of-00003.gguf"), Some((2, 3)));
        assert_eq!(split_part("Big-Q4_K_M.gguf"), None);
        // A split GGUF is one choice, by any part's exact name or a part of its name.
        let files = ["d/Big-Q4_K_M-00001-of-00002.gguf", "d/Big-Q4_K_M-00002-of-00002.gguf", "Big-Q8_0.gguf"];
        assert_eq!(choose("r", &files, Some("q4_k_m")).unwrap(), files[0]);
        assert_eq!(choose("r", &files, Some("Big-Q4_K_M-00002-of-00002.gguf")).unwrap(), files[1]);
        assert!(choose("r", &files, None).unwrap_err().to_string().contains("holds 2 GGUF files"));
        assert_eq!(parts_of("r", files[1], &files).unwrap(), files[..2]);
        assert_eq!(parts_of("r", files[2], &files).unwrap(), [files[2]]);
        let e = parts_of("r", files[0], &files[..1]).unwrap_err().to_string();
        assert!(e.contains("lacks part 2 of 2") && e.contains("d/Big-Q4_K_M-00002-of-00002.gguf"), "{e}");
    }
}
