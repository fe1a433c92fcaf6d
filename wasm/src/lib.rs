//! colibri-wasm: the engine in a browser worker. A thin wasm-bindgen facade (`Engine`)
//! over colibri-engine (CPU or WebGPU backend), plus the browser I/O: fetch and HTTP Range from the helper,
//! and the persistent OPFS expert tier. Errors cross into JavaScript as `Error`s with the
//! engine's stable `code` (`error.rs`).

#[cfg(target_arch = "wasm32")]
mod backend;
#[cfg(target_arch = "wasm32")]
mod browser_source;
// The disk tier's policy: pure, so its tests run natively.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
mod budget;
#[cfg(target_arch = "wasm32")]
mod dense;
#[cfg(target_arch = "wasm32")]
mod dense_file;
#[cfg(target_arch = "wasm32")]
mod disk;
#[cfg(target_arch = "wasm32")]
mod engine;
#[cfg(target_arch = "wasm32")]
mod error;
#[cfg(target_arch = "wasm32")]
mod idb;
// What a turn writes to the conversation's cache file: pure, so its tests run natively.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
mod kv_file;
// What wasm memory must hold: pure, so its tests run natively.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
mod memory;
mod names;
#[cfg(target_arch = "wasm32")]
mod net;
#[cfg(target_arch = "wasm32")]
mod opfs;

#[cfg(target_arch = "wasm32")]
pub use engine::Engine;

/// Starts the engine's CPU thread pool on `n` Web Workers sharing this module's memory
/// (JavaScript: `await initThreadPool(n)`, once, before the engine computes). Only in the
/// threaded build (feature `threads`); without a pool the kernels run on the calling thread.
#[cfg(all(target_arch = "wasm32", feature = "threads"))]
pub use wasm_bindgen_rayon::init_thread_pool;

/// How the relaxed-SIMD one-position kernels sum their products on this CPU
/// (`qdot::wasm_form`): measured once per module instance, the first time it is asked
/// (an engine's load), as `{"form": "16-bit" | "32-bit", "ms32", "ms16"}` (the two forms'
/// best timings); null in builds without relaxed SIMD. Both forms give the same bits.
#[cfg(target_arch = "wasm32")]
pub(crate) fn kernel_form() -> serde_json::Value {
    #[cfg(target_feature = "relaxed-simd")]
    {
        static FORM: std::sync::OnceLock<(bool, f64, f64)> = std::sync::OnceLock::new();
        let (w16, ms32, ms16) = *FORM.get_or_init(|| colibri_engine::qdot::wasm_form::calibrate(&net::now_ms));
        serde_json::json!({"form": if w16 { "16-bit" } else { "32-bit" }, "ms32": ms32, "ms16": ms16})
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    serde_json::Value::Null
}

/// Compares every dot-product path this build runs (wasm SIMD128, relaxed SIMD in the
/// threaded build) with the scalar reference, bit for bit, on rows with edge cases
/// (JavaScript: `kernelSelfCheck()` returns how many products agreed, or throws the first
/// difference). The browser tests call it on both builds.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(js_name = kernelSelfCheck)]
pub fn kernel_self_check() -> Result<u32, wasm_bindgen::JsError> {
    colibri_engine::qdot::check::check_paths().map(|n| n as u32).map_err(|e| wasm_bindgen::JsError::new(&e))
}
