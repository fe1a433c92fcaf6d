//! The dense weights on the GPU (embedding, attention, norms, routers, shared experts,
//! dense MLPs, lm_head) and their upload, layer by layer through an [`Uploader`]: from
//! memory, or streamed from the data file ([`super::stream`]). Routed experts are not
//! here: they go to the pool ([`super::pool`]) when first routed to.

use super::buffers::GpuMat;
use super::deltanet::{self, GpuDeltaNet};
use super::mla::{self, GpuMla};
use super::ops;
use super::pool::GpuExpert;
use super::recorder::Recorder;
use super::stream::Uploader;
use crate::error::{Error, Result};
use crate::model::attention::GqaWeights;
use crate::model::v4::{Compressor, HyperConnection, Indexer, V4Attention, V4Layer, V4Weights};
use crate::model::{AttnWeights, Ffn, Model};

/// One layer's attention weights on the GPU, by variant (model::AttnWeights).
pub(super) enum GpuAttn {
    Gqa(Box<GqaWeights<GpuMat, wgpu::Buffer>>),
    Mla(Box<GpuMla>),
    Linear(Box<GpuDeltaNet>),
}

/// A MoE layer's router: its weights, its own bias (added to the logits) and the
/// selection bias (`e_score_correction_bias`).
pub(super) struct GpuRouter {
    pub(super) w: GpuMat,
    pub(super) bias: Option<wgpu::Buffer>,
    pub(super) correction: Option<wgpu::Buffer>,
}

impl GpuRouter {
    /// Routes the n positions of `xn` (MoeBlock::router_logits, then moe::route) into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn route(
        &self,
        rec: &mut Recorder,
        xn: &wgpu::Buffer,
        n: usize,
        logits: &wgpu::Buffer,
        probs: &wgpu::Buffer,
        out: &wgpu::Buffer,
        cfg: &crate::model::config::RouterConfig,
    ) -> Result<()> {
        let ne = self.w.rows;
        ops::matmul(rec, &self.w, xn, 0, n, logits, 0, ne)?;
        if let Some(b) = &self.bias {
            ops::add(rec, logits, 0, b, 0, n * ne, ne)?;
        }
        ops::route(rec, logits, probs, out, n, cfg, self.correction.as_ref())
    }
}

pub(super) enum GpuFfn {
    Dense(GpuExpert),
    Moe(Box<GpuMoe>),
}

/// A MoE layer's resident parts; the routed experts live in the pool.
pub(super) struct GpuMoe {
    pub(super) router: GpuRouter,
    pub(super) biases: Option<ExpertBiases>,
    /// The shared expert with its sigmoid gate (qwen2_moe) or without (added as is).
    pub(super) shared: Option<(GpuExpert, Option<GpuMat>)>,
}

/// Every routed expert's biases of one layer (gpt_oss), resident like the dense weights:
/// gate and up (n_experts, inter), down (n_experts, hidden).
pub(super) struct ExpertBiases {
    pub(super) gate: wgpu::Buffer,
    pub(super) up: wgpu::Buffer,
    pub(super) down: wgpu::Buffer,
}

pub(super) struct GpuLayer {
    pub(super) attn_norm: wgpu::Buffer,
    pub(super) attn: GpuAttn,
    pub(super) ffn_norm: wgpu::Buffer,
    pub(super) ffn: GpuFfn,
}

/// Every dense weight of a model on the GPU.
pub(super) struct DenseWeights {
    pub(super) embed: GpuMat,
    pub(super) lm_head: GpuMat,
    pub(super) final_norm: wgpu::Buffer,
    pub(super) layers: Vec<GpuLayer>,
    /// DeepSeek-V4's layers and MoE parts.
    pub(super) v4: Option<GpuV4>,
    /// Largest intermediate size of any FFN (sizes the expert scratch buffers).
    pub(super) max_inter: usize,
    /// Their GPU bytes.
    pub(super) bytes: u64,
}

