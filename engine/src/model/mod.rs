//! The decoder-only MoE transformer shared by every supported family:
//! embedding -> for each layer [RMSNorm -> attention -> residual -> RMSNorm -> MoE block
//! or dense MLP -> residual] -> final RMSNorm -> lm_head.
//! Reference: transformers' modeling_{mixtral,qwen2_moe,qwen3_moe,olmoe,deepseek_v3,glm4_moe,
//! gpt_oss,qwen3_next}.py (v5).
//!
//! The model sits on top of the file formats (crate::format) and the expert supply
//! (crate::experts): [`config`] (config.json), [`rope`], [`attention`] (with its MLA
//! variant in [`mla`] and the Gated DeltaNet linear attention in [`deltanet`]), [`moe`]
//! (routing and the MoE block), the forward pass here, and [`open`], where a model is opened.

pub mod attention;
mod batch;
pub mod config;
pub(crate) mod cpu;
pub mod deltanet;
pub mod dsa;
pub mod gpt_oss;
pub(crate) mod graph;
pub mod kv;
pub mod mla;
pub mod moe;
pub mod mtp;
pub mod open;
pub mod rope;
pub mod snapshots;
pub mod v4;

use std::sync::Arc;

use crate::error::Result;
use crate::experts::{Expert, ExpertSource, ResidentExperts};
use crate::format::tensors::TensorStore;
use crate::tensor::Mat;
use attention::{AttnOpts, GqaWeights, LayerCache};
use config::{Family, ModelConfig, QkNorm};
use deltanet::DeltaNetWeights;
use mla::MlaWeights;
use moe::{MoeBlock, SharedExpert};
use rope::Rope;

/// One layer's attention weights: the variant decides the projections and what the
/// cache holds.
pub enum AttnWeights {
    /// Grouped-query attention: keys and values cached per kv head.
    Gqa(GqaWeights),
    /// Multi-head latent attention: a compressed latent and a shared rotary key cached.
    Mla(MlaWeights),
    /// Gated DeltaNet linear attention: a recurrent state instead of a cache.
    Linear(Box<DeltaNetWeights>),
}

pub enum Ffn {
    Dense(Box<Expert>),
    Moe(Box<MoeBlock>),
}

pub struct Layer {
    /// (hidden)
    pub attn_norm: Vec<f32>,
    pub attn: AttnWeights,
    pub attn_opts: AttnOpts,
    /// (hidden)
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

pub struct Model {
    pub cfg: ModelConfig,
    /// (vocab, hidden)
    pub embed: Mat,
    pub layers: Vec<Layer>,
    /// (hidden)
    pub final_norm: Vec<f32>,
    /// (vocab, hidden); the embedding matrix when tied.
    pub lm_head: Mat,
    pub rope: Rope,
    pub experts: Box<dyn ExpertSource>,
    /// The multi-token-prediction layer, where the checkpoint has one ([`mtp`]).
    pub mtp: Option<mtp::MtpHead>,
    /// DeepSeek-V4's layers ([`v4`]; then `layers` is empty).
    pub v4: Option<Box<v4::V4Weights>>,
}

/// KV cache and token history of one conversation.
#[derive(Clone, Default)]
pub struct Session {
    pub caches: Vec<LayerCache>,
    /// Every token fed so far, in order. After a [`Session::truncate`] that a recurrent
    /// layer could not follow exactly, the last of them are not in the caches yet: the
    /// next forward pass feeds them again first ([`Session::cached_len`]).
    pub tokens: Vec<u32>,
    /// DeepSeek-V4's per-layer state ([`v4::V4State`]), for a V4 model.
    pub v4: Option<Box<v4::V4State>>,
}

impl Session {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forget everything after the first `len` tokens (to reuse a shared prefix, or to
    /// roll back a forward pass that failed after some layers had cached its keys).
    /// A linear-attention layer's state may only go back to an earlier point (see
    /// [`deltanet::DeltaState::rewind`]); then every cache goes back there and the next
    /// forward pass recomputes the tokens between, which gives the same bits.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        // DeepSeek-V4's compressed state goes back to its latest snapshot at or before
        // `len` (else it restarts), and the next pass feeds the tokens after it again.
        if let Some(v) = self.v4.as_deref_mut() {
            v.rewind(len);
        }
        for c in &mut self.caches {
            c.truncate(len);
        }
        let held = self.cached_len();
        if held < self.tokens.len() {
            for c in &mut self.caches {
                c.truncate(held);
            }
        }
    }

