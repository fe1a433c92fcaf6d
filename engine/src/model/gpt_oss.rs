//! gpt_oss's routed experts as its checkpoints store them: per layer, fused tensors in
//! `x @ W` orientation, `mlp.experts.gate_up_proj` [E, hidden, 2*inter] whose columns
//! alternate gate and up (transformers: `gate, up = gate_up[..., ::2], gate_up[..., 1::2]`)
//! and `mlp.experts.down_proj` [E, inter, hidden], with biases `gate_up_proj_bias`
//! [E, 2*inter] and `down_proj_bias` [E, hidden]. The engine's experts are row-major
//! `(out, in)` matrices, so each expert is transposed once at load, keeping its stored type.
//!
//! The released checkpoints (`quantization_config.quant_method == "mxfp4"`) store the two
//! weights as MXFP4 in `(out, in)` orientation instead: `{w}_blocks` [E, out, in/32, 16]
//! (two e2m1 values per byte, low nibble first) and `{w}_scales` [E, out, in/32] (e8m0),
//! gate and up in alternate rows of gate_up_proj. Their rows are repacked, bytes unchanged,
//! into the engine's MXFP4 rows (tensor.rs), and stay MXFP4 from there on.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::experts::Expert;
use crate::format::tensors::TensorStore;
use crate::model::config::ModelConfig;
use crate::model::moe::ExpertBiases;
use crate::tensor::{Bytes, DType, Mat, MXFP4_BLOCK};

/// `[count, rows]` matrix whose row r is column `pick(r)` of slice `index` of the 3-D
/// float tensor `name` `[n, rows, cols]`, in the tensor's own type.
fn transposed(
    s: &TensorStore,
    name: &str,
    index: usize,
    dims: [usize; 3],
    count: usize,
    pick: impl Fn(usize) -> usize,
) -> Result<Mat> {
    let t = s.get(name)?;
    let [n, rows, cols] = dims;
    if t.shape != dims {
        return Err(Error::Shape { name: name.to_string(), got: t.shape.clone(), want: dims.to_vec() });
    }
    let es = match t.dtype {
        DType::F32 => 4,
        DType::BF16 | DType::F16 => 2,
        other => return Err(Error::Invalid(format!("tensor {name}: type {other} cannot be transposed"))),
    };
    if t.bytes.len() != n * rows * cols * es || index >= n {
        return Err(Error::Invalid(format!("tensor {name}: {} bytes for shape {dims:?}", t.bytes.len())));
    }
    let src = &t.bytes.as_ref()[index * rows * cols * es..(index + 1) * rows * cols * es];
    let mut out = Vec::with_capacity(count * rows * es);
    for r in 0..count {
        let c = pick(r);
        for k in 0..rows {
            let at = (k * cols + c) * es;
            out.extend_from_slice(&src[at..at + es]);
        }
    }
    Mat::new(count, rows, t.dtype, Bytes::from_vec(out))
}

/// A U8 tensor of exactly `shape` (MXFP4 blocks or scales), its bytes.
fn u8_tensor<'a>(s: &'a TensorStore, name: &str, shape: &[usize]) -> Result<&'a [u8]> {
    let t = s.get(name)?;
    if t.shape != shape {
        return Err(Error::Shape { name: name.to_string(), got: t.shape.clone(), want: shape.to_vec() });
    }
    if t.dtype != DType::U8 || t.bytes.len() != shape.iter().product::<usize>() {
        return Err(Error::Invalid(format!("tensor {name}: MXFP4 blocks and scales must be U8, got {}", t.dtype)));
    }
    Ok(t.bytes.as_ref())
}

/// `[count, cols]` MXFP4 matrix whose row r is row `pick(r)` of expert `index` of the
/// MXFP4 weight `base` ([n, rows, cols] as `{base}_blocks` + `{base}_scales`).
fn mxfp4_rows(
    s: &TensorStore,
    base: &str,
    index: usize,
    [n, rows, cols]: [usize; 3],
    count: usize,
    pick: impl Fn(usize) -> usize,
) -> Result<Mat> {
    if !cols.is_multiple_of(MXFP4_BLOCK) || index >= n {
        return Err(Error::Invalid(format!("{base}: {cols} columns are not whole MXFP4 blocks of 32")));
    }
    let g = cols / MXFP4_BLOCK;
    let blocks = u8_tensor(s, &format!("{base}_blocks"), &[n, rows, g, 16])?;
    let scales = u8_tensor(s, &format!("{base}_scales"), &[n, rows, g])?;
    let rb = DType::Mxfp4.row_bytes(cols).unwrap_or(0);
    let values_at = rb - g * 16;
    let mut out = vec![0u8; count * rb];
    for (r, dst) in out.chunks_exact_mut(rb.max(1)).enumerate() {
        let src = index * rows + pick(r);
        dst[..g].copy_from_slice(&scales[src * g..(src + 1) * g]);
        dst[values_at..].copy_from_slice(&blocks[src * g * 16..(src + 1) * g * 16]);
    }
    Mat::new(count, cols, DType::Mxfp4, Bytes::from_vec(out))
}

/// The routed experts of one layer (`moe` = "model.layers.{l}.mlp").
pub fn load_experts(s: &TensorStore, moe: &str, c: &ModelConfig) -> Result<Vec<Arc<Expert>>> {
    let (h, i, ne) = (c.hidden, c.expert_intermediate, c.router.n_experts);
    let (gu, down) = (format!("{moe}.experts.gate_up_proj"), format!("{moe}.experts.down_proj"));
    if s.contains(&format!("{gu}_blocks")) {
        return (0..ne)
            .map(|e| {
                Ok(Arc::new(Expert {
                    gate: mxfp4_rows(s, &gu, e, [ne, 2 * i, h], i, |r| 2 * r)?,
                    up: mxfp4_rows(s, &gu, e, [ne, 2 * i, h], i, |r| 2 * r + 1)?,
                    down: mxfp4_rows(s, &down, e, [ne, h, i], h, |r| r)?,
                }))
            })
            .collect();
    }
    (0..ne)
        .map(|e| {
            Ok(Arc::new(Expert {
                gate: transposed(s, &gu, e, [ne, h, 2 * i], i, |r| 2 * r)?,
                up: transposed(s, &gu, e, [ne, h, 2 * i], i, |r| 2 * r + 1)?,
                down: transposed(s, &down, e, [ne, i, h], h, |r| r)?,
            }))
        })
        .collect()
}

/// The experts' biases of one layer, gate and up taken apart.
pub fn load_biases(s: &TensorStore, moe: &str, c: &ModelConfig) -> Result<ExpertBiases> {
    let (h, i, ne) = (c.hidden, c.expert_intermediate, c.router.n_experts);
    let gu = s.vector_2d(&format!("{moe}.experts.gate_up_proj_bias"), ne, 2 * i)?;
    let down = s.vector_2d(&format!("{moe}.experts.down_proj_bias"), ne, h)?;
    Ok(ExpertBiases {
        gate: gu.iter().step_by(2).copied().collect(),
        up: gu.iter().skip(1).step_by(2).copied().collect(),
        down,
        inter: i,
        hidden: h,
    })
}
