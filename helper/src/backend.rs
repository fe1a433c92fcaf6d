//! The compute backend behind `--backend cpu|wgpu`: one forward function over one
//! conversation, so `logits` and `generate` run the same code on either backend.

use anyhow::Result;
use colibri_engine::{Logits, Model};

use crate::flags::{BackendChoice, Compute};

/// Feeds ids after everything fed so far and returns their logits.
pub type Forward<'m> = Box<dyn FnMut(&[u32], Logits) -> colibri_engine::Result<Vec<f32>> + 'm>;

pub fn forward_fn(model: &Model, c: Compute) -> Result<Forward<'_>> {
    match c.backend {
        BackendChoice::Cpu => {
            let mut session = model.new_session();
            Ok(Box::new(move |ids, which| model.forward(&mut session, ids, which)))
        }
        BackendChoice::Wgpu => gpu(model, c),
    }
}

/// One conversation kept on either backend, for commands that answer turn after turn and
/// reuse the cache of the unchanged prefix (`coli chat`): its tokens, a truncate, a feed.
pub enum ChatSession<'m> {
    Cpu(&'m Model, colibri_engine::Session),
    #[cfg(feature = "wgpu")]
    Gpu(Box<colibri_engine::gpu::GpuModel<&'m Model>>, colibri_engine::gpu::GpuSession),
}

impl<'m> ChatSession<'m> {
    pub fn new(model: &'m Model, c: Compute) -> Result<Self> {
        match c.backend {
            BackendChoice::Cpu => Ok(ChatSession::Cpu(model, model.new_session())),
            #[cfg(feature = "wgpu")]
            BackendChoice::Wgpu => {
                let gpu = Box::new(gpu_model(model, c)?);
                let session = gpu.new_session();
                Ok(ChatSession::Gpu(gpu, session))
            }
            #[cfg(not(feature = "wgpu"))]
            BackendChoice::Wgpu => gpu(model, c).map(|_| unreachable!("gpu() always fails without the feature")),
        }
    }

    /// Every token fed so far.
    pub fn tokens(&self) -> &[u32] {
        match self {
            ChatSession::Cpu(_, s) => &s.tokens,
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(_, s) => &s.tokens,
        }
    }

    /// Tokens whose effect the caches hold: fewer than [`ChatSession::tokens`] after a
    /// cut that a recurrent state could not follow (the next pass feeds the rest again).
    pub fn cached_len(&self) -> usize {
        match self {
            ChatSession::Cpu(_, s) => s.cached_len(),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(_, s) => s.cached_len(),
        }
    }

    /// Forgets everything after the first `len` tokens.
    pub fn truncate(&mut self, len: usize) {
        match self {
            ChatSession::Cpu(_, s) => s.truncate(len),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(_, s) => s.truncate(len),
        }
    }

    /// Writes the conversation's cache to `store` (crate::kv_store): the CPU's session as
    /// it is; the GPU's read back into the CPU's layout, only the positions the file does
    /// not hold yet (`GpuModel::session_to_cpu_from`). A read-back that fails is one
    /// warning line.
    pub fn save_to(&self, store: &crate::kv_store::KvStore) {
        match self {
            ChatSession::Cpu(_, s) => store.save(s),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(g, s) => match g.session_to_cpu_from_blocking(s, s.cached_len()) {
                Ok(shape) => {
                    let rows = |from: usize| g.session_to_cpu_from_blocking(s, from).map_err(std::io::Error::other);
                    store.save_with(&shape, Some(&rows));
                }
                Err(e) => eprintln!("coli: warning: could not read the GPU's KV cache back: {e}"),
            },
        }
    }

    /// Replaces the conversation with `s` (a cache read from disk); false if the GPU
    /// could not take it (the conversation is then unchanged).
    pub fn restore(&mut self, s: colibri_engine::Session) -> bool {
        match self {
            ChatSession::Cpu(_, cur) => {
                *cur = s;
                true
            }
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(g, cur) => match g.session_from_cpu(&s) {
                Ok(s) => {
                    *cur = s;
                    true
                }
                Err(e) => {
                    eprintln!("coli: warning: could not upload the KV cache to the GPU: {e}");
                    false
                }
            },
        }
    }

    /// What tells this backend's cache files apart from the CPU's (None: the CPU): the
    /// GPU's float order may differ from the CPU's (WGSL lets a driver reassociate), and a
    /// conversation continued after a restart must give the bits it would have given
    /// uninterrupted, so each adapter keeps its own files.
    pub fn cache_tag(&self) -> Option<String> {
        match self {
            ChatSession::Cpu(..) => None,
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(g, _) => Some(format!("wgpu-{}", g.ctx.adapter_id())),
        }
    }

    /// Feeds `ids` after everything fed so far; the last position's logits.
    pub fn forward(&mut self, ids: &[u32]) -> colibri_engine::Result<Vec<f32>> {
        match self {
            ChatSession::Cpu(m, s) => m.forward(s, ids, Logits::Last),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(g, s) => g.forward_blocking(s, ids, Logits::Last),
        }
    }
}

impl colibri_engine::generate::Context for ChatSession<'_> {
    fn tokens(&self) -> &[u32] {
        ChatSession::tokens(self)
    }

    fn truncate(&mut self, len: usize) {
        ChatSession::truncate(self, len)
    }

    /// The inner session's: a recurrent state goes back only to a snapshot.
    fn keepable(&self, len: usize) -> usize {
        match self {
            ChatSession::Cpu(_, s) => s.keepable(len),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(_, s) => s.keepable(len),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            ChatSession::Cpu(_, s) => s.bytes(),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(_, s) => s.bytes(),
        }
    }

    fn pin_snapshot(&mut self, pos: usize) {
        match self {
            ChatSession::Cpu(_, s) => s.pin_snapshot(pos),
            #[cfg(feature = "wgpu")]
            ChatSession::Gpu(_, s) => s.pin_snapshot(pos),
        }
    }
}

