//! Embeds the web app (web/*) and the built browser engine (web/pkg/** and
//! web/pkg-threads/**, made by tools/build-web.sh) into the `coli` binary, so the helper
//! is one file to ship.
//! Files that do not exist yet are simply not embedded; the helper then says how to
//! build them.
//!
//! Also embeds the demo model (models/demo, [`demo`]) and names the commit `coli` is built
//! from, for `coli --version` ([`commit`]).

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "md" | "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Adds the files of `dir` (and, with `deep`, of its subfolders: wasm-bindgen puts
/// snippets under snippets/NAME/) as (URL path, content type, absolute path).
fn add_dir(dir: &Path, prefix: &str, deep: bool, entries: &mut Vec<(String, &'static str, std::path::PathBuf)>) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut paths: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for f in paths {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.starts_with('.') {
            continue;
        }
        if f.is_dir() {
            if deep {
                add_dir(&f, &format!("{prefix}{name}/"), true, entries);
            }
            continue;
        }
        if name.ends_with(".d.ts") || name == "package.json" {
            continue;
        }
        let abs = f.canonicalize().unwrap_or(f.clone());
        entries.push((format!("{prefix}{name}"), content_type(&name), abs));
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// `COLI_BUILD_COMMIT` for the binary: the environment's `COLI_BUILD_COMMIT` (a build from
/// a source archive without git), else git's short hash of HEAD with its date, else
/// "unknown commit" (no git, or not a checkout). Rebuilt when HEAD moves.
fn commit() {
    println!("cargo:rerun-if-env-changed=COLI_BUILD_COMMIT");
    let commit = match std::env::var("COLI_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => match git(&["log", "-1", "--format=%h %cs", "--abbrev=12"]) {
            Some(c) => format!("commit {c}"),
            None => "unknown commit".to_string(),
        },
    };
    // Watch what moves with a commit or a checkout: HEAD, the branch it names, packed refs
    // (only files that exist: a missing one would rerun this script on every build).
    let dirs =
        (git(&["rev-parse", "--absolute-git-dir"]), git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]));
    if let (Some(dir), Some(common)) = dirs {
        let (dir, common) = (PathBuf::from(dir), PathBuf::from(common));
        let mut watch = vec![dir.join("HEAD"), common.join("packed-refs")];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(common.join(branch));
        }
        for p in watch.iter().filter(|p| p.is_file()) {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    println!("cargo:rustc-env=COLI_BUILD_COMMIT={commit}");
}

fn main() {
    commit();
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let web = Path::new(&manifest).join("../web");
    println!("cargo:rerun-if-changed={}", web.display());
    let mut entries = Vec::new();
    add_dir(&web, "", false, &mut entries);
    for pkg in ["pkg", "pkg-threads"] {
        add_dir(&web.join(pkg), &format!("{pkg}/"), true, &mut entries);
    }
    let mut out = String::from("/// (URL path without the leading slash, content type, bytes), embedded at build time.\npub const ASSETS: &[(&str, &str, &[u8])] = &[\n");
    for (path, ctype, abs) in &entries {
        let _ = writeln!(out, "    ({path:?}, {ctype:?}, include_bytes!({:?})),", abs.display().to_string());
    }
    out.push_str("];\n");
    let dst = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("web_assets.rs");
    std::fs::write(dst, out).expect("write web_assets.rs");
    demo(Path::new(&manifest));
}

/// The demo model (models/demo: a converted colibri model of about 4 MB) embedded, so that
/// `coli` can install it wherever it is copied (crate::paths::builtin_demo).
fn demo(manifest: &Path) {
    let dir = manifest.join("../models/demo");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.retain(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.starts_with('.') && !n.starts_with("usage.json"))
    });
    files.sort();
    let mut out = String::from(
        "/// The demo model's files (name, bytes), embedded at build time from models/demo.
pub const DEMO_FILES: &[(&str, &[u8])] = &[
",
    );
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let abs = f.canonicalize().unwrap_or(f.clone());
        println!("cargo:rerun-if-changed={}", abs.display());
        let _ = writeln!(out, "    ({name:?}, include_bytes!({:?})),", abs.display().to_string());
    }
    out.push_str("];\n");
    let dst = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("demo_model.rs");
    std::fs::write(dst, out).expect("write demo_model.rs");
}