    /// Tokens whose effect the caches hold: all of [`Session::tokens`] but after a
    /// truncation that a recurrent state could not follow exactly.
    pub fn cached_len(&self) -> usize {
        if let Some(v) = &self.v4 {
            return v.pos.min(self.tokens.len());
        }
        self.caches.iter().filter(|c| c.recurrent.is_some()).map(LayerCache::len).fold(self.tokens.len(), usize::min)
    }

    /// Bytes held: every layer's cache (and recurrent state) and the ids.
    pub fn bytes(&self) -> usize {
        let state = |c: &LayerCache| c.recurrent.as_ref().map_or(0, |r| r.conv.len() + r.s.len());
        let v4 = self.v4.as_ref().map_or(0, |v| v.floats());
        let held = self.caches.iter().map(|c| c.k.len() + c.v.len() + state(c)).sum::<usize>();
        4 * (self.tokens.len() + v4 + held) + self.snapshot_bytes()
    }

    /// Bytes of the recurrent states' snapshots (part of [`Session::bytes`]): a Gated
    /// DeltaNet layer's state, DeepSeek-V4's windows, up to three times each.
    pub fn snapshot_bytes(&self) -> usize {
        let delta = self.caches.iter().filter_map(|c| c.recurrent.as_ref()).map(|r| r.snapshot_floats());
        4 * (self.v4.as_ref().map_or(0, |v| v.snapshot_floats()) + delta.sum::<usize>())
    }

    /// Keeps the recurrent states' snapshot after `pos` positions while later passes
    /// come and go ([`snapshots::Snapshots::pin`]): where this conversation's prompt
    /// parts from others' (after a system prompt). For the states the session holds, so
    /// once a pass ran; call it before the pass that starts at `pos`.
    pub fn pin_snapshot(&mut self, pos: usize) {
        if let Some(v) = self.v4.as_deref_mut() {
            v.pin(pos);
        }
        for r in self.caches.iter_mut().filter_map(|c| c.recurrent.as_mut()) {
            r.pin(pos);
        }
    }

    /// Whether the coming pass belongs to the decode ([`snapshots::decode_like`]): its
    /// snapshot is transient ([`snapshots::Snapshots::verifying`]).
    fn verifying(&mut self, v: bool) {
        if let Some(s) = self.v4.as_deref_mut() {
            s.verifying(v);
        }
        for r in self.caches.iter_mut().filter_map(|c| c.recurrent.as_mut()) {
            r.verifying(v);
        }
    }
}

/// Which positions' logits a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    All,
    Last,
}

/// Tensor names of one family's checkpoint.
struct Names {
    moe: &'static str,
    gate: &'static str,
    up: &'static str,
    down: &'static str,
    /// The shared expert's module, under the MoE block.
    shared: &'static str,
    /// The router's module, under the MoE block.
    router: &'static str,
}

