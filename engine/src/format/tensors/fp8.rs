//! FP8 block-scaled checkpoints, read as they are (DeepSeek-V3/R1/V3.2, Kimi-K2, GLM-5:
//! `quantization_config.quant_method = "fp8"`, `fmt = "e4m3"`, `weight_block_size = [B0,
//! B1]`). A weight `X` is stored as `float8_e4m3fn` with `X_scale_inv`, an f32 tensor of
//! shape `[ceil(rows/B0), ceil(cols/B1)]` (a leading stack dimension allowed: fused
//! experts); the true weight is `e4m3(X[r, c]) * X_scale_inv[r / B0, c / B1]`.
//!
//! The engine's FP8 rows ([`DType::Fp8`], tensor.rs) carry their block scales in each
//! row, so the pairs are re-laid out row by row (bytes copied, scales repeated on each of
//! a block's B0 rows; nothing is rounded). That happens when the matrix is read, not when
//! the checkpoint is opened: each paired tensor becomes a placeholder
//! ([`Bytes::elsewhere`]) at an offset of its own in a range no file reaches, and
//! [`Fp8Table`] (a [`MatReader`]) makes the rows of any row block of it from the
//! checkpoint's bytes (in memory, mapped, or read with pread from the shards). The dense
//! weights are read so once when the model loads, the routed experts each time one is
//! read (and cached as FP8, 1 byte per weight plus scales), as a streamed checkpoint's are.
//!
//! The scale of `X.weight` is `X.weight_scale_inv` (DeepSeek-V3's releases, transformers'
//! names) or `X.scale` (DeepSeek-V4's release, which transformers renames on load).
//! DeepSeek-V4 also stores its routed experts (`*.experts.E.w{1,2,3}.weight`) as packed
//! FP4: e2m1 pairs (low nibble first) as `I8` `[rows, cols / 2]` (or `F4` `[rows, cols]`),
//! with one ue8m0 scale per 32 values of a row, `[rows, cols / 32]`. That is the meaning
//! of the engine's MXFP4 rows ([`DType::Mxfp4`]): such a pair becomes an MXFP4 placeholder
//! whose rows are the scale bytes then the packed bytes, copied, nothing re-encoded.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::{MatReader, TensorEntry, TensorStore};
use crate::error::{Error, Result};
use crate::tensor::{decode_into, Bytes, DType, Mat, MXFP4_BLOCK};

/// The FP8 block size of a Hugging Face config: `Some([B0, B1])` when its
/// `quantization_config.quant_method` is `"fp8"`, None without a quantization_config or
/// with another method (refused elsewhere); an error naming the field for what is not
/// supported (a format other than e4m3, scales other than f32, static activation scales,
/// a missing or malformed `weight_block_size`).
pub fn block_size(v: &Value) -> Result<Option<[usize; 2]>> {
    let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) else { return Ok(None) };
    if q.get("quant_method").and_then(Value::as_str) != Some("fp8") {
        return Ok(None);
    }
    let err = |m: String| Err(Error::Config(format!("quantization_config: {m}")));
    match q.get("fmt").and_then(Value::as_str) {
        None | Some("e4m3") => {}
        Some(f) => return err(format!("fmt {f:?} is not supported (only \"e4m3\")")),
    }
    match q.get("scale_fmt").and_then(Value::as_str) {
        // ue8m0: the scales are stored as e8m0 bytes (powers of two); the scale tensor's
        // dtype says which, as transformers reads them.
        None | Some("float") | Some("ue8m0") => {}
        Some(f) => return err(format!("scale_fmt {f:?} is not supported (only \"float\" and \"ue8m0\")")),
    }
    if let Some(a) = q.get("activation_scheme").and_then(Value::as_str).filter(|a| *a != "dynamic") {
        return err(format!("activation_scheme {a:?} is not supported (only \"dynamic\")"));
    }
    let b = q.get("weight_block_size").and_then(Value::as_array);
    match b.map(|b| b.iter().map(Value::as_u64).collect::<Vec<_>>()).as_deref() {
        Some([Some(b0), Some(b1)]) if *b0 > 0 && *b1 > 0 && *b1 <= u32::MAX as u64 => {
            Ok(Some([*b0 as usize, *b1 as usize]))
        }
        _ => err(format!(
            "weight_block_size must be two positive integers [rows, cols] (e.g. [128, 128]), got {}",
            q.get("weight_block_size").map_or("nothing".to_string(), |b| b.to_string())
        )),
    }
}

/// An e8m0 (ue8m0, `float8_e8m0fnu`) scale byte as f32: 2^(b - 127), exact (b = 0 is the
/// subnormal 2^-127); None for 255, the NaN.
pub fn e8m0(b: u8) -> Option<f32> {
    match b {
        255 => None,
        0 => Some(f32::from_bits(1 << 22)),
        b => Some(f32::from_bits((b as u32) << 23)),
    }
}

