//! Multi-token prediction (MTP): the extra layer that DeepSeek-V3 and GLM-4.5 ship after
//! their decoder stack (`num_nextn_predict_layers`, stored as `model.layers.{n_layers}.*`),
//! and qwen3_next / Qwen3.5 (`mtp_num_hidden_layers`, stored as `mtp.*`: the same block
//! under other names, [`name`], with a full-attention decoder layer), trained to predict
//! the token after next. colibri uses it as a draft source for
//! speculative decoding ([`crate::generate::MtpDrafter`]).
//!
//! For position i, with the main model's hidden state h_i and the next token t_{i+1}:
//!
//! ```text
//! x   = eh_proj(concat(enorm(embed(t_{i+1})), hnorm(h_i)))      (hidden)
//! x   = decoder_layer(x)           the family's attention and MoE, its own KV cache
//! out = shared_head.norm(x)
//! logits(t_{i+2}) = shared_head.head(out)    (the model's lm_head where absent)
//! ```
//!
//! References: DeepSeek-V3's technical report (section 2.2) and the MTP modules of vLLM
//! (deepseek_mtp.py) and SGLang; transformers does not implement it. h_i is the main
//! model's last hidden state *after* its final norm: the checkpoint's own modeling code
//! hands `self.norm(hidden_states)` to the MTP layer (vLLM #47448, ROCm/ATOM #1764). To
//! draft more than one token, the layer is chained on its own output: `out` takes h's
//! place and the drafted token t_{i+2} takes t_{i+1}'s, at position i + 1.

use super::{load_layer, load_norm, Layer, Logits, Model};
use crate::error::Result;
use crate::format::tensors::TensorStore;
use crate::kernels::{matmul, rmsnorm};
use crate::model::attention::LayerCache;
use crate::model::config::ModelConfig;
use crate::tensor::Mat;

/// The weights of one MTP layer.
pub struct MtpHead {
    /// Its layer index (the main stack's layer count): where its routed experts are.
    pub index: usize,
    /// (vocab, hidden) its own embedding; None: the model's.
    pub embed: Option<Mat>,
    /// (hidden) each
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// (hidden, 2 * hidden): [embedding | hidden state] -> hidden
    pub eh_proj: Mat,
    pub layer: Layer,
    /// (hidden) shared_head.norm
    pub norm: Vec<f32>,
    /// (vocab, hidden) shared_head.head; None: the model's lm_head.
    pub head: Option<Mat>,
}

/// The first MTP layer's tensors besides its decoder layer, by DeepSeek's names.
#[derive(Clone, Copy)]
pub enum Part {
    /// Its own embedding (DeepSeek-V3).
    Embed,
    /// The norms of the token's embedding and of the main model's hidden state.
    Enorm,
    Hnorm,
    /// [embedding | hidden state] -> hidden.
    EhProj,
    /// The output norm, and its own head (DeepSeek-V3).
    Norm,
    Head,
}

/// The checkpoint's name of the first MTP layer's `part`: DeepSeek's and GLM's
/// `model.layers.{n}.*`, or qwen3_next's and qwen3_5_moe's `mtp.*` (`fc` the projection,
/// `pre_fc_norm_embedding` / `pre_fc_norm_hidden` the input norms, `norm` the output norm;
/// no own embedding or head).
pub fn name(c: &ModelConfig, part: Part) -> String {
    if c.family.is_qwen_hybrid() {
        let n = match part {
            Part::Embed => "embed_tokens",
            Part::Enorm => "pre_fc_norm_embedding",
            Part::Hnorm => "pre_fc_norm_hidden",
            Part::EhProj => "fc",
            Part::Norm => "norm",
            Part::Head => "head",
        };
        return format!("mtp.{n}.weight");
    }
    let n = match part {
        Part::Embed => "embed_tokens",
        Part::Enorm => "enorm",
        Part::Hnorm => "hnorm",
        Part::EhProj => "eh_proj",
        Part::Norm => "shared_head.norm",
        Part::Head => "shared_head.head",
    };
    format!("model.layers.{}.{n}.weight", c.n_layers)
}

/// Whether the store holds an MTP layer the config announces.
pub fn present(c: &ModelConfig, s: &TensorStore) -> bool {
    c.mtp_layers > 0 && s.contains(&name(c, Part::EhProj))
}

