//! The values of a planned GGUF tensor ([`super::gguf_import::Planned`]) in the stored
//! type a conversion asks for: bytes copied or moved where the container can hold the GGUF
//! values exactly (docs/gguf.md, "Tensor types"), else decoded to f32 and quantized as
//! `coli convert` quantizes safetensors; and the tensors that llama.cpp's converter built
//! out of several Hugging Face ones (or the reverse) put back.

use super::gguf::{GgmlType, Gguf, TensorInfo};
use super::gguf_plan::{err, KvSplit, Planned, Qkvz, ValueMap};
use super::gguf_quant::{self as q, dequantize, mxfp4_row, q4k_row, q5k_row, repack_row, to_int8_row};
use super::quant::quantize_row;
use super::tensors::TensorEntry;
use crate::error::Result;
use crate::tensor::{Bytes, DType};

/// The GGUF row order of Hugging Face row `r` of a matrix whose rows were permuted for
/// rope with `heads` heads of `hd` rows (convert_hf_to_gguf's `permute`: row
/// `h*hd + j*hd/2 + i` went to `h*hd + 2*i + j`).
fn gguf_row(r: usize, hd: usize) -> usize {
    let (h, rem) = (r / hd, r % hd);
    let (j, i) = (rem / (hd / 2), rem % (hd / 2));
    h * hd + 2 * i + j
}

/// The stored type that keeps the values of a GGUF tensor of type `ty` exactly, where
/// colibri's container has one (Q4_K and Q5_K: their blocks as [`DType::Q4K`] and
/// [`DType::Q5K`]; Q4_0: int4/g32; Q8_0, Q5_0, IQ4_NL and MXFP4: int8/g32). The others
/// are re-quantized from their exact f32 values: Q4_1, Q5_1, Q6_K and IQ4_XS (offsets,
/// 8-bit sub-scales, non-linear levels) to int8 with group [`REQUANT_GROUP`], Q2_K, Q3_K
/// and the grid-coded types to int4 with group [`LOW_BIT_GROUP`].
pub fn keep_dtype(ty: GgmlType) -> DType {
    match ty.id {
        q::F32 => DType::F32,
        q::F16 => DType::F16,
        q::BF16 => DType::BF16,
        q::Q4_0 => DType::Int4 { group: 32 },
        q::Q4_K => DType::Q4K,
        q::Q5_K => DType::Q5K,
        q::Q4_1 | q::Q5_1 | q::Q6_K | q::IQ4_XS => DType::Int8 { group: REQUANT_GROUP },
        q::Q2_K | q::Q3_K => DType::Int4 { group: LOW_BIT_GROUP },
        id if q::GRID_CODED.contains(&id) => DType::Int4 { group: LOW_BIT_GROUP },
        _ => DType::Int8 { group: 32 },
    }
}

/// The int4 group of Q2_K and Q3_K (2.6 and 3.4 bits per value: whole files of the
/// largest models). int4/g32 is Q4_0's size (4.5 bits), 1.3 to 1.7 times the file where
/// int8 would be 2.4 to 3.1 times, and its step (amax / 7 per 32 values) is finer than
/// their own 4 or 8 levels per 16 values, so it adds little to their error (docs/gguf.md
/// "Tensor types": the fixture's logits 0.4% further from the f16 model's for Q2_K, 3% for
/// Q3_K_M; IQ4_XS, whose 16 non-linear levels int4 cannot follow, would be 38%).
pub const LOW_BIT_GROUP: u32 = 32;

/// The int8 group of the K-quants the container cannot keep (Q5_K, Q6_K: a Q4_K_M file's
/// output, half of its attn_v and ffn_down). Their values are re-quantized either way, and
/// int8's step with one scale per 128 values (amax / 127) is still a few times finer than
/// those formats' own (a 6-bit step per 16 values for Q6_K, 5-bit per 32 for Q5_K); the
/// int8 kernels run faster per byte with fewer scales (the default conversion's int8 uses
/// 128 for the same reason: docs/benchmarks.md "int8 group 128 in the default").
pub const REQUANT_GROUP: u32 = 128;