impl Names {
    fn of(f: Family) -> Self {
        match f {
            Family::Mixtral => {
                Names { moe: "block_sparse_moe", gate: "w1", up: "w3", down: "w2", shared: "", router: "gate" }
            }
            Family::DeepseekV3 | Family::Glm4Moe => Names {
                moe: "mlp",
                gate: "gate_proj",
                up: "up_proj",
                down: "down_proj",
                shared: "shared_experts",
                router: "gate",
            },
            Family::GptOss => {
                Names { moe: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", shared: "", router: "router" }
            }
            _ => Names {
                moe: "mlp",
                gate: "gate_proj",
                up: "up_proj",
                down: "down_proj",
                shared: "shared_expert",
                router: "gate",
            },
        }
    }
}

fn load_mlp(s: &TensorStore, prefix: &str, n: &Names, hidden: usize, inter: usize) -> Result<Expert> {
    Ok(Expert {
        gate: s.mat(&format!("{prefix}.{}.weight", n.gate), inter, hidden)?,
        up: s.mat(&format!("{prefix}.{}.weight", n.up), inter, hidden)?,
        down: s.mat(&format!("{prefix}.{}.weight", n.down), hidden, inter)?,
    })
}

/// Routed experts of one layer: per-expert tensors (the hub layout), or the fused 3-D
/// `experts.gate_up_proj` / `experts.down_proj` layout that transformers v5 uses in memory.
fn load_experts(s: &TensorStore, moe: &str, n: &Names, c: &ModelConfig) -> Result<Vec<Arc<Expert>>> {
    // gpt_oss's fused checkpoint tensors; per-expert ones (a GGUF import) load as any family's.
    if c.family == Family::GptOss && !s.contains(&format!("{moe}.experts.0.{}.weight", n.gate)) {
        return gpt_oss::load_experts(s, moe, c);
    }
    let (h, i, ne) = (c.hidden, c.expert_intermediate, c.router.n_experts);
    let fused = format!("{moe}.experts.gate_up_proj");
    if !s.contains(&format!("{moe}.experts.0.{}.weight", n.gate)) && s.contains(&fused) {
        let down = format!("{moe}.experts.down_proj");
        return (0..ne)
            .map(|e| {
                let gu = s.mat_in_stack(&fused, e, ne, 2 * i, h)?;
                Ok(Arc::new(Expert {
                    gate: gu.row_block(0, i)?,
                    up: gu.row_block(i, i)?,
                    down: s.mat_in_stack(&down, e, ne, h, i)?,
                }))
            })
            .collect();
    }
    (0..ne).map(|e| load_mlp(s, &format!("{moe}.experts.{e}"), n, h, i).map(Arc::new)).collect()
}

/// An RMSNorm weight, plus one where the checkpoint stores them zero-centred.
fn load_norm(c: &ModelConfig, s: &TensorStore, name: &str, len: usize) -> Result<Vec<f32>> {
    let mut w = s.vector(name, len)?;
    if c.norm_plus_one {
        w.iter_mut().for_each(|x| *x += 1.0);
    }
    Ok(w)
}

/// Decoder layer `l` (`ModelConfig::layer_prefix`), with a routed MoE block if `moe`.
fn load_layer(c: &ModelConfig, s: &TensorStore, l: usize, moe: bool) -> Result<Layer> {
    let names = Names::of(c.family);
    let (h, qd, kvd) = (c.hidden, c.q_dim(), c.kv_dim());
    // The q projection's rows: the queries, and as many gate values with an output gate.
    let qw = if c.attn_output_gate { 2 * qd } else { qd };
    let norm = |name: &str, len: usize| load_norm(c, s, name, len);
    let p = c.layer_prefix(l);
    let a = format!("{p}.self_attn");
    let linear = c.linear_attn.as_ref().filter(|la| la.layers.get(l).copied().unwrap_or(false));
    let bias = |proj: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if c.qkv_bias && (proj != "o_proj" || c.o_bias) {
            s.vector(&format!("{a}.{proj}.bias"), len).map(Some)
        } else {
            Ok(None)
        }
    };
    let (qn, kn) = match c.qk_norm {
        QkNorm::None => (None, None),
        QkNorm::PerHead => (Some(c.head_dim), Some(c.head_dim)),
        QkNorm::Full => (Some(qd), Some(kvd)),
    };
    let attn = match (&c.mla, linear) {
        (_, Some(la)) => AttnWeights::Linear(Box::new(DeltaNetWeights::load(s, &p, h, la, c.rms_eps)?)),
        (Some(m), None) => AttnWeights::Mla(MlaWeights::load(s, &a, h, c.n_heads, m, l)?),
        (None, None) => AttnWeights::Gqa(GqaWeights {
            wq: s.mat(&format!("{a}.q_proj.weight"), qw, h)?,
            wk: s.mat(&format!("{a}.k_proj.weight"), kvd, h)?,
            wv: s.mat(&format!("{a}.v_proj.weight"), kvd, h)?,
            wo: s.mat(&format!("{a}.o_proj.weight"), h, qd)?,
            bq: bias("q_proj", qw)?,
            bk: bias("k_proj", kvd)?,
            bv: bias("v_proj", kvd)?,
            bo: bias("o_proj", h)?,
            sinks: match c.attn_sinks {
                true => Some(s.vector(&format!("{a}.sinks"), c.n_heads)?),
                false => None,
            },
            q_norm: qn.map(|n| norm(&format!("{a}.q_norm.weight"), n)).transpose()?,
            k_norm: kn.map(|n| norm(&format!("{a}.k_norm.weight"), n)).transpose()?,
        }),
    };
    let attn_opts = AttnOpts {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
        qk_norm: c.qk_norm,
        clip_qkv: c.clip_qkv,
        window: c.sliding_window.get(l).copied().flatten(),
        scale: c.attn_scale,
        rms_eps: c.rms_eps,
        mla: if linear.is_some() { None } else { c.mla.clone() },
        output_gate: c.attn_output_gate,
    };
    let ffn = if moe {
        let moe = format!("{p}.{}", names.moe);
        let shared = match c.shared_expert_intermediate {
            Some(si) => Some(SharedExpert {
                mlp: load_mlp(s, &format!("{moe}.{}", names.shared), &names, h, si)?,
                gate: match c.shared_expert_gated {
                    true => Some(s.mat(&format!("{moe}.shared_expert_gate.weight"), 1, h)?),
                    false => None,
                },
            }),
            None => None,
        };
        let ne = c.router.n_experts;
        let r = format!("{moe}.{}", names.router);
        Ffn::Moe(Box::new(MoeBlock {
            router: s.mat(&format!("{r}.weight"), ne, h)?,
            router_bias: match c.router.logit_bias {
                true => Some(s.vector(&format!("{r}.bias"), ne)?),
                false => None,
            },
            cfg: c.router.clone(),
            act: c.ffn_act,
            expert_bias: match c.expert_bias {
                true => Some(gpt_oss::load_biases(s, &moe, c)?),
                false => None,
            },
            correction_bias: match c.router.correction_bias {
                true => Some(s.vector(&format!("{r}.e_score_correction_bias"), ne)?),
                false => None,
            },
            shared,
        }))
    } else {
        Ffn::Dense(Box::new(load_mlp(s, &format!("{p}.mlp"), &names, h, c.dense_intermediate)?))
    };
    Ok(Layer {
        attn_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
        attn,
        attn_opts,
        ffn_norm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
        ffn,
    })
}

