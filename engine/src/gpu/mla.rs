//! Multi-head Latent Attention on the GPU: `mla::attention` step for step, with the same
//! absorbed projections and the same compressed cache (per position the normalised latent
//! and the rotated shared key, kv_lora_rank + qk_rope_head_dim floats).
//!
//! - q: q_proj, or q_a_proj -> RMSNorm -> q_b_proj (matmul.wgsl, rmsnorm.wgsl);
//! - kv_a_proj_with_mqa writes [latent, rotary key] straight into the cache rows of the new
//!   positions; the latent part is normalised in place (rmsnorm.wgsl with a row stride);
//! - the rotary parts of q and of the cached key are rotated by rope.wgsl. Where the
//!   checkpoint pairs neighbouring dimensions (`rope_interleave`), the rows of the weights
//!   that produce them are put in de-interleaved order at upload: each output is its own
//!   row's dot product, so this gives exactly the values `rope::deinterleave` moves;
//! - absorbed queries [q_lat, q_rot] (mla_absorb.wgsl), then attention.wgsl's MLA layout
//!   (two dot products per score, the latent as the value, head-major context);
//! - per head v_h = W_uv_h ctx_h (matmul.wgsl into the (n, H*dv) layout), then o_proj.

use super::buffers::GpuMat;
use super::ops::{self, AttnShape};
use super::recorder::{Bind, Recorder};
use super::stream::Uploader;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::model::config::MlaConfig;
use crate::model::mla::{MlaWeights, QueryProj};
use crate::tensor::{Bytes, Mat};

/// transformers' default epsilon of q_a_layernorm and kv_a_layernorm (mla.rs).
const LATENT_NORM_EPS: f32 = 1e-6;

enum GpuQuery {
    Plain(GpuMat),
    LowRank { a: GpuMat, norm: wgpu::Buffer, b: GpuMat },
}

/// One layer's MLA weights on the GPU.
pub(super) struct GpuMla {
    cfg: MlaConfig,
    q: GpuQuery,
    /// (r + dr, hidden), rotary rows de-interleaved
    kv_a: GpuMat,
    /// (r)
    kv_norm: wgpu::Buffer,
    /// (H*(dn+dv), r)
    kv_b: GpuMat,
    /// Per head W_uv_h (dv, r)
    uv: Vec<GpuMat>,
    /// (hidden, H*dv)
    wo: GpuMat,
}

/// Scratch of one forward call, shared by every MLA layer.
pub(super) struct MlaScratch {
    qa: wgpu::Buffer,
    q: wgpu::Buffer,
    qc: wgpu::Buffer,
    ctx: wgpu::Buffer,
    v: wgpu::Buffer,
}

impl MlaScratch {
    pub fn new(ctx: &GpuContext, m: &MlaConfig, n_heads: usize, n: usize) -> Result<Self> {
        let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
        let buf = |label: &str, elems: usize| ctx.storage_buffer(label, elems.max(1) as u64 * 4);
        Ok(MlaScratch {
            qa: buf("mla.qa", n * m.q_lora_rank.unwrap_or(0))?,
            q: buf("mla.q", n * n_heads * (dn + dr))?,
            qc: buf("mla.qc", n * n_heads * (r + dr))?,
            ctx: buf("mla.ctx", n_heads * n * r)?,
            v: buf("mla.v", n * n_heads * dv)?,
        })
    }
}

/// `m` with rows `[start, start + dr)` of every start in `starts` put in de-interleaved
/// order (row start + i takes row start + 2i for i < dr/2, start + 2(i - dr/2) + 1 after).
fn deinterleave_rows(m: &Mat, starts: impl Iterator<Item = usize>, dr: usize) -> Result<Mat> {
    let rb = m.row_bytes();
    let src = m.bytes.as_ref();
    if src.len() != m.rows * rb {
        return Err(Error::Gpu("MLA: weight bytes do not match their shape".into()));
    }
    let mut out = src.to_vec();
    let half = dr / 2;
    for s in starts {
        for i in 0..dr {
            let from = s + if i < half { 2 * i } else { 2 * (i - half) + 1 };
            out[(s + i) * rb..(s + i + 1) * rb].copy_from_slice(&src[from * rb..(from + 1) * rb]);
        }
    }
    Mat::new(m.rows, m.cols, m.dtype, Bytes::from_vec(out))
}

