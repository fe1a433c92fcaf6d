//! Dense weights streamed from a converted model's data file into GPU buffers
//! (`colibri_engine::gpu::stream`, what the browser's WebGPU backend does): the same
//! logits, bit for bit, as the upload from memory on every attention kind (GQA, MLA with
//! interleaved RoPE rows, Gated DeltaNet with its regrouped rows and output gate,
//! gpt_oss's sinks and biases), in chunks far smaller than a tensor and row blocks far
//! smaller than a matrix; a corrupted tensor is an error; the CPU refuses such a model.
//! Skipped with a printed reason when there is no Vulkan adapter, unless
//! COLIBRI_REQUIRE_GPU=1.
#![cfg(feature = "wgpu")]

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::experts::source::{ByteSource, FileSource};
use colibri_engine::gpu::stream::DenseStream;
use colibri_engine::gpu::{GpuContext, GpuModel, GpuOptions};
use colibri_engine::model::open::{Container, ModelDir};
use colibri_engine::Logits;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// A GPU context whose storage bindings are `cap` bytes at most (matrices split into
/// many row blocks), or None (with the reason printed) where there is no adapter.
fn gpu(cap: u64) -> Option<Arc<GpuContext>> {
    match GpuContext::new_blocking() {
        Ok(mut c) => {
            c.set_binding_cap(cap);
            Some(Arc::new(c))
        }
        Err(e) if std::env::var("COLIBRI_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("COLIBRI_REQUIRE_GPU=1 but no GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// `coli convert` of fixture `name` into a fresh directory.
fn convert(name: &str, quant: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("coli-gpu-stream-{name}-{quant}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("convert")
        .arg(fixture(name))
        .arg("-o")
        .arg(&dst)
        .args(["--quant", quant])
        .output()
        .unwrap();
    assert!(out.status.success(), "convert {name}: {}", String::from_utf8_lossy(&out.stderr));
    dst
}

fn open(dir: &Path) -> (Container, Arc<FileSource>) {
    let (c, data) = ModelDir::open(dir, false).unwrap().into_container().unwrap();
    (c, Arc::new(data))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const IDS: [u32; 6] = [5, 17, 3, 42, 7, 99];

#[test]
fn streamed_dense_weights_give_the_bits_of_the_upload_from_memory() {
    for (name, quant) in [
        ("qwen3_moe", "int4"),
        ("deepseek_v3", "int8"),
        ("qwen3_next", "int4"),
        ("gpt_oss", "int8"),
        ("mixtral", "f32"),
    ] {
        let Some(ctx) = gpu(32 << 10) else { return };
        let dir = convert(name, quant);
        let (container, data) = open(&dir);
        let model = ModelDir::open(&dir, false).unwrap().load(CacheOptions::default()).unwrap();
        let largest = Cell::new(0usize);
        let read = |at: u64, buf: &mut [u8]| {
            largest.set(largest.get().max(buf.len()));
            data.read_at(at, buf)
        };
        let hollow = container.load_elsewhere(&read, data.clone(), CacheOptions::default()).unwrap();
        assert!(model.dense_in_memory() && !hollow.dense_in_memory());
        // The placeholders' model runs on the GPU only: the CPU says so, without a panic.
        let e = hollow.forward(&mut hollow.new_session(), &IDS, Logits::Last).unwrap_err().to_string();
        assert!(e.contains("GPU backend only"), "{name}: {e}");
        let small_reads = largest.get();

        // One token per step: activations stay under the small binding cap.
        let steps = |gm: &GpuModel<&colibri_engine::Model>| -> Vec<f32> {
            let mut s = gm.new_session();
            IDS.iter().flat_map(|&id| gm.forward_blocking(&mut s, &[id], Logits::Last).unwrap()).collect()
        };
        let want = steps(&GpuModel::new(&model, ctx.clone(), GpuOptions::default()).unwrap());
        let chunk = 1000;
        let stream = DenseStream::new(&container.manifest, &read, "test").with_chunk(chunk);
        let gm = GpuModel::new_streamed(&hollow, ctx.clone(), GpuOptions::default(), &stream).unwrap();
        let got = steps(&gm);
        assert!(bits(&got) == bits(&want), "{name} {quant}: streamed weights give other logits");
        // Every weight matrix went through the stream, never more than a chunk at a time.
        let dense: u64 = container
            .manifest
            .dense
            .tensors
            .iter()
            .filter(|t| !colibri_engine::format::decoded_at_load(t))
            .map(|t| t.length)
            .sum();
        assert!(stream.bytes_read() >= dense, "{name}: {} of {dense} bytes streamed", stream.bytes_read());
        assert_eq!(stream.largest_read(), chunk, "{name}");
        assert!(largest.get() <= chunk.max(small_reads), "{name}: a read of {} bytes", largest.get());
        assert!(gm.dense_bytes() >= dense, "{name}: {} GPU bytes for {dense}", gm.dense_bytes());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_corrupted_dense_tensor_is_an_error_not_a_model() {
    let Some(ctx) = gpu(u64::MAX) else { return };
    let dir = convert("qwen3_moe", "int8");
    let (container, data) = open(&dir);
    let read = |at: u64, buf: &mut [u8]| data.read_at(at, buf);
    let hollow = container.load_elsewhere(&read, data.clone(), CacheOptions::default()).unwrap();
    // One flipped byte in the middle of each weight matrix as it streams by.
    for t in container.manifest.dense.tensors.iter().filter(|t| !colibri_engine::format::decoded_at_load(t)).take(3) {
        let bad = t.offset + t.length / 2;
        let corrupt = |at: u64, buf: &mut [u8]| {
            data.read_at(at, buf)?;
            if (at..at + buf.len() as u64).contains(&bad) {
                buf[(bad - at) as usize] ^= 1;
            }
            Ok(())
        };
        let stream = DenseStream::new(&container.manifest, &corrupt, "test").with_chunk(4096);
        let e = GpuModel::new_streamed(&hollow, ctx.clone(), GpuOptions::default(), &stream)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("checksum mismatch") && e.contains(&t.name), "{}: {e}", t.name);
    }
    // A small tensor read at load is checked there.
    let norm = container.manifest.dense.tensors.iter().find(|t| colibri_engine::format::decoded_at_load(t)).unwrap();
    let corrupt = |at: u64, buf: &mut [u8]| {
        data.read_at(at, buf)?;
        if (at..at + buf.len() as u64).contains(&norm.offset) {
            buf[(norm.offset - at) as usize] ^= 1;
        }
        Ok(())
    };
    let e = container.load_elsewhere(&corrupt, data.clone(), CacheOptions::default()).err().unwrap().to_string();
    assert!(e.contains("checksum mismatch") && e.contains(&norm.name), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
