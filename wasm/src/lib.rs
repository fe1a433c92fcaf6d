//! colibri-wasm: the engine in a browser worker. A thin wasm-bindgen facade ([`Engine`])
//! over colibri-engine (CPU or WebGPU backend), plus the browser I/O: fetch and HTTP Range from the helper,
//! and the persistent OPFS expert tier. Errors cross into JavaScript as `JsError`.

#[cfg(target_arch = "wasm32")]
mod backend;
#[cfg(target_arch = "wasm32")]
mod browser_source;
#[cfg(target_arch = "wasm32")]
mod disk;
#[cfg(target_arch = "wasm32")]
mod engine;
#[cfg(target_arch = "wasm32")]
mod idb;
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
