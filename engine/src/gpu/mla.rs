//! Multi-head Latent Attention's weights on the GPU. The pass itself is the graph's one
//! description (`model::graph::mla`), recorded with the GPU's operations
//! (`gpu::backend`): q_proj or q_a_proj -> RMSNorm -> q_b_proj (matmul.wgsl,
//! rmsnorm.wgsl), kv_a_proj_with_mqa and the strided RMSNorm of its latent part, RoPE of
//! the rotary parts (rope.wgsl, or rope_pairs.wgsl where the checkpoint pairs neighbouring
//! dimensions), the absorbed queries (mla_absorb.wgsl), attention.wgsl's MLA layout (two
//! dot products per score, the latent as the value, head-major context) over the cache
//! rows [latent, rotary key], per head v_h = W_uv_h ctx_h into the (n, H*dv) layout, and
//! o_proj.

use super::buffers::GpuMat;
use super::stream::Uploader;
use crate::error::{Error, Result};
use crate::model::config::MlaConfig;
use crate::model::mla::MlaWeights;

/// One layer's MLA weights on the GPU.
pub(super) type GpuMla = MlaWeights<GpuMat, wgpu::Buffer>;

/// Uploads layer `p`'s MLA weights.
pub(super) fn upload(up: &Uploader, p: &str, w: &MlaWeights, m: &MlaConfig, n_heads: usize) -> Result<GpuMla> {
    if w.uv.len() != n_heads || w.kv_b.rows != n_heads * (m.qk_nope_head_dim + m.v_head_dim) {
        return Err(Error::Gpu(format!("{p}: MLA weights do not match {n_heads} heads")));
    }
    w.try_map(|name, x| up.mat(&format!("{p}.{name}"), x), |name, v| up.f32(&format!("{p}.{name}"), v))
}