impl GpuMla {
    pub fn upload(up: &Uploader, p: &str, w: &MlaWeights, m: &MlaConfig, n_heads: usize) -> Result<Self> {
        let (dn, dr, dv) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        let dq = dn + dr;
        // The rows that produce rotary values, in the order the CPU rotates them.
        let q_rot = |mat: &Mat| -> Result<GpuMat> {
            let label = format!("{p}.q");
            match m.rope_interleave {
                true => up.mat(&label, &deinterleave_rows(&up.in_memory(mat)?, (0..n_heads).map(|h| h * dq + dn), dr)?),
                false => up.mat(&label, mat),
            }
        };
        let q = match &w.q {
            QueryProj::Plain(wq) => GpuQuery::Plain(q_rot(wq)?),
            QueryProj::LowRank { a, norm, b } => GpuQuery::LowRank {
                a: up.mat(&format!("{p}.q_a"), a)?,
                norm: up.f32(&format!("{p}.q_a_norm"), norm)?,
                b: q_rot(b)?,
            },
        };
        let kv_a = match m.rope_interleave {
            true => deinterleave_rows(&up.in_memory(&w.kv_a)?, std::iter::once(m.kv_lora_rank), dr)?,
            false => w.kv_a.clone(),
        };
        let uv = w.uv.iter().enumerate().map(|(h, u)| up.mat(&format!("{p}.uv{h}"), u)).collect::<Result<_>>()?;
        if w.uv.len() != n_heads || w.kv_b.rows != n_heads * (dn + dv) {
            return Err(Error::Gpu(format!("{p}: MLA weights do not match {n_heads} heads")));
        }
        Ok(GpuMla {
            cfg: m.clone(),
            q,
            kv_a: up.mat(&format!("{p}.kv_a"), &kv_a)?,
            kv_norm: up.f32(&format!("{p}.kv_norm"), &w.kv_norm)?,
            kv_b: up.mat(&format!("{p}.kv_b"), &w.kv_b)?,
            uv,
            wo: up.mat(&format!("{p}.wo"), &w.wo)?,
        })
    }

    /// Attention of the n positions of `xn` (normalised input) from `pos0` on: appends
    /// their cache rows to `cache` ([cap, r + dr]) and writes o_proj's output to `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        rec: &mut Recorder,
        s: &MlaScratch,
        xn: &wgpu::Buffer,
        n: usize,
        pos0: usize,
        o: &crate::model::attention::AttnOpts,
        cache: &wgpu::Buffer,
        scores: &wgpu::Buffer,
        cs: Bind,
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let m = &self.cfg;
        let nh = o.n_heads;
        let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
        let (dq, w) = (dn + dr, r + dr);
        match &self.q {
            GpuQuery::Plain(wq) => ops::matmul(rec, wq, xn, 0, n, &s.q, 0, nh * dq)?,
            GpuQuery::LowRank { a, norm, b } => {
                ops::matmul(rec, a, xn, 0, n, &s.qa, 0, a.rows)?;
                ops::rmsnorm(rec, &s.qa, 0, n, a.rows, norm, LATENT_NORM_EPS)?;
                ops::matmul(rec, b, &s.qa, 0, n, &s.q, 0, nh * dq)?;
            }
        }
        ops::matmul(rec, &self.kv_a, xn, 0, n, cache, pos0 * w, w)?;
        ops::rmsnorm_strided(rec, cache, pos0 * w, n, r, w, &self.kv_norm, LATENT_NORM_EPS)?;
        ops::rope_at(rec, cache, pos0 * w + r, n, 1, w, dr / 2, cs.clone())?;
        ops::rope_at(rec, &s.q, dn, n, nh, dq, dr / 2, cs)?;
        ops::mla_absorb(rec, &self.kv_b, &s.q, &s.qc, n, nh, dn, dr, dn + dv)?;
        let shape = AttnShape {
            n,
            n_heads: nh,
            n_kv_heads: 1,
            head_dim: w,
            pos0,
            window: o.window,
            scale: o.scale,
            mla: Some((r, dr)),
        };
        ops::attention(rec, shape, &s.qc, cache, cache, scores, &s.ctx, None)?;
        for (h, uv) in self.uv.iter().enumerate() {
            ops::matmul(rec, uv, &s.ctx, h * n * r, n, &s.v, h * dv, nh * dv)?;
        }
        ops::matmul(rec, &self.wo, &s.v, 0, n, y, 0, self.wo.rows)
    }
}
