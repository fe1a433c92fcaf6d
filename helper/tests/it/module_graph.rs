//! The module graph of the three crates, read from their sources: which module refers to
//! which (`crate::a::b`, `super::x`, `use crate::{a, b}`), lifted to siblings (an arrow from
//! `qdot::tile` to `kernels` is an arrow from `qdot` to `kernels`, the two children of the
//! crate that hold them). Two checks:
//! - **import loops**: siblings that reach each other (strongly connected components of the
//!   sibling graph under one parent);
//! - **back-up arrows**: an arrow from a lower floor of the engine to a higher one
//!   (`FLOORS`: the data path, format at the bottom, gpu at the top).
//!
//! Both were ratchets: `KNOWN_LOOPS` and `KNOWN_UP` listed what existed when this check was
//! written (issue #31's audit: seven loops, four up-arrows), and shrank as they were fixed;
//! both are empty now, so any import loop or back-up arrow fails. Run alone with
//! `cargo test -p colibri-helper --test it module_graph -- --nocapture` to see the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The engine's floors, bottom first: a module may refer to its own floor and those below.
const FLOORS: &[&[&str]] = &[
    &["error", "math", "fsio", "hugemem", "memlimit", "par", "tensor"],
    &["format"],
    &["qdot"],
    &["kernels"],
    &["experts"],
    &["model"],
    &["sampler", "tokenizer"],
    &["generate"],
    &["gpu"],
];

/// Import loops still allowed: "crate: a <-> b <-> ..." (none since issue #31).
const KNOWN_LOOPS: &[&str] = &[];

/// Back-up arrows still allowed: "engine: from -> to" (none since issue #31).
const KNOWN_UP: &[&str] = &[];

type Module = Vec<String>;

struct Crate {
    name: &'static str,
    root: PathBuf,
}

fn crates() -> Vec<Crate> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vec![
        Crate { name: "engine", root: ws.join("engine/src") },
        Crate { name: "helper", root: ws.join("helper/src") },
        Crate { name: "wasm", root: ws.join("wasm/src") },
    ]
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir).expect("read src dir").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module a file defines: `lib.rs` / `main.rs` the crate root, `a/mod.rs` and `a.rs`
/// module `a`, `a/b.rs` module `a::b`. Files that are not modules of their own (included
/// with `#[path]` or `include!`) are treated as what their path says, which is what a
/// reader takes them for too.
fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).expect("under root");
    let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("file name");
    let stem = last.trim_end_matches(".rs");
    let root_file = parts.is_empty() && matches!(stem, "lib" | "main");
    if stem != "mod" && !root_file {
        parts.push(stem.to_string());
    }
    parts
}

