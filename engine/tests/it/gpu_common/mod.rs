//! Shared by the GPU tests: one device per test binary, the skip/require policy, ULP
//! distances and a small deterministic random generator.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use colibri_engine::gpu::GpuContext;

/// The shared GPU context, or None (with the reason printed) when no adapter exists.
/// With COLIBRI_REQUIRE_GPU=1 (tools/test.sh, CI) a missing adapter fails the test.
pub fn gpu() -> Option<Arc<GpuContext>> {
    static CTX: OnceLock<Result<Arc<GpuContext>, String>> = OnceLock::new();
    match CTX.get_or_init(|| GpuContext::new_blocking().map(Arc::new).map_err(|e| e.to_string())) {
        Ok(c) => Some(c.clone()),
        Err(e) => {
            if std::env::var("COLIBRI_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("COLIBRI_REQUIRE_GPU=1 but no GPU: {e}");
            }
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// A second context whose integer matmuls use plain i32 arithmetic (qmatmul.wgsl) where
/// [`gpu`]'s use dot4I8Packed (qmatmul_dp4a.wgsl), so that tests compare both with the CPU.
pub fn gpu_without_dp4a() -> Option<Arc<GpuContext>> {
    static CTX: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CTX.get_or_init(|| {
        gpu()?;
        let mut c = GpuContext::new_blocking().ok()?;
        c.set_dp4a(false);
        Some(Arc::new(c))
    })
    .clone()
}

/// Position of x on the number line of f32s (+0 and -0 both at 0).
pub fn ordinal(x: f32) -> i64 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        -((b & 0x7fff_ffff) as i64)
    } else {
        b as i64
    }
}

/// How many representable f32s lie between a and b.
pub fn ulps(a: f32, b: f32) -> u64 {
    (ordinal(a) - ordinal(b)).unsigned_abs()
}

/// Max and mean ULP distance, and how many values differ at all.
pub fn ulp_stats(got: &[f32], want: &[f32]) -> (u64, f64, usize) {
    assert_eq!(got.len(), want.len());
    let (mut max, mut sum, mut differ) = (0u64, 0f64, 0usize);
    for (g, w) in got.iter().zip(want) {
        let d = ulps(*g, *w);
        max = max.max(d);
        sum += d as f64;
        differ += (d != 0) as usize;
    }
    (max, sum / got.len().max(1) as f64, differ)
}

/// Asserts bit-identical results, reporting the first few mismatches with their index.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<usize> = (0..got.len()).filter(|&i| ulps(got[i], want[i]) != 0).collect();
    if !bad.is_empty() {
        let show: Vec<String> = bad
            .iter()
            .take(5)
            .map(|&i| format!("[{i}] gpu {:e} cpu {:e} ({} ulp)", got[i], want[i], ulps(got[i], want[i])))
            .collect();
        panic!("{what}: {} of {} values differ: {}", bad.len(), got.len(), show.join(", "));
    }
}

pub struct Lcg(pub u64);

impl Lcg {
    /// Uniform in [-1, 1).
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn bits(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 32) as u32
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}