/// True if `dtype` can hold the values of a `ty` tensor exactly and [`tensor`] writes
/// them directly (MXFP4 into int8: when its scales fit f16, else re-quantized).
pub fn stores_exactly(ty: GgmlType, dtype: DType) -> bool {
    let g32 = dtype.group() == Some(32);
    match (ty.id, dtype) {
        (_, DType::F32) => true,
        (q::F16, DType::F16) | (q::BF16, DType::BF16) => true,
        (q::Q8_0 | q::Q4_0 | q::Q5_0 | q::IQ4_NL | q::MXFP4, DType::Int8 { .. }) => g32,
        (q::Q4_0, DType::Int4 { .. }) => g32,
        (q::MXFP4, DType::Mxfp4) => true,
        (q::Q4_K, DType::Q4K) | (q::Q5_K, DType::Q5K) => true,
        _ => false,
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty.id, q::F32 | q::F16 | q::BF16)
}

/// [`keep_dtype`] for a planned tensor: a kv_b_proj put back together from quantized
/// halves is re-quantized to int8 with group 32 (its rows are the halves' columns, so no
/// block survives); from float halves it keeps their type (f32 if they differ).
pub fn keep_dtype_for(g: &Gguf, p: &Planned) -> DType {
    let ty = g.tensors[p.src].ty;
    if p.interleave.is_some() || p.values.is_some() {
        return DType::F32;
    }
    // Columns moved (qwen35moe's value heads): a float type keeps its values, a block
    // type's blocks do not survive.
    if p.vheads.is_some_and(|v| v.cols) && !is_float(ty) {
        return DType::Int8 { group: 32 };
    }
    if let Some(x) = p.qkvz {
        let gty = g.tensors[x.gate].ty;
        if gty != ty {
            return if is_float(ty) && is_float(gty) { DType::F32 } else { DType::Int8 { group: 32 } };
        }
    }
    if ty.id == q::MXFP4 && p.expert_of.is_some() {
        return DType::Mxfp4; // gpt-oss's experts, run as they are
    }
    match p.kv_split {
        None => keep_dtype(ty),
        Some(s) => {
            let vty = g.tensors[s.v_src].ty;
            match (is_float(ty) && is_float(vty), ty == vty) {
                (true, true) => keep_dtype(ty),
                (true, false) => DType::F32,
                _ => DType::Int8 { group: 32 },
            }
        }
    }
}

/// [`stores_exactly`] for a planned tensor (a put-together kv_b_proj: f32, or the float
/// type both halves have).
pub fn stores_exactly_for(g: &Gguf, p: &Planned, dtype: DType) -> bool {
    let ty = g.tensors[p.src].ty;
    if p.interleave.is_some() || p.values.is_some() {
        return dtype == DType::F32;
    }
    if p.vheads.is_some_and(|v| v.cols) {
        return dtype == DType::F32 || (is_float(ty) && dtype == keep_dtype(ty));
    }
    if let Some(x) = p.qkvz {
        return stores_exactly(ty, dtype) && stores_exactly(g.tensors[x.gate].ty, dtype);
    }
    match p.kv_split {
        None => stores_exactly(ty, dtype),
        Some(s) => {
            let vty = g.tensors[s.v_src].ty;
            dtype == DType::F32 || (ty == vty && is_float(ty) && dtype == keep_dtype(ty))
        }
    }
}

/// Where the tensor data of a GGUF (or of each part of a split GGUF) is read from: the
/// files' bytes in memory (`[Bytes]`), or the files themselves, read with pread as each
/// tensor is needed ([`super::tensors::Shards`]: nothing mapped, a file truncated since it
/// was opened is a read error).
pub trait GgufData {
    /// The `len` bytes at offset `start` of part `part`.
    fn span(&self, part: usize, start: u64, len: usize) -> Result<Bytes>;
}

impl GgufData for [Bytes] {
    fn span(&self, part: usize, start: u64, len: usize) -> Result<Bytes> {
        let file = self.get(part).ok_or_else(|| err(format!("part {} of a split GGUF is not open", part + 1)))?;
        file.slice(usize::try_from(start).unwrap_or(usize::MAX), len)
    }
}

impl<const N: usize> GgufData for [Bytes; N] {
    fn span(&self, part: usize, start: u64, len: usize) -> Result<Bytes> {
        self[..].span(part, start, len)
    }
}