/// How a paired tensor's values and scales make the engine's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// e4m3 bytes with a scale per block of `[B0, B1]` ([`DType::Fp8`] rows).
    Fp8 { block: [usize; 2] },
    /// Packed e2m1 pairs with an e8m0 scale per 32 values of a row ([`DType::Mxfp4`] rows).
    Fp4,
}

/// One paired tensor: where its values and its scales are.
struct Recipe {
    name: String,
    /// The `[stacks * rows, cols]` e4m3 bytes (FP4: `[stacks * rows, cols / 2]` packed
    /// bytes): in memory, or a placeholder in the shards.
    values: Bytes,
    /// The scale tensor, `[stacks * ceil(rows / B0), ceil(cols / B1)]` (FP4: `[stacks *
    /// rows, cols / 32]`).
    scales: TensorEntry,
    scale_name: String,
    /// Rows per stack entry (the weight's second-to-last dimension), and all rows.
    rows: usize,
    total_rows: usize,
    cols: usize,
    kind: Kind,
}

/// The paired FP8 tensors of a checkpoint, by the offset of their placeholders.
pub struct Fp8Table {
    recipes: BTreeMap<u64, Recipe>,
    /// Where placeholders in the shards are read (a streamed checkpoint).
    fallback: Option<Arc<dyn MatReader>>,
}

/// First offset of the placeholders' range: far past any file.
const VIRTUAL_BASE: u64 = 1 << 60;

impl Fp8Table {
    /// The recipe of the placeholder at `at`, and the offset into it.
    fn recipe(&self, at: u64) -> Option<(&Recipe, u64)> {
        self.recipes.range(..=at).next_back().map(|(start, r)| (r, at - start))
    }

    /// The scale tensor's name of the pair whose placeholder starts at `at`.
    pub fn scale_name(&self, at: u64) -> Option<String> {
        self.recipes.get(&at).map(|r| r.scale_name.clone())
    }

    fn bytes(&self, b: &Bytes, start: usize, len: usize, what: &str) -> Result<Vec<u8>> {
        match (b.file_offset(), &self.fallback) {
            (None, _) => Ok(b.slice(start, len)?.as_ref().to_vec()),
            (Some(at), Some(f)) => f.read_bytes(at + start as u64, len),
            (Some(_), None) => Err(Error::Invalid(format!("{what}: its bytes are not in memory"))),
        }
    }

    fn scales(&self, r: &Recipe) -> Result<Vec<f32>> {
        let s = &r.scales;
        let raw = self.bytes(&s.bytes, 0, s.bytes.len(), &r.scale_name)?;
        let mut out = vec![0.0f32; s.shape.iter().product()];
        if s.dtype == DType::U8 {
            for (o, &b) in out.iter_mut().zip(&raw) {
                *o = e8m0(b)
                    .ok_or_else(|| Error::Invalid(format!("tensor {}: e8m0 scale byte 255 is NaN", r.scale_name)))?;
            }
        } else {
            decode_into(s.dtype, &raw, &mut out);
        }
        Ok(out)
    }
}

impl MatReader for Fp8Table {
    fn read_mat(&self, m: &Mat) -> Result<Mat> {
        let (Some(at), DType::Fp8 { .. } | DType::Mxfp4) = (m.bytes.file_offset(), m.dtype) else {
            return match &self.fallback {
                Some(f) => f.read_mat(m),
                None => Ok(m.clone()),
            };
        };
        let (r, off) =
            self.recipe(at).ok_or_else(|| Error::Invalid(format!("FP8 placeholder at {at} is in no tensor")))?;
        let rb = m.row_bytes().max(1);
        let (first, n) = ((off / rb as u64) as usize, m.bytes.len() / rb);
        if off % rb as u64 != 0 || m.cols != r.cols || first + n > r.total_rows {
            return Err(Error::Invalid(format!("{}: a row block outside the tensor", r.name)));
        }
        let mut out = vec![0u8; n * rb];
        match r.kind {
            Kind::Fp4 => {
                // Each row: its cols / 32 e8m0 bytes (padded to 4), then its packed bytes.
                let (g, packed) = (r.cols / MXFP4_BLOCK, r.cols / 2);
                let values = self.bytes(&r.values, first * packed, n * packed, &r.name)?;
                let s = &r.scales;
                let scales = self.bytes(&s.bytes, first * g, n * g, &r.scale_name)?;
                for (k, ((o, v), sc)) in out
                    .chunks_exact_mut(rb)
                    .zip(values.chunks_exact(packed.max(1)))
                    .zip(scales.chunks_exact(g.max(1)))
                    .enumerate()
                {
                    // 255 is e8m0's NaN: refused rather than carried into the kernels.
                    if let Some(c) = sc.iter().position(|&b| b == 255) {
                        return Err(Error::Invalid(format!(
                            "tensor {}: e8m0 scale byte 255 (NaN) at row {}, block {c}",
                            r.scale_name,
                            first + k
                        )));
                    }
                    o[..g].copy_from_slice(sc);
                    o[rb - packed..].copy_from_slice(v);
                }
            }
            Kind::Fp8 { block: [b0, b1] } => {
                let values = self.bytes(&r.values, first * r.cols, n * r.cols, &r.name)?;
                let scales = self.scales(r)?;
                let (srows, ncb) = (r.rows.div_ceil(b0), r.cols.div_ceil(b1));
                for (k, (o, v)) in out.chunks_exact_mut(rb).zip(values.chunks_exact(r.cols.max(1))).enumerate() {
                    let row = first + k;
                    let srow = (row / r.rows) * srows + (row % r.rows) / b0;
                    for (d, s) in o.chunks_exact_mut(4).zip(&scales[srow * ncb..(srow + 1) * ncb]) {
                        d.copy_from_slice(&s.to_le_bytes());
                    }
                    o[4 * ncb..4 * ncb + r.cols].copy_from_slice(v);
                }
            }
        }
        Mat::new(n, m.cols, m.dtype, Bytes::from_vec(out))
    }

