//! What the engine's wasm memory must hold, checked before a model loads. A wasm32 module
//! addresses at most 4 GiB, and its memory never shrinks: on the CPU backend the dense
//! weights, the RAM expert tier and the working memory (activations, KV cache, tokenizer)
//! all live in it. On WebGPU the dense weights go to GPU buffers instead (gpu::stream),
//! so there only the RAM tier and the working memory count.

/// Bytes a wasm32 memory can address (65536 pages of 64 KiB).
pub const WASM32_BYTES: u64 = 4 << 30;

/// Kept for everything but weights and experts: the tokenizer, activations, the KV
/// cache of a moderate context, the allocator's slack.
pub const RESERVE_BYTES: u64 = 256 << 20;

/// `bytes` as "3.5 GiB" / "512 MiB".
pub fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", (bytes as f64 / (1u64 << 20) as f64).ceil())
    }
}

/// Whether the CPU backend can hold a model of `dense` bytes of dense weights with a RAM
/// expert tier of `ram` bytes in wasm32's memory; if not, an error naming the sizes and
/// what to do instead.
pub fn cpu_fit(dense: u64, ram: u64) -> Result<(), String> {
    let need = dense.saturating_add(ram).saturating_add(RESERVE_BYTES);
    if need <= WASM32_BYTES {
        return Ok(());
    }
    let room = WASM32_BYTES - RESERVE_BYTES;
    let instead = if dense <= room {
        format!("a RAM tier of at most {} (load({{ramBytes}})), or", size(room - dense))
    } else {
        "a smaller quantization (coli convert --quant int4), or".to_string()
    };
    Err(format!(
        "the CPU backend cannot hold this model: its dense weights ({}) and RAM expert tier ({}) with {} of working memory need {}, more than the {} a wasm32 module can address; use {instead} the WebGPU backend (load({{backend: \"webgpu\"}})), whose dense weights go to GPU buffers",
        size(dense),
        size(ram),
        size(RESERVE_BYTES),
        size(need),
        size(WASM32_BYTES),
    ))
}

/// The wasm memory's size now, in bytes: its peak too, since it never shrinks.
#[cfg(target_arch = "wasm32")]
pub fn wasm_bytes() -> u64 {
    core::arch::wasm32::memory_size(0) as u64 * 65536
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn models_that_fit_pass_and_the_limit_is_exact() {
        assert!(cpu_fit(GIB, 512 * MIB).is_ok());
        assert!(cpu_fit(WASM32_BYTES - RESERVE_BYTES - 512 * MIB, 512 * MIB).is_ok());
        assert!(cpu_fit(WASM32_BYTES - RESERVE_BYTES - 512 * MIB + 1, 512 * MIB).is_err());
    }

    #[test]
    fn too_large_names_the_sizes_and_the_way_out() {
        // DeepSeek-V3's dense part at int4 is about 10 GB.
        let e = cpu_fit(10 * GIB, 512 * MIB).unwrap_err();
        assert!(e.contains("10.0 GiB") && e.contains("512 MiB") && e.contains("4.0 GiB"), "{e}");
        assert!(e.contains("webgpu") && e.contains("--quant int4"), "{e}");
        // Dense weights that fit alone: a smaller RAM tier is the first way out.
        let e = cpu_fit(3 * GIB, GIB).unwrap_err();
        assert!(e.contains("3.0 GiB") && e.contains("1.0 GiB") && e.contains("at most 768 MiB"), "{e}");
        assert!(cpu_fit(3 * GIB, 768 * MIB).is_ok());
        assert!(cpu_fit(u64::MAX, u64::MAX).is_err(), "no overflow");
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(512 * MIB), "512 MiB");
        assert_eq!(size(3 * GIB / 2), "1.5 GiB");
        assert_eq!(size(1), "1 MiB");
    }
}
