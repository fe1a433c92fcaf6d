//! Hybrid expert placement (engine/src/gpu/hybrid.rs) goes by where an expert's bytes are
//! held, not only by the RAM tiers: with no RAM tier, experts whose byte source holds them
//! locally (`ByteSource::holds_locally`, what the browser's disk tier answers) run on the
//! CPU when the GPU pool lacks them, each read once per layer pass, with the bits of the
//! run without hybrid placement; a source that holds nothing keeps them on the GPU.
//! Skipped with a printed reason when there is no Vulkan adapter, unless
//! COLIBRI_REQUIRE_GPU=1.
#![cfg(feature = "wgpu")]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::experts::source::{ByteSource, FileSource};
use colibri_engine::gpu::{GpuContext, GpuModel, GpuOptions, Hybrid};
use colibri_engine::model::open::ModelDir;
use colibri_engine::tensor::Bytes;
use colibri_engine::Logits;

/// The converted file, saying whether it holds every expert locally.
struct Held {
    file: Arc<FileSource>,
    local: bool,
}

impl ByteSource for Held {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> colibri_engine::Result<()> {
        self.file.read_at(offset, buf)
    }
    fn name(&self) -> String {
        self.file.name()
    }
    fn holds_locally(&self, _offset: u64, _len: usize) -> bool {
        self.local
    }
}

#[test]
fn experts_held_by_the_byte_source_run_on_the_cpu_without_a_ram_tier() {
    let ctx = match GpuContext::new_blocking() {
        Ok(c) => Arc::new(c),
        Err(e) if std::env::var("COLIBRI_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("COLIBRI_REQUIRE_GPU=1 but no GPU: {e}")
        }
        Err(e) => return eprintln!("skipping GPU test: {e}"),
    };
    let dir = std::env::temp_dir().join(format!("coli-gpu-hybrid-local-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe");
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("convert")
        .arg(&src)
        .arg("-o")
        .arg(&dir)
        .args(["--quant", "int4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "convert: {}", String::from_utf8_lossy(&out.stderr));
    let (container, file) = ModelDir::open(&dir, false).unwrap().into_container().unwrap();
    let m = &container.manifest;
    let mut dense = vec![0u8; m.dense.length as usize];
    file.read_at(m.dense.offset, &mut dense).unwrap();
    let file = Arc::new(file);
    // Room for two experts: every later miss is a candidate if it is held.
    let pool = 2 * m.experts.layers[0].experts[0].length + 64;
    let ids = [5u32, 17, 3, 42, 7, 99];
    let mut want: Option<Vec<u32>> = None;
    for (hybrid, local) in [(Hybrid::Off, true), (Hybrid::On, false), (Hybrid::On, true)] {
        let source = Arc::new(Held { file: file.clone(), local });
        let model = container.load(&Bytes::from_vec(dense.clone()), source, CacheOptions::with_ram(Some(0))).unwrap();
        let opts = GpuOptions { expert_pool_bytes: Some(pool), hybrid, ..Default::default() };
        let gm = GpuModel::new(&model, ctx.clone(), opts).unwrap();
        let mut s = gm.new_session();
        let mut got = gm.forward_blocking(&mut s, &ids, Logits::All).unwrap();
        for id in [11u32, 200, 3] {
            got.extend(gm.forward_blocking(&mut s, &[id], Logits::Last).unwrap());
        }
        let (h, p, c) = (gm.hybrid_stats(), gm.pool_stats(), model.experts.cache_stats().unwrap());
        eprintln!("{hybrid:?} local {local}: {h:?} pool misses {} cache misses {}", p.misses, c.misses);
        let what = format!("hybrid {hybrid:?}, held {local}");
        if hybrid == Hybrid::On && local {
            assert!(h.cpu_experts > 0 && h.gpu_experts > 0, "{what}: {h:?}");
        } else {
            assert_eq!(h.cpu_experts, 0, "{what}: {h:?}");
        }
        // Nothing stays in RAM: each read is a miss, one per CPU use and one per upload.
        assert_eq!(c.misses, h.cpu_experts + p.misses, "{what}: each expert read once");
        let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        match &want {
            None => want = Some(bits),
            // Where each expert ran changes no bit on lavapipe (docs/kernels.md).
            Some(w) if ctx.adapter_name.contains("llvmpipe") => assert!(bits == *w, "{what}: other logits"),
            Some(_) => {}
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
