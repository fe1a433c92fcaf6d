//! Embeds the web app (web/*) and the built browser engine (web/pkg/*, made by
//! tools/build-web.sh) into the `coli` binary, so the helper is one file to ship.
//! Files that do not exist yet are simply not embedded; the helper then says how to
//! build them.

use std::fmt::Write;
use std::path::Path;

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

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let web = Path::new(&manifest).join("../web");
    println!("cargo:rerun-if-changed={}", web.display());
    let mut entries = Vec::new();
    for (dir, prefix) in [(web.clone(), ""), (web.join("pkg"), "pkg/")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
        files.sort();
        for f in files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.starts_with('.') || name.ends_with(".d.ts") || name == "package.json" {
                continue;
            }
            let abs = f.canonicalize().unwrap_or(f.clone());
            entries.push((format!("{prefix}{name}"), content_type(&name), abs));
        }
    }
    let mut out = String::from("/// (URL path without the leading slash, content type, bytes), embedded at build time.\npub const ASSETS: &[(&str, &str, &[u8])] = &[\n");
    for (path, ctype, abs) in &entries {
        let _ = writeln!(out, "    ({path:?}, {ctype:?}, include_bytes!({:?})),", abs.display().to_string());
    }
    out.push_str("];\n");
    let dst = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("web_assets.rs");
    std::fs::write(dst, out).expect("write web_assets.rs");
}
