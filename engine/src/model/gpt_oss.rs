//! gpt_oss's routed experts as its checkpoints store them: per layer, fused tensors in
//! `x @ W` orientation, `mlp.experts.gate_up_proj` [E, hidden, 2*inter] whose columns
//! alternate gate and up (transformers: `gate, up = gate_up[..., ::2], gate_up[..., 1::2]`)
//! and `mlp.experts.down_proj` [E, inter, hidden], with biases `gate_up_proj_bias`
//! [E, 2*inter] and `down_proj_bias` [E, hidden]. The engine's experts are row-major
//! `(out, in)` matrices, so each expert is transposed once at load, keeping its stored type.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::experts::Expert;
use crate::format::tensors::TensorStore;
use crate::model::config::ModelConfig;
use crate::model::moe::ExpertBiases;
use crate::tensor::{Bytes, DType, Mat};

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

/// The routed experts of one layer (`moe` = "model.layers.{l}.mlp").
pub fn load_experts(s: &TensorStore, moe: &str, c: &ModelConfig) -> Result<Vec<Arc<Expert>>> {
    let (h, i, ne) = (c.hidden, c.expert_intermediate, c.router.n_experts);
    let (gu, down) = (format!("{moe}.experts.gate_up_proj"), format!("{moe}.experts.down_proj"));
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
