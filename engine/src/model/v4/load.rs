//! A DeepSeek-V4 checkpoint's tensors. The release names them without a prefix
//! (`embed.weight`, `layers.{l}.attn.wq_a.weight`, `layers.{l}.ffn.experts.{e}.w1.weight`,
//! `hc_head_fn`, `head.weight`); transformers 5.23's `save_pretrained` writes the same
//! layer names under `model.` (and `model.embed_tokens.weight`, `model.norm.weight`,
//! `model.hc_head.hc_fn`, ...). Both are read: each tensor is looked up under its
//! release name and under transformers', as transformers' conversion mapping pairs them.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::experts::{Expert, ResidentExperts};
use crate::format::tensors::TensorStore;
use crate::model::config::{ModelConfig, V4Attn};
use crate::model::rope::Rope;
use crate::model::Model;
use crate::tensor::DType;

use super::{Compressor, HyperConnection, Indexer, V4Attention, V4Layer, V4Weights};

/// The first of `names` the checkpoint holds (the first named when none is).
fn pick(s: &TensorStore, names: &[String]) -> String {
    names.iter().find(|n| s.contains(n)).unwrap_or(&names[0]).clone()
}

/// Layer `l`'s tensor `rest`, under `model.layers.{l}.` or `layers.{l}.`.
fn lname(s: &TensorStore, l: usize, rest: &str) -> String {
    pick(s, &[format!("model.layers.{l}.{rest}"), format!("layers.{l}.{rest}")])
}

