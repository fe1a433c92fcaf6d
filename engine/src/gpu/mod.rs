//! The wgpu GPU backend: the same forward pass as [`crate::Model::forward`], on Vulkan
//! natively (Mesa's lavapipe in CI) and on WebGPU in the browser (wasm32).
//!
//! - [`GpuContext`]: device, queue, limits, the pipeline cache. [`GpuContext::new`] asks
//!   for an adapter; [`GpuContext::from_device`] takes a device the caller made (tests).
//! - [`GpuModel`]: dense weights resident in GPU buffers (split by rows to respect the
//!   binding limits; uploaded from memory, or streamed from the data file in bounded
//!   chunks by [`stream`]), routed experts uploaded on first use into an LRU pool, and
//!   [`GpuModel::forward`] mirroring `Model::forward`.
//! - Kernels: one WGSL file per kernel in `shaders/` (see [`kernels`]), written so the
//!   CPU's arithmetic is reproduced: math::dot's lane order, products rounded before
//!   they are added, math::exp ported literally, correctly rounded division and sqrt in
//!   integer arithmetic. docs/gpu.md explains the choices and the measured ULPs.
//! - Routing: router logits are computed and routed on the GPU by route.wgsl, which
//!   reproduces [`crate::model::moe::route`] (the one routing function) bit for bit; only
//!   the chosen (expert, weight) pairs are read back, because the host must fetch and
//!   upload the experts the pool lacks.
//!
//! Everything that waits on the GPU is `async` (futures without `Send` on wasm32);
//! native callers use the `*_blocking` wrappers, which poll the device.

mod backend;
pub mod buffers;
pub mod deltanet;
mod forward;
pub mod hybrid;
pub mod kernels;
mod lookahead;
mod mla;
pub mod model;
pub mod ops;
mod persist;
mod placement;
pub mod pool;
pub mod recorder;
pub mod stream;
pub mod v4;
pub mod v4_attn;
mod v4_model;
mod weights;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

pub use model::{GpuModel, GpuOptions, GpuSession};
pub use placement::{ExpertPlacement, Hybrid, HybridStats};

/// Runs a future to completion on native targets (the device is polled inside the
/// futures this module returns, so no executor is needed beyond this).
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    pollster::block_on(f)
}

/// "llvmpipe (LLVM 15.0.6, 256 bits)" natively; browsers often leave the description
/// empty (privacy), and then only say whether it is a software fallback adapter.
fn describe(info: &wgpu::AdapterInfo) -> String {
    match (info.name.is_empty(), info.driver_info.is_empty()) {
        (false, false) => format!("{} ({})", info.name, info.driver_info),
        (false, true) => info.name.clone(),
        _ if info.device_type == wgpu::DeviceType::Cpu => "WebGPU adapter (software fallback)".to_string(),
        _ => "WebGPU adapter".to_string(),
    }
}

/// Device, queue and everything cached per device.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// The limits the device was created with (what buffers and bindings may use).
    pub limits: wgpu::Limits,
    /// Adapter name and driver, for reports ("llvmpipe (LLVM 15.0.6, 256 bits)").
    pub adapter_name: String,
    pipelines: Mutex<HashMap<kernels::PipelineKey, Arc<kernels::Pipeline>>>,
    modules: Mutex<HashMap<kernels::Kernel, wgpu::ShaderModule>>,
    errors: Arc<Mutex<Vec<String>>>,
    binding_cap: u64,
    /// Quantized activations of the integer matmuls (quantize_act.wgsl), grown on demand.
    act_scratch: Mutex<Option<wgpu::Buffer>>,
    /// Whether the integer matmuls use dot4I8Packed (qmatmul_dp4a.wgsl): the WGSL
    /// implementation has the packed_4x8_integer_dot_product extension.
    dp4a: bool,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext({})", self.adapter_name)
    }
}

#[cfg(not(target_arch = "wasm32"))]
const NO_ADAPTER: &str = "no Vulkan adapter; install mesa-vulkan-drivers";
#[cfg(target_arch = "wasm32")]
const NO_ADAPTER: &str = "no WebGPU adapter in this browser";

/// `COLIBRI_GPU_DP4A=0` keeps the integer matmuls on plain i32 arithmetic
/// (qmatmul.wgsl) even where dot4I8Packed exists (to compare the two; both give the same
/// bits).
fn dp4a_allowed() -> bool {
    #[cfg(not(target_arch = "wasm32"))]
    if std::env::var("COLIBRI_GPU_DP4A").is_ok_and(|v| v == "0") {
        return false;
    }
    true
}