/// Truncates the conversation to its first `keep` tokens, then feeds ids after them.
pub type ForwardKeep<'m> = Box<dyn FnMut(usize, &[u32], Logits) -> colibri_engine::Result<Vec<f32>> + 'm>;

/// [`forward_fn`] whose conversation can be cut back: reuses a shared prefix's keys
/// and values (option scoring).
pub fn forward_keep_fn(model: &Model, c: Compute) -> Result<ForwardKeep<'_>> {
    match c.backend {
        BackendChoice::Cpu => Ok(colibri_engine::generate::draft::cpu_forward_keep(model)),
        BackendChoice::Wgpu => gpu_keep(model, c),
    }
}

#[cfg(feature = "wgpu")]
fn gpu_keep(model: &Model, c: Compute) -> Result<ForwardKeep<'_>> {
    let gpu = gpu_model(model, c)?;
    let mut session = gpu.new_session();
    Ok(Box::new(move |keep, ids, which| {
        session.truncate(keep);
        gpu.forward_blocking(&mut session, ids, which)
    }))
}

#[cfg(not(feature = "wgpu"))]
fn gpu_keep(_: &Model, _: Compute) -> Result<ForwardKeep<'_>> {
    anyhow::bail!("this coli was built without the wgpu backend (cargo feature \"wgpu\"); use --backend cpu")
}

#[cfg(feature = "wgpu")]
pub fn gpu_model(model: &Model, c: Compute) -> Result<colibri_engine::gpu::GpuModel<&Model>> {
    use colibri_engine::gpu::{GpuContext, GpuModel, GpuOptions, Hybrid};
    // Mesa's implicit device-select layer prints "XDG_RUNTIME_DIR is invalid" lines when
    // no display is around; it only reorders adapters, which wgpu does itself.
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let ctx = GpuContext::new_blocking()?;
    use crate::flags::HybridChoice;
    let hybrid = match c.hybrid {
        HybridChoice::Off => Hybrid::Off,
        HybridChoice::On => Hybrid::On,
        HybridChoice::Auto => Hybrid::Auto,
    };
    Ok(GpuModel::new(
        model,
        std::sync::Arc::new(ctx),
        GpuOptions { hybrid, expert_pool_bytes: c.gpu_pool, ..Default::default() },
    )?)
}

#[cfg(feature = "wgpu")]
fn gpu(model: &Model, c: Compute) -> Result<Forward<'_>> {
    let gpu = gpu_model(model, c)?;
    let mut session = gpu.new_session();
    Ok(Box::new(move |ids, which| gpu.forward_blocking(&mut session, ids, which)))
}

#[cfg(not(feature = "wgpu"))]
fn gpu(_: &Model, _: Compute) -> Result<Forward<'_>> {
    anyhow::bail!("this coli was built without the wgpu backend (cargo feature \"wgpu\"); use --backend cpu")
}
