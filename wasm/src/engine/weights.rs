//! The model's weights at load, and its compute backend: the dense weights come from the
//! browser's copy in OPFS when it has one, else from the network (downloaded into a new
//! copy first where one can be kept: crate::dense::DenseSource), into wasm memory for the
//! CPU backend or straight into GPU buffers for WebGPU. A stored copy that fails the load's
//! checksums ([`Error::Checksum`]) is emptied and the load is done again from the network.

use std::rc::Rc;
use std::sync::Arc;

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::experts::usage::ExpertUsage;
use colibri_engine::gpu::Hybrid;
use colibri_engine::model::open::Container;
use colibri_engine::tensor::Bytes;
use colibri_engine::tokenizer::Tokenizer;
use colibri_engine::{Error, Model};
use js_sys::Function;

use crate::backend::{choose, open_gpu, open_gpu_streamed, AutoChoice, Backend, Want};
use crate::browser_source::BrowserSource;
use crate::dense::{report, DenseSource, DenseStats};
use crate::error::JsFail;

/// What building the weights needs from `Engine::load`.
pub(super) struct Plan<'a> {
    pub container: &'a Container,
    /// The dense weights go to GPU buffers (WebGPU) instead of wasm memory.
    pub streamed: bool,
    pub want: Want,
    pub hybrid: Hybrid,
    pub gpu_pool: Option<u64>,
    pub tiers: &'a Arc<BrowserSource>,
    pub cache: CacheOptions,
    pub usage: &'a ExpertUsage,
    pub tok: &'a Tokenizer,
    /// Why the CPU backend could not hold the model, if it could not.
    pub cpu_fit: &'a Result<(), String>,
    pub on_progress: &'a Option<Function>,
}

/// The loaded model and backend (with what `auto` measured), and where the dense
/// weights came from.
pub(super) type Weights = (Rc<Model>, Backend, Option<AutoChoice>, DenseStats);

/// Builds the model and backend from `dense`; once more from the network if the stored
/// copy was read and a dense tensor failed its checksum (a copy that cannot be read is
/// left for the network by `DenseSource` itself; other failures, such as wasm memory or
/// the GPU, keep the copy and are the load's error).
pub(super) async fn load_weights(p: &Plan<'_>, dense: &DenseSource) -> Result<Weights, JsFail> {
    // Without a stored copy, the region is downloaded into a new one first (faster than the
    // load's own reads: several large requests at once), then read from there.
    dense.fill(p.on_progress).await;
    let first = attempt(p, dense).await;
    let (model, backend, auto) = match first {
        Err(Error::Checksum(why)) if dense.reads_stored() => {
            dense.refetch(&why);
            attempt(p, dense).await
        }
        r => r,
    }
    .map_err(|e| match e {
        e @ Error::Gpu(_) => {
            let cpu = p.cpu_fit.as_ref().err().map(|c| format!("; and {c}")).unwrap_or_default();
            JsFail::new(&format!("WebGPU backend unavailable: {e}{cpu}"), Some(e.code()), None)
        }
        e => e.into(),
    })?;
    Ok((model, backend, auto, dense.finish()))
}

async fn attempt(p: &Plan<'_>, dense: &DenseSource) -> Result<(Rc<Model>, Backend, Option<AutoChoice>), Error> {
    let m = &p.container.manifest;
    let total = m.dense.length;
    let read = |at: u64, buf: &mut [u8]| dense.read(at, buf);
    let model = if p.streamed {
        p.container.load_elsewhere(&read, p.tiers.clone(), p.cache.clone())
    } else {
        let bytes = dense.whole(p.on_progress).await?;
        p.container.load(&Bytes::from_vec(bytes), p.tiers.clone(), p.cache.clone())
    };
    let model = Rc::new(model?);
    model.experts.learn(p.usage);

    // The compute backend: WebGPU when asked for (an error if the browser has none),
    // or for `auto` when the browser has it and one decode step measures faster.
    // Streamed, the dense weights go to the GPU now (progress: phase "dense").
    let (backend, auto) = match p.want {
        Want::Cpu => (Backend::Cpu, None),
        _ if p.streamed => {
            report(p.on_progress, "gpu", 0.0, total as f64);
            let progress = |n: u64| report(p.on_progress, "dense", n.min(total) as f64, total as f64);
            let gpu = open_gpu_streamed(model.clone(), m, &read, &progress, dense.url(), p.hybrid, p.gpu_pool).await?;
            report(p.on_progress, "dense", total as f64, total as f64);
            (gpu, None)
        }
        _ => match open_gpu(model.clone(), p.hybrid, p.gpu_pool).await {
            Ok(gpu) => {
                report(p.on_progress, "gpu", 0.0, total as f64);
                let probe = p.tok.encode("Hello there", false).unwrap_or_default();
                let v = model.cfg.vocab as u32;
                let probe = [probe.first().copied().unwrap_or(0) % v, probe.get(1).copied().unwrap_or(1) % v];
                let (b, a) = choose(gpu, &model, p.tiers, probe).await?;
                (b, Some(a))
            }
            Err(_) => (Backend::Cpu, None),
        },
    };
    Ok((model, backend, auto))
}