/// The source without comments, string and char literals (their text never imports).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && (i == 0 || !is_ident(b[i - 1])) {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a): skip only the former.
            let close = if b.get(i + 1) == Some(&b'\\') {
                (i + 2..b.len().min(i + 12)).find(|&k| b[k] == b'\'')
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(k) => {
                    out.push_str("' '");
                    i = k + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            // Keep multi-byte UTF-8 intact.
            let ch = src[i..].chars().next().expect("char");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every path a file names: `crate::...` and `super::...` chains, `use` groups expanded,
/// each resolved to absolute segments from the crate root.
fn referenced_paths(code: &str, module: &Module) -> Vec<Module> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    // Inline modules (`mod tests { ... }`) shift what `super` means: track their depth.
    let mut depth = 0usize;
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == b'}' {
            if inline_mods.last() == Some(&depth) {
                inline_mods.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        if !is_ident(c) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        let word = &code[start..i];
        if word == "mod" {
            // `mod name {` opens an inline module.
            let rest = code[i..].trim_start();
            let name_len = rest.bytes().take_while(|&c| is_ident(c)).count();
            if name_len > 0 && rest[name_len..].trim_start().starts_with('{') {
                inline_mods.push(depth + 1);
            }
            continue;
        }
        if word != "crate" && word != "super" {
            continue;
        }
        // The base module the chain starts from.
        let mut base: Module = if word == "crate" {
            Vec::new()
        } else {
            // `super` from inside an inline module is the file's own module first.
            let mut m = module.clone();
            if inline_mods.is_empty() {
                m.pop();
            }
            m
        };
        let mut j = i;
        loop {
            if !code[j..].starts_with("::") {
                break;
            }
            j += 2;
            if code[j..].starts_with('{') {
                let end = matching_brace(b, j);
                for item in split_group(&code[j + 1..end]) {
                    let mut p = base.clone();
                    p.extend(item);
                    out.push(p);
                }
                j = end + 1;
                base.clear();
                base.push("\u{0}group".into());
                break;
            }
            let s = j;
            while j < b.len() && is_ident(b[j]) {
                j += 1;
            }
            if s == j {
                break;
            }
            let seg = &code[s..j];
            if seg == "super" {
                base.pop();
            } else {
                base.push(seg.to_string());
            }
        }
        if base.first().map(|s| s.as_str()) != Some("\u{0}group") {
            out.push(base);
        }
        i = j;
    }
    out
}

fn matching_brace(b: &[u8], open: usize) -> usize {
    let mut d = 0;
    for (k, &c) in b.iter().enumerate().skip(open) {
        if c == b'{' {
            d += 1;
        } else if c == b'}' {
            d -= 1;
            if d == 0 {
                return k;
            }
        }
    }
    b.len() - 1
}

/// `a::b, c::{d, e}, f as g, self` -> [[a, b], [c, d], [c, e], [f], []].
fn split_group(s: &str) -> Vec<Module> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for ch in s.chars() {
        match ch {
            '{' => {
                depth += 1;
                cur.push(ch)
            }
            '}' => {
                depth -= 1;
                cur.push(ch)
            }
            ',' if depth == 0 => items.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    items.push(cur);
    let mut out = Vec::new();
    for item in items {
        let item = item.split(" as ").next().unwrap_or("").trim().to_string();
        if item.is_empty() {
            continue;
        }
        if let Some(open) = item.find('{') {
            let prefix: Module = path_segments(&item[..open]);
            let close = item.rfind('}').unwrap_or(item.len());
            for sub in split_group(&item[open + 1..close]) {
                let mut p = prefix.clone();
                p.extend(sub);
                out.push(p);
            }
        } else {
            out.push(path_segments(&item));
        }
    }
    out
}

fn path_segments(s: &str) -> Module {
    s.split("::").map(|x| x.trim()).filter(|x| !x.is_empty() && *x != "self" && *x != "*").map(String::from).collect()
}

/// Lift an arrow between two modules to the two siblings under their common ancestor.
fn lift(from: &Module, to: &Module) -> Option<(Module, String, String)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None; // an ancestor or a descendant: a module and its parts
    }
    Some((from[..common].to_vec(), from[common].clone(), to[common].clone()))
}

/// sibling graphs: parent module -> (from child -> {to children}).
type Graphs = BTreeMap<Module, BTreeMap<String, BTreeSet<String>>>;

fn graph_of(krate: &Crate, witnesses: &mut BTreeMap<String, String>) -> Graphs {
    let mut files = Vec::new();
    rs_files(&krate.root, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&krate.root, f)).collect();
    let mut graphs = Graphs::new();
    for f in &files {
        let module = module_of(&krate.root, f);
        let src = fs::read_to_string(f).expect("read source");
        for path in referenced_paths(&code_only(&src), &module) {
            // The longest prefix that is a module (the rest names an item in it).
            let target = (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains(p));
            let Some(target) = target else { continue };
            if let Some((parent, a, b)) = lift(&module, &target) {
                let key = format!("{}: {}{} -> {}", krate.name, prefix(&parent), a, b);
                witnesses.entry(key).or_insert_with(|| f.strip_prefix(&krate.root).unwrap().display().to_string());
                graphs.entry(parent).or_default().entry(a).or_default().insert(b);
            }
        }
    }
    graphs
}