/// Whether the MTP layer's FFN is a routed MoE block (it is in every released checkpoint).
pub fn is_moe(c: &ModelConfig, s: &TensorStore) -> bool {
    s.contains(&format!("{}.mlp.gate.weight", c.layer_prefix(c.n_layers)))
}

impl MtpHead {
    /// The first MTP layer, where the checkpoint has one (None: no MTP, as in every
    /// container converted before colibri kept them).
    pub fn load(c: &ModelConfig, s: &TensorStore) -> Result<Option<Self>> {
        if !present(c, s) {
            return Ok(None);
        }
        let (l, h, v) = (c.n_layers, c.hidden, c.vocab);
        let optional = |part: Part| -> Result<Option<Mat>> {
            let name = name(c, part);
            if s.contains(&name) {
                s.mat(&name, v, h).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Some(MtpHead {
            index: l,
            embed: optional(Part::Embed)?,
            enorm: load_norm(c, s, &name(c, Part::Enorm), h)?,
            hnorm: load_norm(c, s, &name(c, Part::Hnorm), h)?,
            eh_proj: s.mat(&name(c, Part::EhProj), h, 2 * h)?,
            layer: load_layer(c, s, l, is_moe(c, s))?,
            norm: load_norm(c, s, &name(c, Part::Norm), h)?,
            head: optional(Part::Head)?,
        }))
    }
}

impl Model {
    /// Whether the model has an MTP layer to draft with.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// The MTP layer over positions pos0.. (whose keys and values `cache` gets): `hidden`
    /// (n, hidden) the states they follow, `next` (n) the token after each. Returns the
    /// logits of `which` rows (the drafts for the token after next) and every position's
    /// output state after shared_head.norm, (n, hidden): the `hidden` of a chained step.
    pub fn mtp_forward(
        &self,
        cache: &mut LayerCache,
        pos0: usize,
        hidden: &[f32],
        next: &[u32],
        which: Logits,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_cpu()?;
        let c = &self.cfg;
        let (n, h) = (next.len(), c.hidden);
        let m = self.mtp.as_ref().ok_or_else(|| crate::error::Error::Invalid("this model has no MTP layer".into()))?;
        if n == 0 || hidden.len() != n * h {
            return Err(crate::error::Error::Invalid(format!(
                "mtp: {} hidden values for {n} tokens of width {h}",
                hidden.len()
            )));
        }
        c.check_input(next, pos0)?;
        // [enorm(embed(t_{i+1})) | hnorm(h_i)] per position: (n, 2 * hidden)
        let mut cat = vec![0.0f32; n * 2 * h];
        let mut e = vec![0.0f32; h];
        for i in 0..n {
            m.embed.as_ref().unwrap_or(&self.embed).row_into(next[i] as usize, &mut e);
            let row = &mut cat[i * 2 * h..(i + 1) * 2 * h];
            rmsnorm(&e, &m.enorm, c.rms_eps, &mut row[..h]);
            rmsnorm(&hidden[i * h..(i + 1) * h], &m.hnorm, c.rms_eps, &mut row[h..]);
        }
        let mut x = vec![0.0f32; n * h];
        matmul(&m.eh_proj, &cat, n, &mut x);
        let mut pass = super::cpu::CpuPass {
            ops: super::cpu::CpuOps::for_positions(&self.rope, pos0, n, std::slice::from_mut(cache))
                .first_layer(m.index),
            model: self,
            on_use: &mut |_, _, _| {},
            on_ffn_input: &mut |_, _| {},
        };
        let (mut xn, mut y) = (vec![0.0f32; n * h], vec![0.0f32; n * h]);
        super::graph::run_ready(super::graph::layer(&mut pass, m.index, n, &mut x, &mut xn, &mut y))??;
        let mut out = vec![0.0f32; n * h];
        for i in 0..n {
            rmsnorm(&x[i * h..(i + 1) * h], &m.norm, c.rms_eps, &mut out[i * h..(i + 1) * h]);
        }
        let rows = if which == Logits::All { n } else { 1 };
        let mut logits = vec![0.0f32; rows * c.vocab];
        matmul(m.head.as_ref().unwrap_or(&self.lm_head), &out[(n - rows) * h..], rows, &mut logits);
        Ok((logits, out))
    }
}