    fn read_bytes(&self, at: u64, len: usize) -> Result<Vec<u8>> {
        match &self.fallback {
            Some(f) => f.read_bytes(at, len),
            None => Err(Error::Invalid(format!("bytes {at}+{len} are not in memory"))),
        }
    }
}

/// The name of `weight`'s scale tensor in `store`: `{weight}_scale_inv`, or `X.scale` for
/// a weight `X.weight` (DeepSeek-V4's release); None when neither is there.
fn scale_of(store: &TensorStore, weight: &str) -> Option<String> {
    let inv = format!("{weight}_scale_inv");
    if store.contains(&inv) {
        return Some(inv);
    }
    weight.strip_suffix(".weight").map(|b| format!("{b}.scale")).filter(|n| store.contains(n))
}

/// Whether tensor `name` of type `dtype` is a packed FP4 routed-expert weight (DeepSeek-V4:
/// `*.experts.E.w{1,2,3}.weight` stored as I8 / F4, kept as bytes): such a tensor means
/// nothing without its scales.
pub fn is_packed_fp4(name: &str, dtype: DType) -> bool {
    dtype == DType::U8 && name.contains(".experts.") && name.ends_with(".weight")
}

/// Whether `store` holds any tensor [`pair`] pairs (e4m3, or with `fp4` packed FP4 experts).
pub fn has_pairs(store: &TensorStore, fp4: bool) -> bool {
    store.names().any(|n| store.get(n).is_ok_and(|t| t.dtype == DType::F8E4M3 || (fp4 && is_packed_fp4(n, t.dtype))))
}

/// Whether config.json `v` declares packed FP4 routed experts (DeepSeek-V4's release:
/// `expert_dtype` "fp4" at the top level or in its quantization_config). Only then are
/// byte-typed expert weights read as FP4: in any other checkpoint they are not experts'
/// FP4 pairs (and an unused one stays unused).
pub fn fp4_experts(v: &Value) -> bool {
    let q = v.get("quantization_config");
    [v.get("expert_dtype"), q.and_then(|q| q.get("expert_dtype"))].into_iter().flatten().any(|d| d == "fp4")
}