fn prefix(parent: &Module) -> String {
    parent.iter().map(|s| format!("{s}::")).collect()
}

/// Strongly connected components with more than one member (Tarjan's algorithm).
fn loops(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.g.get(v) {
            for w in next {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t =
        T { g, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v.as_str());
        }
    }
    t.out
}

fn floor(name: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&name))
}

#[test]
fn no_new_import_loop_and_no_new_backup_arrow() {
    let mut witnesses = BTreeMap::new();
    let mut found_loops = BTreeSet::new();
    let mut found_up = BTreeSet::new();
    for krate in crates() {
        let graphs = graph_of(&krate, &mut witnesses);
        for (parent, g) in &graphs {
            for comp in loops(g) {
                let names: Vec<String> = comp.iter().map(|c| format!("{}{c}", prefix(parent))).collect();
                found_loops.insert(format!("{}: {}", krate.name, names.join(" <-> ")));
            }
        }
        if krate.name == "engine" {
            let top = graphs.get(&Vec::new()).cloned().unwrap_or_default();
            for (from, tos) in &top {
                for to in tos {
                    let (Some(a), Some(b)) = (floor(from), floor(to)) else {
                        panic!("engine module {from} or {to} has no floor in FLOORS: place it");
                    };
                    if b > a {
                        found_up.insert(format!("engine: {from} -> {to}"));
                    }
                }
            }
        }
    }
    for l in &found_loops {
        println!("loop  {l}");
    }
    for u in &found_up {
        println!("up    {u}   (e.g. {})", witnesses.get(u).map(String::as_str).unwrap_or("?"));
    }
    let known_loops: BTreeSet<String> = KNOWN_LOOPS.iter().map(|s| s.to_string()).collect();
    let known_up: BTreeSet<String> = KNOWN_UP.iter().map(|s| s.to_string()).collect();
    let new_loops: Vec<_> = found_loops.difference(&known_loops).collect();
    let gone_loops: Vec<_> = known_loops.difference(&found_loops).collect();
    let new_up: Vec<_> = found_up.difference(&known_up).collect();
    let gone_up: Vec<_> = known_up.difference(&found_up).collect();
    assert!(new_loops.is_empty(), "new import loops: {new_loops:?}");
    assert!(new_up.is_empty(), "new back-up arrows between the engine's floors: {new_up:?}");
    assert!(gone_loops.is_empty(), "loops fixed: remove them from KNOWN_LOOPS: {gone_loops:?}");
    assert!(gone_up.is_empty(), "arrows fixed: remove them from KNOWN_UP: {gone_up:?}");
}

#[test]
fn the_parser_sees_what_a_reader_sees() {
    let m: Module = vec!["model".into(), "mla".into()];
    let code = code_only(
        "use crate::{format::kv, qdot::{x86, Tile as T}};\n// crate::gpu::x\nlet s = \"crate::gpu\";\n\
         use super::attention::Attn;\nmod tests { use super::*; fn f() { super::super::rope::go(); } }\n",
    );
    let got = referenced_paths(&code, &m);
    let want: Vec<Module> = vec![
        vec!["format".into(), "kv".into()],
        vec!["qdot".into(), "x86".into()],
        vec!["qdot".into(), "Tile".into()],
        vec!["model".into(), "attention".into(), "Attn".into()],
        vec!["model".into(), "mla".into()],
        vec!["model".into(), "rope".into(), "go".into()],
    ];
    assert_eq!(got, want);
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string(), "d".to_string()]));
    assert_eq!(loops(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    assert_eq!(
        lift(&vec!["qdot".into(), "tile".into()], &vec!["kernels".into()]),
        Some((vec![], "qdot".into(), "kernels".into()))
    );
    assert_eq!(lift(&vec!["model".into(), "mla".into()], &vec!["model".into()]), None);
}
