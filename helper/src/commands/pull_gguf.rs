//! `coli pull` of a repository of GGUF files (llama.cpp's format, e.g.
//! `Qwen/Qwen3-30B-A3B-GGUF`): one file is chosen (`--gguf NAME_OR_TAG`, or the only one),
//! downloaded into `<models>/.pull/<owner>--<name>@<rev>/src` (resuming its `.part`,
//! size and sha256 checked against the hub, fetched again once if corrupted), then
//! converted exactly as `coli convert FILE.gguf -o DIR` converts it (the conversion's
//! journal lets a killed run resume), and installed. A GGUF is one file, so the disk
//! needed is the file plus the container; the file is deleted once installed.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::convert::{convert_pass, ConvertArgs};
use super::info::human;
use super::pull::{install, marker, touch, PullArgs};
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

/// The GGUF file to pull: `want` as a file name (or path in the repository), else the one
/// file whose name contains it (case-insensitively: a quant tag such as Q4_K_M); with no
/// `want`, the repository's only GGUF.
fn choose<'a>(repo: &str, files: &[&'a str], want: Option<&str>) -> Result<&'a str> {
    let list = || files.join(", ");
    if files.is_empty() {
        bail!("{repo} has no *.gguf files");
    }
    let Some(want) = want else {
        if let [one] = files {
            return Ok(one);
        }
        bail!(
            "{repo} holds {} GGUF files ({}): choose one with --gguf NAME or a quantization such as --gguf Q4_K_M",
            files.len(),
            list()
        );
    };
    let base = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
    if let Some(f) = files.iter().find(|f| **f == want || base(f) == want) {
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
    a: &PullArgs,
    staging: &Path,
    dest: &Path,
) -> Result<()> {
    let files: Vec<&str> = listed.iter().map(|f| f.path.as_str()).filter(|p| is_gguf_name(p)).collect();
    let path = choose(repo, &files, a.gguf.as_deref())?;
    if let Some((_, parts)) = split_part(path).filter(|&(_, n)| n > 1) {
        bail!(
            "{path} is one part of a GGUF split in {parts}: coli pull reads single-file GGUFs (download the parts, merge them with llama-gguf-split --merge, then coli convert the result)"
        );
    }
    // The local name is the file's own (it is what `coli info` reports as the source).
    let name = path.rsplit('/').next().unwrap_or(path);
    if name.is_empty() || name.starts_with('.') || name.contains('\\') {
        bail!("{path}: not a usable file name");
    }
    let f = hub.stat(repo, rev, path)?;
    eprintln!("pulling {path} of {repo}@{rev} from {}: {}", hub.endpoint(), human(f.size));
    let src = staging.join("src");
    let out = staging.join("out");
    std::fs::create_dir_all(&src).with_context(|| format!("{}: cannot create", src.display()))?;
    let local = src.join(name);
    let verified = marker(&src, name, "verified");
    if !verified.exists() || std::fs::metadata(&local).map(|m| m.len()).ok() != Some(f.size) {
        let _ = std::fs::remove_file(&verified);
        hub.download(repo, rev, &f, &local)?;
        touch(&verified)?;
    }
    let args = ConvertArgs {
        src: local,
        out: Some(out.clone()),
        quant: a.quant,
        group_size: a.group_size,
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
    install(repo, &out, staging, dest)
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
    }
}