impl Model {
    /// Builds the model from a checkpoint's tensors, checking every shape; the routed
    /// experts stay views into the same tensors.
    pub fn from_store(cfg: ModelConfig, s: &TensorStore) -> Result<Self> {
        Self::from_store_with(cfg, s, 0)
    }

    /// [`Model::from_store`]; for a streamed checkpoint
    /// ([`TensorStore::open_dir_streamed`]) the dense weights are read into memory now and
    /// the routed experts when used, `expert_budget` bytes of them kept
    /// ([`crate::experts::streamed`]). gpt_oss's fused experts are reordered as they load,
    /// so its checkpoints are read whole.
    pub fn from_store_with(cfg: ModelConfig, s: &TensorStore, expert_budget: u64) -> Result<Self> {
        if cfg.v4.is_some() {
            return v4::load::model(cfg, s, expert_budget);
        }
        // A streamed checkpoint, or FP8 pairs (read into FP8 rows when used, format::fp8).
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(reader) = s.reader() {
            let stream = cfg.family != Family::GptOss;
            let s = s.resident(|n| stream && crate::format::tensors::is_routed_expert_weight(n))?;
            let experts = Self::routed_experts(&cfg, &s)?;
            let source = crate::experts::streamed::StreamedExperts::new(experts, reader, expert_budget);
            return Model::from_parts(cfg, &s, Box::new(source));
        }
        #[cfg(target_arch = "wasm32")]
        let _ = expert_budget;
        let experts = Self::routed_experts(&cfg, s)?;
        Model::from_parts(cfg, s, Box::new(ResidentExperts { layers: experts }))
    }