fn top(s: &TensorStore, names: &[&str]) -> String {
    pick(s, &names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
}

fn compressor(
    s: &TensorStore,
    l: usize,
    at: &str,
    c: &ModelConfig,
    dim: usize,
    rate: usize,
    overlap: bool,
) -> Result<Compressor> {
    let h = c.hidden;
    let width = if overlap { 2 * dim } else { dim };
    Ok(Compressor {
        kv: s.mat(&lname(s, l, &format!("{at}.wkv.weight")), width, h)?,
        gate: s.mat(&lname(s, l, &format!("{at}.wgate.weight")), width, h)?,
        ape: s.vector_2d(&lname(s, l, &format!("{at}.ape")), rate, width)?,
        norm: s.vector(&lname(s, l, &format!("{at}.norm.weight")), dim)?,
        dim,
        rate,
        overlap,
    })
}

fn hyper(s: &TensorStore, l: usize, which: &str, c: &ModelConfig, n_hc: usize) -> Result<HyperConnection> {
    let m = (2 + n_hc) * n_hc;
    Ok(HyperConnection {
        fn_: s.mat(&lname(s, l, &format!("hc_{which}_fn")), m, n_hc * c.hidden)?,
        base: s.vector(&lname(s, l, &format!("hc_{which}_base")), m)?,
        scale: s.vector(&lname(s, l, &format!("hc_{which}_scale")), 3)?,
    })
}

/// `tid2eid` (vocab, top_k) of little-endian I32 or I64 ids (kept as bytes by the
/// tensor store), each checked against the expert count.
fn tid2eid(s: &TensorStore, name: &str, c: &ModelConfig) -> Result<Vec<u32>> {
    let (v, k, ne) = (c.vocab, c.router.top_k, c.router.n_experts);
    let t = s.get(name)?;
    let width = match (t.dtype, t.shape.as_slice()) {
        (DType::U8, [rows, cols]) if *rows == v && (*cols == 4 * k || *cols == 8 * k) => cols / k,
        _ => {
            return Err(Error::Invalid(format!(
                "tensor {name}: expected ({v}, {k}) integer expert ids, got {:?} {:?}",
                t.dtype, t.shape
            )))
        }
    };
    let bytes: &[u8] = t.bytes.as_ref();
    if bytes.len() != v * k * width {
        return Err(Error::Invalid(format!("tensor {name}: {} bytes, expected {}", bytes.len(), v * k * width)));
    }
    bytes
        .chunks_exact(width)
        .map(|b| {
            let id = match width {
                4 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
                _ => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            };
            u32::try_from(id)
                .ok()
                .filter(|&e| (e as usize) < ne)
                .ok_or_else(|| Error::Invalid(format!("tensor {name}: expert id {id} is not one of the {ne} experts")))
        })
        .collect()
}

fn mlp(s: &TensorStore, l: usize, at: &str, h: usize, inter: usize) -> Result<Expert> {
    Ok(Expert {
        gate: s.mat(&lname(s, l, &format!("{at}.w1.weight")), inter, h)?,
        up: s.mat(&lname(s, l, &format!("{at}.w3.weight")), inter, h)?,
        down: s.mat(&lname(s, l, &format!("{at}.w2.weight")), h, inter)?,
    })
}

fn layer(s: &TensorStore, c: &ModelConfig, l: usize) -> Result<V4Layer> {
    let v4 = c.v4.as_deref().ok_or_else(|| Error::Invalid("not a deepseek_v4 config".into()))?;
    let (h, nh, hd) = (c.hidden, c.n_heads, c.head_dim);
    let (qr, g, r) = (v4.q_lora_rank, v4.o_groups, v4.o_lora_rank);
    let o_a = s.mat(&lname(s, l, "attn.wo_a.weight"), g * r, nh * hd / g)?;
    let kind = v4.layers[l];
    let comp = match v4.rate_of(kind) {
        Some(rate) => Some(compressor(s, l, "attn.compressor", c, hd, rate, kind == V4Attn::Csa)?),
        None => None,
    };
    let indexer = match kind {
        V4Attn::Csa => {
            let (hi, di) = (v4.index_heads, v4.index_head_dim);
            Some(Indexer {
                comp: compressor(s, l, "attn.indexer.compressor", c, di, v4.csa_rate, true)?,
                q_b: s.mat(&lname(s, l, "attn.indexer.wq_b.weight"), hi * di, qr)?,
                weights: s.mat(&lname(s, l, "attn.indexer.weights_proj.weight"), hi, h)?,
            })
        }
        _ => None,
    };
    let attn = V4Attention {
        q_a: s.mat(&lname(s, l, "attn.wq_a.weight"), qr, h)?,
        q_a_norm: s.vector(&lname(s, l, "attn.q_norm.weight"), qr)?,
        q_b: s.mat(&lname(s, l, "attn.wq_b.weight"), nh * hd, qr)?,
        ones: vec![1.0; hd],
        kv: s.mat(&lname(s, l, "attn.wkv.weight"), hd, h)?,
        kv_norm: s.vector(&lname(s, l, "attn.norm.weight"), hd)?,
        o_a: (0..g).map(|gi| o_a.row_block(gi * r, r)).collect::<Result<_>>()?,
        o_b: s.mat(&lname(s, l, "attn.wo_b.weight"), h, g * r)?,
        sinks: s.vector(&lname(s, l, "attn.attn_sink"), nh)?,
        comp,
        indexer,
    };
    let ne = c.router.n_experts;
    let hash = v4.hash[l];
    Ok(V4Layer {
        attn_norm: s.vector(&lname(s, l, "attn_norm.weight"), h)?,
        ffn_norm: s.vector(&lname(s, l, "ffn_norm.weight"), h)?,
        attn,
        attn_hc: hyper(s, l, "attn", c, v4.hc_mult)?,
        ffn_hc: hyper(s, l, "ffn", c, v4.hc_mult)?,
        router: s.mat(&lname(s, l, "ffn.gate.weight"), ne, h)?,
        correction_bias: match hash {
            false => Some(s.vector(&lname(s, l, "ffn.gate.bias"), ne)?),
            true => None,
        },
        tid2eid: match hash {
            true => Some(tid2eid(s, &lname(s, l, "ffn.gate.tid2eid"), c)?),
            false => None,
        },
        shared: mlp(s, l, "ffn.shared_experts", h, c.expert_intermediate)?,
    })
}

/// The model of a deepseek_v4 checkpoint. From a streamed checkpoint
/// ([`TensorStore::open_dir_streamed`]) the dense weights are read now and the routed
/// experts when used, `expert_budget` bytes of them kept ([`crate::experts::streamed`]);
/// else every tensor is in memory already.
pub fn model(cfg: ModelConfig, s: &TensorStore, expert_budget: u64) -> Result<Model> {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(reader) = s.reader() {
        let s = s.resident(crate::format::tensors::is_routed_expert_weight)?;
        let experts = routed_experts(&cfg, &s)?;
        let source = crate::experts::streamed::StreamedExperts::new(experts, reader, expert_budget);
        return assemble(cfg, &s, Box::new(source));
    }
    #[cfg(target_arch = "wasm32")]
    let _ = expert_budget;
    let experts = routed_experts(&cfg, s)?;
    assemble(cfg, s, Box::new(ResidentExperts { layers: experts }))
}

/// Every layer's routed experts (`ffn.experts.{e}.w1/w3/w2`), as views of `s`'s tensors.
fn routed_experts(c: &ModelConfig, s: &TensorStore) -> Result<Vec<Vec<Arc<Expert>>>> {
    let (h, inter) = (c.hidden, c.expert_intermediate);
    (0..c.n_layers)
        .map(|l| {
            (0..c.router.n_experts).map(|e| mlp(s, l, &format!("ffn.experts.{e}"), h, inter).map(Arc::new)).collect()
        })
        .collect()
}

/// The model of `s`'s dense tensors (release or transformers names) with its routed
/// experts from `experts`: a checkpoint's ([`model`]) or a converted container's
/// ([`Model::from_parts`]).
pub fn assemble(cfg: ModelConfig, s: &TensorStore, experts: Box<dyn crate::experts::ExpertSource>) -> Result<Model> {
    let c = &cfg;
    let v4 = c.v4.as_deref().ok_or_else(|| Error::Invalid("not a deepseek_v4 config".into()))?;
    let (h, nhc) = (c.hidden, v4.hc_mult);
    let embed = s.mat(&top(s, &["model.embed_tokens.weight", "embed.weight"]), c.vocab, h)?;
    let lm_head = s.mat(&top(s, &["head.weight", "lm_head.weight"]), c.vocab, h)?;
    let final_norm = s.vector(&top(s, &["model.norm.weight", "norm.weight"]), h)?;
    let layers = (0..c.n_layers).map(|l| layer(s, c, l)).collect::<Result<Vec<_>>>()?;
    let w = V4Weights {
        layers,
        head_fn: s.mat(&top(s, &["model.hc_head.hc_fn", "hc_head_fn"]), nhc, nhc * h)?,
        head_base: s.vector(&top(s, &["model.hc_head.hc_base", "hc_head_base"]), nhc)?,
        head_scale: s.vector(&top(s, &["model.hc_head.hc_scale", "hc_head_scale"]), 1)?,
        hc_ones: vec![1.0; nhc * h],
        main_rope: Rope::new(&v4.main_rope),
        compress_rope: Rope::new(&v4.compress_rope),
    };
    Ok(Model {
        rope: Rope::new(&c.rope),
        final_norm,
        mtp: None,
        embed,
        lm_head,
        layers: Vec::new(),
        experts,
        v4: Some(Box::new(w)),
        cfg,
    })
}