/// Uploads the dense weights of `m`, layer by layer.
pub(super) fn upload(m: &Model, up: &Uploader) -> Result<DenseWeights> {
    let c = &m.cfg;
    let cx = up.ctx;
    let embed = up.mat("embed", &m.embed)?;
    let lm_head = if m.embed.bytes.same(&m.lm_head.bytes) { embed.clone() } else { up.mat("lm_head", &m.lm_head)? };
    let mut max_inter = c.expert_intermediate.max(c.dense_intermediate).max(c.shared_expert_intermediate.unwrap_or(0));
    let mut layers = Vec::with_capacity(m.layers.len());
    for (l, layer) in m.layers.iter().enumerate() {
        let p = format!("layer{l}");
        let attn = match (&layer.attn, &layer.attn_opts.mla) {
            (AttnWeights::Mla(w), Some(m)) => GpuAttn::Mla(Box::new(mla::upload(up, &p, w, m, c.n_heads)?)),
            (AttnWeights::Linear(d), None) => GpuAttn::Linear(Box::new(deltanet::upload(up, &p, d)?)),
            (AttnWeights::Gqa(a), None) => GpuAttn::Gqa(Box::new(
                a.try_map(|name, m| up.mat(&format!("{p}.{name}"), m), |name, v| up.f32(&format!("{p}.{name}"), v))?,
            )),
            _ => return Err(Error::Gpu(format!("layer {l}: attention weights and options are of different variants"))),
        };
        let ffn = match &layer.ffn {
            Ffn::Dense(mlp) => {
                max_inter = max_inter.max(mlp.gate.rows);
                GpuFfn::Dense(up.expert(&format!("{p}.mlp"), mlp)?)
            }
            Ffn::Moe(block) => GpuFfn::Moe(Box::new(GpuMoe {
                router: GpuRouter {
                    w: up.mat(&format!("{p}.router"), &block.router)?,
                    bias: up.opt_f32(&format!("{p}.router_bias"), &block.router_bias)?,
                    correction: up.opt_f32(&format!("{p}.correction_bias"), &block.correction_bias)?,
                },
                biases: match &block.expert_bias {
                    Some(b) => Some(ExpertBiases {
                        gate: up.f32(&format!("{p}.experts.gate_bias"), &b.gate)?,
                        up: up.f32(&format!("{p}.experts.up_bias"), &b.up)?,
                        down: up.f32(&format!("{p}.experts.down_bias"), &b.down)?,
                    }),
                    None => None,
                },
                shared: match &block.shared {
                    Some(shared) => {
                        max_inter = max_inter.max(shared.mlp.gate.rows);
                        let gate = shared.gate.as_ref().map(|g| up.mat(&format!("{p}.shared_gate"), g));
                        Some((up.expert(&format!("{p}.shared"), &shared.mlp)?, gate.transpose()?))
                    }
                    None => None,
                },
            })),
        };
        layers.push(GpuLayer {
            attn_norm: up.f32(&format!("{p}.attn_norm"), &layer.attn_norm)?,
            attn,
            ffn_norm: up.f32(&format!("{p}.ffn_norm"), &layer.ffn_norm)?,
            ffn,
        });
        // Hand the staged uploads to the device layer by layer rather than all at once.
        cx.queue.submit([]);
        cx.take_error()?;
    }
    // DeepSeek-V4's layers are its own (m.layers is empty then).
    let v4 = upload_v4(m, up, &mut max_inter)?;
    let final_norm = up.f32("final_norm", &m.final_norm)?;
    cx.take_error()?;
    Ok(DenseWeights { embed, lm_head, final_norm, layers, v4, max_inter, bytes: up.bytes() })
}

/// A V4 model's GPU weights: what the graph reads (the routers, tid2eid and shared
/// experts stay in host form there, the graph does not read them) and each layer's MoE.
pub(super) struct GpuV4 {
    pub(super) w: V4Weights<GpuMat, wgpu::Buffer>,
    pub(super) moe: Vec<GpuMoe>,
}