/// Pairs every `float8_e4m3fn` tensor of `store` with its scale (`_scale_inv` or `.scale`)
/// and, with `fp4` ([`fp4_experts`]), every packed FP4 expert weight ([`is_packed_fp4`])
/// with its e8m0 scales: each pair
/// becomes one [`DType::Fp8`] (FP4: [`DType::Mxfp4`]) placeholder read through the returned
/// table (the store's [`TensorStore::reader`] from then on), the scale tensor is dropped.
/// `block` is the config's `weight_block_size` ([`block_size`]; FP4 experts do not use it);
/// `fallback` reads placeholders in the shards. None when the store holds no such tensor.
/// Errors name the tensor: no block size, a missing scale, a scale of the wrong shape or
/// type, FP4 rows that are not whole blocks of 32.
pub fn pair(
    store: &mut TensorStore,
    block: Option<[usize; 2]>,
    fp4: bool,
    fallback: Option<Arc<dyn MatReader>>,
) -> Result<Option<Arc<Fp8Table>>> {
    let mut names: Vec<(String, bool)> = store
        .names()
        .filter_map(|n| {
            let t = store.get(n).ok()?;
            match (t.dtype == DType::F8E4M3, fp4 && is_packed_fp4(n, t.dtype)) {
                (true, _) => Some((n.clone(), false)),
                (_, true) => Some((n.clone(), true)),
                _ => None,
            }
        })
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    names.sort();
    let mut table = Fp8Table { recipes: BTreeMap::new(), fallback };
    let mut next = VIRTUAL_BASE;
    for (name, fp4) in names {
        let t = store.get(&name)?.clone();
        let Some(sname) = scale_of(store, &name) else {
            let what = if fp4 { "packed FP4 (two e2m1 values per byte)" } else { "float8_e4m3fn" };
            let alt = name.strip_suffix(".weight").map_or(String::new(), |b| format!("{b}.scale or "));
            return Err(Error::Invalid(format!(
                "tensor {name} is {what} but its scale tensor {alt}{name}_scale_inv is missing"
            )));
        };
        let s = store.get(&sname)?.clone();
        if t.shape.len() < 2 {
            return Err(Error::Invalid(format!(
                "tensor {name}: a quantized weight must have 2 or more dimensions, got {:?}",
                t.shape
            )));
        }
        let (lead, rc) = t.shape.split_at(t.shape.len() - 2);
        let rows = rc[0];
        let (kind, dtype, cols, want) = if fp4 {
            let cols = rc[1] * 2;
            if !cols.is_multiple_of(MXFP4_BLOCK) {
                return Err(Error::Invalid(format!(
                    "tensor {name}: packed FP4 rows of {cols} values are not whole blocks of {MXFP4_BLOCK}"
                )));
            }
            let mut want = lead.to_vec();
            want.extend([rows, cols / MXFP4_BLOCK]);
            (Kind::Fp4, DType::Mxfp4, cols, want)
        } else {
            let Some([b0, b1]) = block else {
                return Err(Error::Config(format!(
                    "tensor {name} is float8_e4m3fn, but config.json gives no quantization_config.weight_block_size \
                     (block-scaled FP8 needs [rows, cols], e.g. [128, 128])"
                )));
            };
            let cols = rc[1];
            let mut want = lead.to_vec();
            want.extend([rows.div_ceil(b0), cols.div_ceil(b1)]);
            (Kind::Fp8 { block: [b0, b1] }, DType::Fp8 { block: b1 as u32 }, cols, want)
        };
        if s.shape != want {
            let how = match kind {
                Kind::Fp4 => format!("one e8m0 scale per {MXFP4_BLOCK} values of a row"),
                Kind::Fp8 { block: [b0, b1] } => format!("blocks of [{b0}, {b1}]"),
            };
            return Err(Error::Invalid(format!(
                "tensor {sname} has shape {:?}, but {name} {:?} in {how} needs {want:?}",
                s.shape, t.shape
            )));
        }
        let scale_types_ok = match kind {
            Kind::Fp4 => s.dtype == DType::U8,
            Kind::Fp8 { .. } => matches!(s.dtype, DType::F32 | DType::BF16 | DType::F16 | DType::U8),
        };
        if !scale_types_ok {
            let allowed = if fp4 { "e8m0 (F8_E8M0 / U8)" } else { "F32, BF16, F16 or e8m0 (F8_E8M0 / U8)" };
            return Err(Error::Invalid(format!("tensor {sname}: scales must be {allowed}, got {}", s.dtype)));
        }
        let total_rows = lead.iter().product::<usize>() * rows;
        let rb = dtype.row_bytes(cols).ok_or_else(|| Error::Invalid(format!("tensor {name}: too large")))?;
        let len = total_rows.checked_mul(rb).ok_or_else(|| Error::Invalid(format!("tensor {name}: too large")))?;
        let mut shape = t.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = cols;
        }
        store.remove(&sname);
        store.insert(name.clone(), TensorEntry { dtype, shape, bytes: Bytes::elsewhere(next, len) });
        table
            .recipes
            .insert(next, Recipe { name, values: t.bytes, scales: s, scale_name: sname, rows, total_rows, cols, kind });
        next = next.saturating_add(len as u64).div_ceil(4096) * 4096 + 4096;
    }
    let stray = store.names().find(|n| {
        n.ends_with("_scale_inv") || n.strip_suffix(".scale").is_some_and(|b| store.contains(&format!("{b}.weight")))
    });
    if let Some(n) = stray {
        let w = match n.strip_suffix("_scale_inv") {
            Some(w) => w.to_string(),
            None => format!("{}.weight", n.trim_end_matches(".scale")),
        };
        return Err(Error::Invalid(format!("tensor {n}: a scale for {w}, which is not float8_e4m3fn or packed FP4")));
    }
    let table = Arc::new(table);
    store.set_fp8(table.clone());
    Ok(Some(table))
}

#[cfg(test)]
#[path = "fp8_tests.rs"]
mod tests;