    /// Every layer's routed experts, as views of the tensors in `s`.
    fn routed_experts(cfg: &ModelConfig, s: &TensorStore) -> Result<Vec<Vec<Arc<Expert>>>> {
        let cfg = cfg.clone();
        let names = Names::of(cfg.family);
        let mut experts = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            if cfg.moe_layers[l] {
                experts.push(load_experts(s, &format!("model.layers.{l}.{}", names.moe), &names, &cfg)?);
            } else {
                experts.push(Vec::new());
            }
        }
        if mtp::present(&cfg, s) && mtp::is_moe(&cfg, s) {
            experts.push(load_experts(s, &format!("{}.{}", cfg.layer_prefix(cfg.n_layers), names.moe), &names, &cfg)?);
        }
        Ok(experts)
    }

    /// Builds the model from its dense tensors (everything but the routed experts, under
    /// their Hugging Face names) and a source of routed experts. A multi-token-prediction
    /// layer ([`mtp::MtpHead`]) is loaded where its tensors are present.
    pub fn from_parts(cfg: ModelConfig, s: &TensorStore, experts: Box<dyn ExpertSource>) -> Result<Self> {
        if cfg.v4.is_some() {
            // A converted deepseek_v4 (its dense tensors under the checkpoint's names).
            return v4::load::assemble(cfg, s, experts);
        }
        let c = &cfg;
        let h = c.hidden;
        let embed = s.mat("model.embed_tokens.weight", c.vocab, h)?;
        let lm_head = if c.tie_word_embeddings && !s.contains("lm_head.weight") {
            embed.clone()
        } else {
            s.mat("lm_head.weight", c.vocab, h)?
        };
        let layers = (0..c.n_layers).map(|l| load_layer(c, s, l, c.moe_layers[l])).collect::<Result<Vec<_>>>()?;
        Ok(Model {
            rope: Rope::new(&c.rope),
            final_norm: load_norm(c, s, "model.norm.weight", h)?,
            mtp: mtp::MtpHead::load(c, s)?,
            v4: None,
            embed,
            lm_head,
            layers,
            experts,
            cfg,
        })
    }

    /// Opens a Hugging Face checkpoint directory (config.json + safetensors) or a
    /// converted colibri directory (colibri.json), keeping every expert once read.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir(dir: &std::path::Path) -> Result<Self> {
        Self::open_dir_with(dir, Default::default())
    }

    /// [`Model::open_dir`] with the expert-cache options of a converted model (a Hugging
    /// Face directory is read whole when it fits in half the free memory, else its experts
    /// are read when used, `ram` bytes of them kept; never mapped). See [`open::ModelDir`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir_with(dir: &std::path::Path, opts: crate::experts::cache::CacheOptions) -> Result<Self> {
        open::ModelDir::open(dir, opts.direct)?.load(opts)
    }

    /// Whether the dense weights are in memory: not where they went from the data file
    /// straight to a GPU backend's buffers ([`open::Container::load_elsewhere`]).
    pub fn dense_in_memory(&self) -> bool {
        !self.embed.bytes.is_elsewhere()
    }

    /// An error unless the CPU can compute with this model ([`Model::dense_in_memory`]).
    pub fn check_cpu(&self) -> Result<()> {
        if self.dense_in_memory() {
            return Ok(());
        }
        Err(crate::error::Error::Invalid(
            "this model's dense weights were loaded straight into GPU buffers: it runs on the GPU backend only".into(),
        ))
    }

    /// Bytes the attention caches hold after `n` positions (f32): DeepSeek-V4's window,
    /// compressed entries, unfinished windows and carries exactly as its state holds them
    /// ([`v4::persist::V4Layout::record_floats`]), bounded by the window plus one entry per
    /// `rate` positions; the other families' keys and values of every position plus any
    /// recurrent state. (Here, not on [`ModelConfig`]: the config module stays below
    /// `model::v4`.)
    pub fn kv_cache_bytes_at(&self, n: usize) -> usize {
        let c = &self.cfg;
        match v4::persist::V4Layout::of(c) {
            Some(l) => l.record_floats(0, n).map_or(usize::MAX, |f| f.saturating_mul(4)),
            None => c.kv_cache_bytes_per_token().saturating_mul(n).saturating_add(c.recurrent_state_bytes()),
        }
    }

    /// Bytes a session of `n` positions may hold: [`Model::kv_cache_bytes_at`], the ids,
    /// and [`Model::snapshot_bytes_bound`].
    pub fn session_bytes_bound(&self, n: usize) -> usize {
        self.kv_cache_bytes_at(n).saturating_add(4 * n).saturating_add(self.snapshot_bytes_bound(n))
    }

    /// The most bytes a session of at most `n` positions holds in its snapshots
    /// ([`Session::snapshot_bytes`]): a pinned one, a verify pass's and
    /// [`snapshots::MAX_SNAPSHOTS`] more, each of a Gated DeltaNet state or of
    /// DeepSeek-V4's windows.
    pub fn snapshot_bytes_bound(&self, n: usize) -> usize {
        let v4 = v4::persist::V4Layout::of(&self.cfg).map_or(0, |l| l.snapshot_floats_bound(n));
        let one = self.cfg.recurrent_state_bytes().saturating_add(v4.saturating_mul(4));
        (snapshots::MAX_SNAPSHOTS + 2).saturating_mul(one)
    }

    pub fn new_session(&self) -> Session {
        Session {
            caches: vec![LayerCache::default(); self.cfg.n_layers],
            tokens: Vec::new(),
            v4: self.v4.as_ref().map(|_| self.fresh_v4()),
        }
    }

    /// An empty DeepSeek-V4 state laid out as this model's.
    fn fresh_v4(&self) -> Box<v4::V4State> {
        Box::new(v4::V4State::new(v4::persist::V4Layout::of(&self.cfg)))
    }

    /// A DeepSeek-V4 model's session gets a state where it has none (one read back from a
    /// cache file: its tokens are fed again) and its layout where the state lacks it.
    fn v4_ready(&self, session: &mut Session) {
        if self.v4.is_none() {
            return;
        }
        let state = session.v4.get_or_insert_with(|| self.fresh_v4());
        if state.layout.is_none() {
            state.layout = v4::persist::V4Layout::of(&self.cfg);
        }
    }

    /// Feeds `ids` after what `session` already holds and returns logits,
    /// (n, vocab) for `Logits::All` or (vocab) for `Logits::Last`.
    pub fn forward(&self, session: &mut Session, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.forward_with(session, ids, which, &mut |_, _, _| {})
    }

    /// [`Model::forward`], reporting every routed expert use as (layer, expert, positions).
    pub fn forward_with(
        &self,
        session: &mut Session,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<f32>> {
        self.forward_observed(session, ids, which, on_use, &mut |_, _| {})
    }

    /// [`Model::forward_with`], also showing `on_ffn_input(layer, x)` the normalised
    /// input of every layer's FFN (n, hidden) before it runs: what a router sees, and what
    /// a router-lookahead predictor would apply the next layer's router to.
    pub fn forward_observed(
        &self,
        session: &mut Session,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
        on_ffn_input: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<Vec<f32>> {
        self.forward_full(session, ids, which, on_use, on_ffn_input, false).map(|(logits, _)| logits)
    }

    /// [`Model::forward`], also returning every fed position's last hidden state after the
    /// final norm, (n, hidden): what a multi-token-prediction head reads ([`mtp`]).
    pub fn forward_hidden(&self, session: &mut Session, ids: &[u32], which: Logits) -> Result<(Vec<f32>, Vec<f32>)> {
        self.forward_hidden_with(session, ids, which, &mut |_, _, _| {})
    }

    /// [`Model::forward_hidden`], reporting every routed expert use as [`Model::forward_with`].
    pub fn forward_hidden_with(
        &self,
        session: &mut Session,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.forward_full(session, ids, which, on_use, &mut |_, _| {}, true)
    }

    /// The forward pass: logits of `which` rows, and with `hidden` every position's
    /// final-normed state (else an empty vector).
    fn forward_full(
        &self,
        session: &mut Session,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
        on_ffn_input: &mut dyn FnMut(usize, &[f32]),
        hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        // Told before any ids a rollback feeds again join these.
        session.verifying(snapshots::decode_like(ids.len(), which));
        self.forward_run(session, ids, which, on_use, on_ffn_input, hidden)
    }

    /// [`Model::forward_full`] after the recurrent states were told what the pass is.
    fn forward_run(
        &self,
        session: &mut Session,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
        on_ffn_input: &mut dyn FnMut(usize, &[f32]),
        hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_cpu()?;
        let c = &self.cfg;
        let (n, h) = (ids.len(), c.hidden);
        self.v4_ready(session);
        let held = session.cached_len();
        if held < session.tokens.len() {
            // A recurrent state went back further than the session's tokens: feed the
            // tokens in between again, with these, and return these ones' logits.
            c.check_input(ids, session.tokens.len())?;
            let again = session.tokens.len() - held;
            let all: Vec<u32> = session.tokens[held..].iter().chain(ids).copied().collect();
            session.tokens.truncate(held);
            return match self.forward_run(session, &all, which, on_use, on_ffn_input, hidden) {
                Ok((logits, hs)) => {
                    let hs = if hidden { hs[again * h..].to_vec() } else { hs };
                    match which {
                        Logits::All => Ok((logits[again * c.vocab..].to_vec(), hs)),
                        Logits::Last => Ok((logits, hs)),
                    }
                }
                Err(e) => {
                    session.truncate(held);
                    Err(e)
                }
            };
        }
        let pos0 = session.tokens.len();
        c.check_input(ids, pos0)?;
        if let Some(w) = &self.v4 {
            // DeepSeek-V4: the graph's V4 pass over the session's V4 state.
            let state = session.v4.get_or_insert_with(|| self.fresh_v4());
            if state.begin(n) {
                state.snapshot();
            }
            let seq = cpu::Seq::new(pos0, n, &mut session.caches).with_v4(state);
            let mut pass = cpu::CpuPass {
                ops: cpu::CpuOps::batch(&self.rope, vec![seq]).with_v4(&w.main_rope, &w.compress_rope),
                model: self,
                on_use,
                on_ffn_input,
            };
            let out = graph::run_ready(graph::forward(&mut pass, ids, which, hidden)).and_then(|r| r);
            drop(pass);
            match &out {
                Ok(_) => {
                    session.tokens.extend_from_slice(ids);
                    if let Some(v) = session.v4.as_deref_mut() {
                        v.pos += n;
                    }
                }
                // A pass that failed half way leaves no usable state.
                Err(_) => session.v4 = Some(self.fresh_v4()),
            }
            return out;
        }
        if session.caches.len() != c.n_layers {
            session.caches = vec![LayerCache::default(); c.n_layers];
        }

        let mut pass = cpu::CpuPass {
            ops: cpu::CpuOps::for_positions(&self.rope, pos0, n, &mut session.caches),
            model: self,
            on_use,
            on_ffn_input,
        };
        let out = graph::run_ready(graph::forward(&mut pass, ids, which, hidden))??;
        session.tokens.extend_from_slice(ids);
        Ok(out)
    }
}