/// Uploads a V4 model's weights beyond the embedding, final norm and head; None for
/// another family. `max_inter` grows to the shared experts' width.
pub(super) fn upload_v4(m: &Model, up: &Uploader, max_inter: &mut usize) -> Result<Option<GpuV4>> {
    let Some(w) = m.v4.as_deref() else { return Ok(None) };
    let comp = |p: &str, c: &Compressor| -> Result<Compressor<GpuMat, wgpu::Buffer>> {
        Ok(Compressor {
            kv: up.mat(&format!("{p}.kv"), &c.kv)?,
            gate: up.mat(&format!("{p}.gate"), &c.gate)?,
            ape: up.f32(&format!("{p}.ape"), &c.ape)?,
            norm: up.f32(&format!("{p}.norm"), &c.norm)?,
            dim: c.dim,
            rate: c.rate,
            overlap: c.overlap,
        })
    };
    let hc = |p: &str, h: &HyperConnection| -> Result<HyperConnection<GpuMat, wgpu::Buffer>> {
        Ok(HyperConnection {
            fn_: up.mat(&format!("{p}.fn"), &h.fn_)?,
            base: up.f32(&format!("{p}.base"), &h.base)?,
            scale: up.f32(&format!("{p}.scale"), &h.scale)?,
        })
    };
    let mut layers = Vec::with_capacity(w.layers.len());
    let mut moe = Vec::with_capacity(w.layers.len());
    for (l, lw) in w.layers.iter().enumerate() {
        let p = format!("layer{l}");
        let a = &lw.attn;
        let attn = V4Attention {
            q_a: up.mat(&format!("{p}.q_a"), &a.q_a)?,
            q_a_norm: up.f32(&format!("{p}.q_a_norm"), &a.q_a_norm)?,
            q_b: up.mat(&format!("{p}.q_b"), &a.q_b)?,
            ones: up.f32(&format!("{p}.ones"), &a.ones)?,
            kv: up.mat(&format!("{p}.kv"), &a.kv)?,
            kv_norm: up.f32(&format!("{p}.kv_norm"), &a.kv_norm)?,
            o_a: a.o_a.iter().enumerate().map(|(g, o)| up.mat(&format!("{p}.o_a{g}"), o)).collect::<Result<_>>()?,
            o_b: up.mat(&format!("{p}.o_b"), &a.o_b)?,
            sinks: up.f32(&format!("{p}.sinks"), &a.sinks)?,
            comp: a.comp.as_ref().map(|c| comp(&format!("{p}.comp"), c)).transpose()?,
            indexer: match &a.indexer {
                Some(ix) => Some(Indexer {
                    comp: comp(&format!("{p}.index"), &ix.comp)?,
                    q_b: up.mat(&format!("{p}.index.q_b"), &ix.q_b)?,
                    weights: up.mat(&format!("{p}.index.weights"), &ix.weights)?,
                }),
                None => None,
            },
        };
        *max_inter = (*max_inter).max(lw.shared.gate.rows);
        moe.push(GpuMoe {
            router: GpuRouter {
                w: up.mat(&format!("{p}.router"), &lw.router)?,
                bias: None,
                correction: up.opt_f32(&format!("{p}.correction_bias"), &lw.correction_bias)?,
            },
            biases: None,
            shared: Some((up.expert(&format!("{p}.shared"), &lw.shared)?, None)),
        });
        layers.push(V4Layer {
            attn_norm: up.f32(&format!("{p}.attn_norm"), &lw.attn_norm)?,
            ffn_norm: up.f32(&format!("{p}.ffn_norm"), &lw.ffn_norm)?,
            attn,
            attn_hc: hc(&format!("{p}.attn_hc"), &lw.attn_hc)?,
            ffn_hc: hc(&format!("{p}.ffn_hc"), &lw.ffn_hc)?,
            // The MoE runs from `moe` above; the graph reads none of these.
            router: lw.router.clone(),
            correction_bias: lw.correction_bias.clone(),
            tid2eid: lw.tid2eid.clone(),
            shared: lw.shared.clone(),
        });
        up.ctx.queue.submit([]);
        up.ctx.take_error()?;
    }
    let w = V4Weights {
        layers,
        head_fn: up.mat("hc_head.fn", &w.head_fn)?,
        head_base: up.f32("hc_head.base", &w.head_base)?,
        head_scale: up.f32("hc_head.scale", &w.head_scale)?,
        hc_ones: up.f32("hc_ones", &w.hc_ones)?,
        main_rope: w.main_rope.clone(),
        compress_rope: w.compress_rope.clone(),
    };
    Ok(Some(GpuV4 { w, moe }))
}
