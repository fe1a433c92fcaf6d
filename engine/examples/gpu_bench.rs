//! GPU backend vs CPU backend on the transformers fixtures, in one run: ULP distance of
//! the teacher-forced logits, greedy agreement, and decode tokens/s of each backend.
//! Prints one JSON record per fixture (and a summary line per fixture on stderr).
//!
//!     cargo run --release -p colibri-engine --features wgpu --example gpu_bench [-- DIR...]
//!
//! Without arguments it runs every directory under tests/fixtures.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use colibri_engine::generate::{generate_with, GenerateOptions};
use colibri_engine::gpu::{GpuContext, GpuModel, GpuOptions};
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::{Logits, Model};

fn ordinal(x: f32) -> i64 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        -((b & 0x7fff_ffff) as i64)
    } else {
        b as i64
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if dirs.is_empty() {
        for e in std::fs::read_dir(&root)? {
            let p = e?.path();
            if p.join("config.json").exists() {
                dirs.push(p);
            }
        }
        dirs.sort();
    }
    let ctx = Arc::new(GpuContext::new_blocking()?);
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    for dir in dirs {
        let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let model = Model::open_dir(&dir)?;
        let gpu = GpuModel::new(&model, ctx.clone(), GpuOptions::default())?;
        let vocab = model.cfg.vocab;
        // 48 teacher-forced positions of a fixed pseudo-random sequence.
        let ids: Vec<u32> = (0..48u64).map(|i| ((i * 2654435761 + 12345) % vocab as u64) as u32).collect();
        let cpu_logits = model.forward(&mut model.new_session(), &ids, Logits::All)?;
        let gpu_logits = gpu.forward_blocking(&mut gpu.new_session(), &ids, Logits::All)?;
        let d: Vec<u64> =
            cpu_logits.iter().zip(&gpu_logits).map(|(a, b)| (ordinal(*a) - ordinal(*b)).unsigned_abs()).collect();
        let max_ulp = d.iter().copied().max().unwrap_or(0);
        let mean_ulp = d.iter().sum::<u64>() as f64 / d.len().max(1) as f64;

        // Decode speed: 8-token prompt, 64 greedy tokens, timed after the first token.
        let prompt = &ids[..8];
        let opts =
            GenerateOptions { max_new_tokens: 64, sampler: SamplerConfig::default(), stop_ids: vec![], logprobs: None };
        let run = |forward: &mut dyn FnMut(&[u32]) -> colibri_engine::Result<Vec<f32>>| -> colibri_engine::Result<(Vec<u32>, f64)> {
            let mut first = None;
            let (out, _) = generate_with(forward, &[], prompt, model.cfg.max_positions, &opts, &mut |_| {
                first.get_or_insert_with(Instant::now);
                true
            })?;
            let decode = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
            Ok((out.clone(), (out.len() - 1) as f64 / decode.max(1e-9)))
        };
        let mut cs = model.new_session();
        let (cpu_ids, cpu_tps) = run(&mut |x| model.forward(&mut cs, x, Logits::Last))?;
        let mut gs = gpu.new_session();
        let (gpu_ids, gpu_tps) = run(&mut |x| gpu.forward_blocking(&mut gs, x, Logits::Last))?;
        let record = serde_json::json!({
            "bench": "gpu_vs_cpu",
            "fixture": name,
            "commit": commit,
            "adapter": ctx.adapter_name,
            "cpu_threads": colibri_engine::kernels::threads(),
            "logits": {"values": d.len(), "max_ulp": max_ulp, "mean_ulp": mean_ulp, "differing": d.iter().filter(|x| **x != 0).count()},
            "greedy_identical": cpu_ids == gpu_ids,
            "greedy_tokens": cpu_ids.len(),
            "decode_tokens_per_second": {"cpu": cpu_tps, "wgpu": gpu_tps},
            "expert_pool": format!("{:?}", gpu.pool_stats()),
        });
        eprintln!("{name}: max {max_ulp} ulp, mean {mean_ulp:.4} ulp, greedy identical {}, decode tok/s cpu {cpu_tps:.1} wgpu {gpu_tps:.1}", cpu_ids == gpu_ids);
        println!("{record}");
    }
    Ok(())
}