impl GpuContext {
    /// Opens the first adapter (Vulkan natively, the browser's WebGPU on wasm32) and a
    /// device with the adapter's full limits.
    pub async fn new() -> Result<Self> {
        #[cfg(not(target_arch = "wasm32"))]
        let backends = wgpu::Backends::VULKAN;
        #[cfg(target_arch = "wasm32")]
        let backends = wgpu::Backends::BROWSER_WEBGPU;
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::Gpu(format!("{NO_ADAPTER} ({e})")))?;
        let info = adapter.get_info();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("colibri"),
                required_features: wgpu::Features::empty(),
                required_limits: adapter.limits(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::Gpu(format!("cannot open a device on {}: {e}", info.name)))?;
        let mut ctx = Self::from_device(device, queue, describe(&info));
        ctx.dp4a = instance.wgsl_language_features().contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct)
            && dp4a_allowed();
        Ok(ctx)
    }

    /// Native convenience: [`GpuContext::new`] run to completion.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking() -> Result<Self> {
        pollster::block_on(Self::new())
    }

    /// Wraps a device the caller created (for tests, or an application that owns one).
    /// Device errors are captured and returned from the next GPU call instead of panicking.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue, adapter_name: String) -> Self {
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let limits = device.limits();
        GpuContext {
            device,
            queue,
            limits,
            adapter_name,
            pipelines: Mutex::default(),
            modules: Mutex::default(),
            errors,
            binding_cap: u64::MAX,
            act_scratch: Mutex::default(),
            // Natively the shader compiler is naga, which implements the extension (DP4a
            // where the Vulkan device has it, a polyfill elsewhere); in a browser only
            // [`GpuContext::new`] can ask.
            dp4a: cfg!(not(target_arch = "wasm32")) && dp4a_allowed(),
        }
    }

    /// Whether the integer matmuls use dot4I8Packed (qmatmul_dp4a.wgsl).
    /// The adapter's name hashed (xxh3, 16 hex digits): what tells its cache files apart
    /// from another adapter's and the CPU's (a driver may order float sums otherwise).
    pub fn adapter_id(&self) -> String {
        format!("{:016x}", crate::format::manifest::checksum(self.adapter_name.as_bytes()))
    }

    pub fn dp4a(&self) -> bool {
        self.dp4a
    }

    /// Uses (or stops using) dot4I8Packed in the integer matmuls, so that tests can run
    /// both kernels. Turning it on where the WGSL implementation lacks the extension makes
    /// the integer matmuls fail with the shader compiler's error.
    pub fn set_dp4a(&mut self, on: bool) {
        self.dp4a = on;
    }

    /// Pretends storage bindings are at most `bytes` (a multiple of 4) so that tests can
    /// exercise matrices split into row blocks on any adapter.
    pub fn set_binding_cap(&mut self, bytes: u64) {
        self.binding_cap = bytes.max(4) & !3;
    }

    /// The first device error since the last check, if any.
    pub fn take_error(&self) -> Result<()> {
        let mut errs = self.errors.lock().map_err(|_| Error::Gpu("error log poisoned".into()))?;
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        Err(Error::Gpu(msg))
    }

    /// Largest byte range one storage binding may cover (a multiple of 4). Capped at
    /// 2 GiB so that kernels can index any binding's elements with u32.
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size).min(1 << 31).min(self.binding_cap)
            & !3
    }

    /// A storage buffer for activations: readable, writable, copyable.
    pub fn storage_buffer(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        if size > self.max_binding() {
            return Err(Error::Gpu(format!(
                "{label}: {size} bytes exceed this adapter's storage binding limit of {} bytes",
                self.max_binding()
            )));
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// A storage buffer of at least `bytes` for quantized activations, shared by every
    /// integer matmul: each one quantizes and then reads it, and the queue runs them in
    /// order, so no two uses overlap.
    pub(crate) fn act_buffer(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let mut slot = self.act_scratch.lock().map_err(|_| Error::Gpu("activation scratch poisoned".into()))?;
        if let Some(b) = slot.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(b.clone());
        }
        let size = bytes.max(256).next_power_of_two().min(self.max_binding()).max(bytes);
        let b = self.storage_buffer("quantized activations", size)?;
        *slot = Some(b.clone());
        Ok(b)
    }

    /// Waits for submitted work natively; on the web the browser drives callbacks.
    pub(crate) fn poll_wait(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for the device: {e}")))?;
        Ok(())
    }
}