impl GgufData for Vec<Bytes> {
    fn span(&self, part: usize, start: u64, len: usize) -> Result<Bytes> {
        self[..].span(part, start, len)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl GgufData for super::tensors::Shards {
    fn span(&self, part: usize, start: u64, len: usize) -> Result<Bytes> {
        Ok(Bytes::from_vec(self.read_part(part, start, len)?))
    }
}

/// Every value of GGUF tensor `t` as f32; the slice is checked against the file before
/// anything is allocated.
pub(super) fn decode_all<F: GgufData + ?Sized>(files: &F, t: &TensorInfo) -> Result<Vec<f32>> {
    let too_large = || err(format!("tensor {}: too large", t.name));
    let n = t.ne.iter().try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?)).ok_or_else(too_large)?;
    let len = t.ty.bytes_for(n as u64).and_then(|b| usize::try_from(b).ok()).ok_or_else(too_large)?;
    let src = files.span(t.part, t.offset, len).map_err(|e| err(format!("tensor {}: {e}", t.name)))?;
    let mut out = vec![0f32; n];
    dequantize(t.ty, src.as_ref(), &mut out).map_err(|e| err(format!("tensor {}: {e}", t.name)))?;
    Ok(out)
}

/// kv_b_proj from `attn_k_b` and `attn_v_b` ([`kv_b_planned`] checked their shapes):
/// head h's rows are column j of its key block for each j < qk_nope, then its value rows.
fn kv_b_tensor<F: GgufData + ?Sized>(
    g: &Gguf,
    files: &F,
    p: &Planned,
    split: KvSplit,
    want: Option<DType>,
) -> Result<TensorEntry> {
    let (kt, vt) = (&g.tensors[p.src], &g.tensors[split.v_src]);
    let (ks, vs) = (kt.shape(), vt.shape());
    let (heads, lora, nope, vd) = (ks[0], ks[1], ks[2], vs[1]);
    let (k, v) = (decode_all(files, kt)?, decode_all(files, vt)?);
    let dtype = want.unwrap_or_else(|| keep_dtype_for(g, p));
    let out_rb = dtype.row_bytes(lora).ok_or_else(|| err(format!("tensor {}: bad stored type", kt.name)))?;
    let mut out = vec![0u8; heads * (nope + vd) * out_rb];
    let mut rows = out.chunks_exact_mut(out_rb.max(1));
    let mut row = vec![0f32; lora];
    for h in 0..heads {
        for j in 0..nope + vd {
            for (c, x) in row.iter_mut().enumerate() {
                *x = if j < nope { k[(h * lora + c) * nope + j] } else { v[(h * vd + j - nope) * lora + c] };
            }
            let o = rows.next().ok_or_else(|| err(format!("tensor {}: bad shape", kt.name)))?;
            quantize_row(dtype, &row, o).map_err(|e| err(format!("tensor {}: {e}", kt.name)))?;
        }
    }
    Ok(TensorEntry { dtype, shape: p.shape.clone(), bytes: Bytes::from_vec(out) })
}

/// gpt-oss's `gate_up_proj_bias` from its gate and up halves ([`gate_up_bias_planned`]
/// checked their shapes): value j of row e is gate[e][j / 2] for even j, else up[e][j / 2].
fn interleaved<F: GgufData + ?Sized>(
    g: &Gguf,
    files: &F,
    p: &Planned,
    up: usize,
    want: Option<DType>,
) -> Result<TensorEntry> {
    let (gt, ut) = (&g.tensors[p.src], &g.tensors[up]);
    let (a, b) = (decode_all(files, gt)?, decode_all(files, ut)?);
    let vals: Vec<f32> = a.iter().zip(&b).flat_map(|(&x, &y)| [x, y]).collect();
    let dtype = want.unwrap_or(DType::F32);
    let cols = *p.shape.last().unwrap_or(&1);
    let rb = dtype.row_bytes(cols).ok_or_else(|| err(format!("tensor {}: bad stored type", gt.name)))?;
    let mut out = vec![0u8; p.shape[0] * rb];
    for (o, row) in out.chunks_exact_mut(rb.max(1)).zip(vals.chunks_exact(cols.max(1))) {
        quantize_row(dtype, row, o).map_err(|e| err(format!("tensor {}: {e}", gt.name)))?;
    }
    Ok(TensorEntry { dtype, shape: p.shape.clone(), bytes: Bytes::from_vec(out) })
}

