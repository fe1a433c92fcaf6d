//! Every WGSL kernel in shaders/ parses and validates with naga, preceded by the
//! preludes its header names ("Preludes: common/arith.wgsl, ..."). Needs no GPU and no
//! feature: part of every plain `cargo test`.

use std::path::{Path, PathBuf};

fn shaders_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shaders")
}

/// The prelude files named on the kernel header's "Preludes:" line.
fn preludes(src: &str) -> Vec<String> {
    src.lines()
        .take_while(|l| l.starts_with("//"))
        .find_map(|l| l.trim_start_matches('/').trim().strip_prefix("Preludes:").map(str::to_string))
        .map(|list| {
            list.split(&[',', '('][..])
                .map(|s| s.trim().trim_end_matches('.').to_string())
                .filter(|s| s.ends_with(".wgsl"))
                .collect()
        })
        .unwrap_or_default()
}

fn validate(name: &str, source: &str) {
    let module =
        naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
}

fn kernel_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("shaders/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_kernel_validates_with_naga() {
    let dir = shaders_dir();
    let files = kernel_files(&dir);
    assert!(files.len() >= 10, "expected the kernels in {}, found {}", dir.display(), files.len());
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let body = std::fs::read_to_string(&path).unwrap();
        // The header documents the kernel: what it computes, bindings, workgroup, dispatch.
        let header: String = body.lines().take_while(|l| l.starts_with("//")).collect::<Vec<_>>().join("\n");
        for word in ["Bindings:", "Workgroup", "Dispatch"] {
            assert!(header.contains(word), "{name}: header comment lacks {word:?}");
        }
        assert_eq!(body.matches("@compute").count(), 1, "{name}: one kernel per file");
        let mut source = String::new();
        for p in preludes(&body) {
            source.push_str(
                &std::fs::read_to_string(dir.join(&p)).unwrap_or_else(|e| panic!("{name}: prelude {p}: {e}")),
            );
            source.push('\n');
        }
        source.push_str(&body);
        validate(&name, &source);
    }
}

#[test]
fn arith_constants_are_the_cpu_constants() {
    // shaders/common/arith.wgsl spells math::exp's f32 constants as bit patterns; they
    // must be the bits Rust computes for the same literals.
    let src = std::fs::read_to_string(shaders_dir().join("common/arith.wgsl")).unwrap();
    let consts: [(&str, f32); 10] = [
        ("log2e", std::f32::consts::LOG2_E),
        ("ln2_hi", 0.693_359_4),
        ("ln2_lo", -2.121_944_4e-4),
        ("1/6", 1.0 / 6.0),
        ("1/24", 1.0 / 24.0),
        ("1/120", 1.0 / 120.0),
        ("1/720", 1.0 / 720.0),
        ("1/5040", 1.0 / 5040.0),
        ("overflow", 88.722_83),
        ("underflow", -87.336_54),
    ];
    for (name, v) in consts {
        let lit = format!("0x{:08x}u", v.to_bits());
        assert!(src.contains(&lit), "arith.wgsl lacks {name} = {lit}");
    }
}