/// The values of `p` stored as `want` (or, with None, as [`keep_dtype_for`]); exact
/// whenever `want` can hold the GGUF values (F32 from anything, the same float type,
/// Q8_0 / Q4_0 / MXFP4 into int8 or int4 with group 32 as their scales allow, MXFP4 into
/// MXFP4), else decoded to f32 and quantized as `coli convert` quantizes safetensors.
pub fn tensor<F: GgufData + ?Sized>(g: &Gguf, files: &F, p: &Planned, want: Option<DType>) -> Result<TensorEntry> {
    if let Some(split) = p.kv_split {
        return kv_b_tensor(g, files, p, split, want);
    }
    if let Some(up) = p.interleave {
        return interleaved(g, files, p, up, want);
    }
    let t: &TensorInfo = &g.tensors[p.src];
    let cols = *p.shape.last().unwrap_or(&1);
    let rows: usize = if p.shape.len() > 1 { p.shape[..p.shape.len() - 1].iter().product() } else { 1 };
    // The source tensors' rows: `src` (the expert's block of rows for stacked experts) and,
    // for qwen3next's in_proj_qkvz, the gate.
    let rows_of = |t: &TensorInfo, n: usize, skip: usize| -> Result<(Bytes, usize)> {
        let rb = t.ty.bytes_for(cols as u64).ok_or_else(|| err(format!("tensor {}: bad row length", t.name)))? as usize;
        let len = n.checked_mul(rb).ok_or_else(|| err(format!("tensor {}: too large", t.name)))?;
        let start = t.offset.saturating_add((skip as u64).saturating_mul(len as u64));
        let bytes = files.span(t.part, start, len).map_err(|e| err(format!("tensor {}: {e}", t.name)))?;
        Ok((bytes, rb))
    };
    let mut srcs = Vec::with_capacity(2);
    // qwen35moe's value heads: whole rows moved back here, columns after decoding.
    let col_heads = p.vheads.filter(|v| v.cols);
    let order: Option<Vec<(usize, usize)>> = match (p.unpermute_heads, p.qkvz) {
        _ if p.vheads.is_some_and(|v| !v.cols) => p.vheads.map(|v| (0..rows).map(|r| (0, v.source(r))).collect()),
        (Some(heads), _) => {
            if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
                return Err(err(format!("tensor {}: {rows} rows do not split into {heads} rope heads", t.name)));
            }
            Some((0..rows).map(|r| (0, gguf_row(r, rows / heads))).collect())
        }
        (None, Some(x)) => {
            let gate = &g.tensors[x.gate];
            let (qkv_rows, z_rows) = (x.groups * (2 * x.hk + x.vpk), x.groups * x.vpk);
            srcs.push((t, rows_of(t, qkv_rows, 0)?));
            srcs.push((gate, rows_of(gate, z_rows, 0)?));
            Some((0..rows).map(|r| qkvz_row(x, r)).collect())
        }
        (None, None) => None,
    };
    if srcs.is_empty() {
        srcs.push((t, rows_of(t, rows, p.expert.unwrap_or(0))?));
    }
    let dtype = want.unwrap_or_else(|| keep_dtype_for(g, p));
    let same_float =
        |ty: GgmlType| matches!((ty.id, dtype), (q::F32, DType::F32) | (q::F16, DType::F16) | (q::BF16, DType::BF16));
    if same_float(t.ty) && order.is_none() && p.values.is_none() && col_heads.is_none() {
        return Ok(TensorEntry { dtype, shape: p.shape.clone(), bytes: srcs.swap_remove(0).1 .0 });
    }
    let out_rb = dtype.row_bytes(cols).ok_or_else(|| err(format!("tensor {}: bad stored type", t.name)))?;
    let mut out = vec![0u8; rows * out_rb];
    let mut vals = vec![0f32; cols];
    let mut moved = vec![0f32; if col_heads.is_some() { cols } else { 0 }];
    let g32 = |d: DType| d.group() == Some(32);
    for (r, o) in out.chunks_exact_mut(out_rb.max(1)).enumerate() {
        let (k, sr) = order.as_ref().map_or((0, r), |v| v[r]);
        let (st, (bytes, rb)) = &srcs[k];
        let s =
            bytes.as_ref().get(sr * rb..(sr + 1) * rb).ok_or_else(|| err(format!("tensor {}: row {sr}", st.name)))?;
        let done = match (st.ty.id, dtype) {
            _ if p.values.is_some() || col_heads.is_some() => false,
            _ if same_float(st.ty) => {
                o.copy_from_slice(s);
                true
            }
            (q::Q8_0, DType::Int8 { .. }) | (q::Q4_0, DType::Int4 { .. }) if g32(dtype) => {
                repack_row(st.ty.id, cols, s, o);
                true
            }
            (q::Q4_0 | q::Q5_0 | q::IQ4_NL | q::MXFP4, DType::Int8 { .. }) if g32(dtype) => {
                to_int8_row(st.ty.id, cols, s, o)
            }
            (q::MXFP4, DType::Mxfp4) => {
                mxfp4_row(cols, s, o);
                true
            }
            (q::Q4_K, DType::Q4K) => {
                q4k_row(cols, s, o);
                true
            }
            (q::Q5_K, DType::Q5K) => {
                q5k_row(cols, s, o);
                true
            }
            _ => false,
        };
        if !done {
            dequantize(st.ty, s, &mut vals).map_err(|e| err(format!("tensor {}: {e}", st.name)))?;
            if let Some(m) = p.values {
                map_values(m, &mut vals).map_err(|e| err(format!("tensor {}: {e}", st.name)))?;
            }
            if let Some(v) = col_heads {
                for (c, x) in moved.iter_mut().enumerate() {
                    *x = *vals.get(v.source(c)).ok_or_else(|| err(format!("tensor {}: column {c}", st.name)))?;
                }
                std::mem::swap(&mut vals, &mut moved);
            }
            quantize_row(dtype, &vals, o).map_err(|e| err(format!("tensor {}: {e}", st.name)))?;
        }
    }
    Ok(TensorEntry { dtype, shape: p.shape.clone(), bytes: Bytes::from_vec(out) })
}

/// Where Hugging Face row `r` of qwen3next's `in_proj_qkvz` is: (0, row of `attn_qkv`) or
/// (1, row of `attn_gate`). Hugging Face groups the rows per key head g (q_g, k_g, then
/// the value and gate rows of g's value heads); convert_hf_to_gguf regrouped them into
/// all q, all k, all v (`attn_qkv`) and all z (`attn_gate`).
fn qkvz_row(x: Qkvz, r: usize) -> (usize, usize) {
    let per = 2 * x.hk + 2 * x.vpk;
    let (g, o) = (r / per, r % per);
    let nk_hk = x.groups * x.hk;
    if o < x.hk {
        (0, g * x.hk + o)
    } else if o < 2 * x.hk {
        (0, nk_hk + g * x.hk + o - x.hk)
    } else if o < 2 * x.hk + x.vpk {
        (0, 2 * nk_hk + g * x.vpk + o - 2 * x.hk)
    } else {
        (1, g * x.vpk + o - 2 * x.hk - x.vpk)
    }
}

/// Undoes what convert_hf_to_gguf did to the values of a qwen3next tensor.
fn map_values(m: ValueMap, vals: &mut [f32]) -> std::result::Result<(), String> {
    match m {
        // RMSNorm weights stored with the 1 added (Qwen3-Next keeps them zero-centred).
        ValueMap::MinusOne => vals.iter_mut().for_each(|v| *v -= 1.0),
        // ssm_a = -exp(A_log): A_log = ln(-ssm_a), in f64 so exp gives ssm_a back.
        ValueMap::LogNeg => {
            for v in vals.iter_mut() {
                if v.is_nan() || *v > 0.0 {
                    return Err(format!("ssm_a value {v} is not negative (it is -exp(A_log))"));
                }
                *v = (-(*v as f64)).ln() as f32;
            }
        }
    }
    Ok(())
}
