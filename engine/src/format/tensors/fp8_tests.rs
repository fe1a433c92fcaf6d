use serde_json::json;

use super::*;
use crate::tensor::E4M3;

/// A safetensors file of (name, dtype, shape, bytes).
fn file(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dt, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(name.to_string(), json!({"dtype": dt, "shape": shape, "data_offsets": [start, data.len()]}));
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A [5, 40] e4m3 weight in blocks of [2, 16] (both dimensions with a partial last block)
/// and its [3, 3] scales, plus a bf16 tensor that is left alone.
fn store(scale_shape: Vec<usize>, with_scale: bool) -> TensorStore {
    let w: Vec<u8> = (0..200u32).map(|i| (i * 37 % 256) as u8).collect();
    let scales: Vec<f32> = (0..9).map(|i| 0.5f32.powi(i) * if i % 2 == 0 { 1.0 } else { -3.0 }).collect();
    let n = scale_shape.iter().product::<usize>();
    let mut t = vec![("model.layers.0.mlp.down_proj.weight", "F8_E4M3", vec![5, 40], w)];
    if with_scale {
        t.push(("model.layers.0.mlp.down_proj.weight_scale_inv", "F32", scale_shape, f32s(&scales[..n.min(9)])));
    }
    t.push(("model.norm.weight", "BF16", vec![2], vec![0x80, 0x3f, 0, 0x40]));
    let mut s = TensorStore::default();
    s.add_file("x", Bytes::from_vec(file(&t))).unwrap();
    s
}

#[test]
fn pairs_read_as_e4m3_times_their_block_scale() {
    let mut s = store(vec![3, 3], true);
    let table = pair(&mut s, Some([2, 16]), true, None).unwrap().unwrap();
    assert!(!s.contains("model.layers.0.mlp.down_proj.weight_scale_inv"), "the scale is folded into the rows");
    let t = s.get("model.layers.0.mlp.down_proj.weight").unwrap().clone();
    assert_eq!((t.dtype, t.shape.clone()), (DType::Fp8 { block: 16 }, vec![5, 40]));
    assert!(t.bytes.is_elsewhere(), "read when used");
    assert_eq!(t.bytes.len(), 5 * (3 * 4 + 40));
    let m = table.read_mat(&Mat::new(5, 40, t.dtype, t.bytes.clone()).unwrap()).unwrap();
    let got = m.to_f32();
    for r in 0..5 {
        for c in 0..40 {
            let b = (r * 40 + c) * 37 % 256;
            let si = (r / 2) * 3 + c / 16;
            let scale = 0.5f32.powi(si as i32) * if si % 2 == 0 { 1.0 } else { -3.0 };
            let want = E4M3[b] * scale;
            assert!(
                got[r * 40 + c].to_bits() == want.to_bits() || (want.is_nan() && got[r * 40 + c].is_nan()),
                "[{r}, {c}]"
            );
        }
    }
    // A row block of the placeholder reads the same rows (a stacked expert's slice).
    let block = Mat::new(5, 40, t.dtype, t.bytes.clone()).unwrap().row_block(3, 2).unwrap();
    let b = table.read_mat(&block).unwrap().to_f32();
    assert!(b.iter().zip(&got[120..]).all(|(a, w)| a.to_bits() == w.to_bits()));
    // The other tensors are untouched; resident() reads the pair into memory.
    let r = s.resident(|_| false).unwrap();
    assert_eq!(r.vector("model.norm.weight", 2).unwrap(), [1.0, 2.0]);
    let m = r.mat("model.layers.0.mlp.down_proj.weight", 5, 40).unwrap();
    assert!(!m.bytes.is_elsewhere());
    assert!(m.to_f32().iter().zip(&got).all(|(a, w)| a.to_bits() == w.to_bits()));
}

#[test]
fn bad_pairs_are_one_clear_error_naming_the_tensor() {
    let e = pair(&mut store(vec![3, 3], false), Some([2, 16]), true, None).err().unwrap().to_string();
    assert!(e.contains("down_proj.weight_scale_inv is missing"), "{e}");
    let e = pair(&mut store(vec![3, 2], true), Some([2, 16]), true, None).err().unwrap().to_string();
    assert!(e.contains("down_proj.weight_scale_inv has shape [3, 2]") && e.contains("needs [3, 3]"), "{e}");
    let e = pair(&mut store(vec![3, 3], true), None, true, None).err().unwrap().to_string();
    assert!(e.contains("down_proj.weight is float8_e4m3fn") && e.contains("weight_block_size"), "{e}");
    let mut plain = TensorStore::default();
    plain.add_file("x", Bytes::from_vec(file(&[("a.weight_scale_inv", "F32", vec![1], vec![0; 4])]))).unwrap();
    assert!(pair(&mut plain, Some([2, 2]), true, None).unwrap().is_none(), "nothing to pair without e4m3 tensors");
    let mut orphan = store(vec![3, 3], true);
    orphan.insert(
        "x.weight_scale_inv".into(),
        TensorEntry { dtype: DType::F32, shape: vec![1], bytes: Bytes::from_vec(vec![0; 4]) },
    );
    let e = pair(&mut orphan, Some([2, 16]), true, None).err().unwrap().to_string();
    assert!(e.contains("x.weight_scale_inv") && e.contains("not float8_e4m3fn"), "{e}");
}

#[test]
fn the_config_names_what_it_cannot_take() {
    let q = |q: serde_json::Value| block_size(&json!({ "quantization_config": q }));
    let ok =
        json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 64], "activation_scheme": "dynamic"});
    assert_eq!(q(ok).unwrap(), Some([128, 64]));
    let v4 = json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"});
    assert_eq!(q(v4).unwrap(), Some([128, 128]), "DeepSeek-V4's ue8m0 scales are read");
    assert_eq!(block_size(&json!({})).unwrap(), None);
    assert_eq!(q(json!({"quant_method": "mxfp4"})).unwrap(), None);
    for (bad, says) in [
        (json!({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}), "fmt \"e5m2\""),
        (json!({"quant_method": "fp8", "fmt": "e4m3"}), "weight_block_size"),
        (json!({"quant_method": "fp8", "weight_block_size": [128]}), "weight_block_size"),
        (json!({"quant_method": "fp8", "weight_block_size": [0, 128]}), "weight_block_size"),
        (json!({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "mx"}), "scale_fmt \"mx\""),
        (json!({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}), "static"),
    ] {
        let e = q(bad).unwrap_err().to_string();
        assert!(e.contains(says) && !e.contains('\n'), "{e}");
    }
}

/// DeepSeek-V4's dense weights: e4m3 with ue8m0 block scales (`F8_E8M0`, one byte 2^(s - 127)
/// per block, every byte from the subnormal 2^-127 up): read as e4m3 times that power of
/// two, exactly; the NaN byte 255 is one error naming the scale tensor.
#[test]
fn ue8m0_scales_are_exact_powers_of_two() {
    assert_eq!(e8m0(127), Some(1.0));
    assert_eq!(e8m0(0), Some(2f32.powi(-127)));
    assert_eq!(e8m0(1), Some(2f32.powi(-126)));
    assert_eq!(e8m0(254), Some(2f32.powi(127)));
    assert_eq!(e8m0(255), None);
    let w: Vec<u8> = (0..200u32).map(|i| (i * 37 % 256) as u8).collect();
    let scales: Vec<u8> = vec![127, 120, 134, 0, 1, 254, 126, 128, 100];
    let mk = |scales: Vec<u8>| {
        let t = [
            ("model.layers.0.attn.wq_a.weight", "F8_E4M3", vec![5, 40], w.clone()),
            ("model.layers.0.attn.wq_a.weight_scale_inv", "F8_E8M0", vec![3, 3], scales),
        ];
        let mut s = TensorStore::default();
        s.add_file("x", Bytes::from_vec(file(&t))).unwrap();
        s
    };
    let mut s = mk(scales.clone());
    let table = pair(&mut s, Some([2, 16]), true, None).unwrap().unwrap();
    let t = s.get("model.layers.0.attn.wq_a.weight").unwrap().clone();
    let got = table.read_mat(&Mat::new(5, 40, t.dtype, t.bytes.clone()).unwrap()).unwrap().to_f32();
    for r in 0..5 {
        for c in 0..40 {
            let e = E4M3[(r * 40 + c) * 37 % 256];
            let want = e * 2f64.powi(scales[(r / 2) * 3 + c / 16] as i32 - 127) as f32;
            let g = got[r * 40 + c];
            assert!(g.to_bits() == want.to_bits() || (e.is_nan() && g.is_nan()), "[{r}, {c}]: {g} vs {want}");
        }
    }
    let mut bad = mk(vec![127, 255, 127, 127, 127, 127, 127, 127, 127]);
    let table = pair(&mut bad, Some([2, 16]), true, None).unwrap().unwrap();
    let t = bad.get("model.layers.0.attn.wq_a.weight").unwrap().clone();
    let e = table.read_mat(&Mat::new(5, 40, t.dtype, t.bytes).unwrap()).err().unwrap().to_string();
    assert!(e.contains("wq_a.weight_scale_inv") && e.contains("255") && !e.contains('\n'), "{e}");
}

/// e2m1 magnitudes by the low 3 bits of a nibble (bit 3 is the sign).
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

const W1: &str = "layers.0.ffn.experts.1.w1.weight";

/// DeepSeek-V4's release: a routed expert's [3, 64] FP4 weight (packed as `packed_dtype`
/// [3, 32] I8, or F4 [3, 64]) with `.scale` e8m0 `scale_shape` (of dtype `scale_dtype`),
/// and an e4m3 attention weight [2, 16] with its `.scale` e8m0 [1, 1].
fn v4_store(packed_dtype: &str, scale_dtype: &str, scale_shape: Option<Vec<usize>>) -> TensorStore {
    let packed: Vec<u8> = (0..96u32).map(|i| (i * 73 + 5) as u8).collect();
    let shape = if packed_dtype == "F4" { vec![3, 64] } else { vec![3, 32] };
    let mut t = vec![(W1, packed_dtype, shape, packed)];
    if let Some(ss) = scale_shape {
        let n = ss.iter().product::<usize>() * if scale_dtype == "F32" { 4 } else { 1 };
        t.push(("layers.0.ffn.experts.1.w1.scale", scale_dtype, ss, (0..n as u8).map(|i| 120 + i).collect()));
    }
    t.push(("layers.0.attn.wq_a.weight", "F8_E4M3", vec![2, 16], (0..32u8).map(|i| i * 7).collect()));
    t.push(("layers.0.attn.wq_a.scale", "F8_E8M0", vec![1, 1], vec![125]));
    let mut s = TensorStore::default();
    s.add_file("x", Bytes::from_vec(file(&t))).unwrap();
    s
}

/// The packed FP4 experts become MXFP4 rows meaning e2m1(nibble) * 2^(scale - 127), value
/// 2i in the low nibble; the dense weights' `.scale` (the release's name) pairs as
/// `_scale_inv` does.
#[test]
fn v4_fp4_experts_read_as_mxfp4_rows_and_dot_scale_pairs() {
    for packed_dtype in ["I8", "F4"] {
        let mut s = v4_store(packed_dtype, "F8_E8M0", Some(vec![3, 2]));
        let table = pair(&mut s, Some([16, 32]), true, None).unwrap().unwrap();
        assert!(!s.contains("layers.0.ffn.experts.1.w1.scale") && !s.contains("layers.0.attn.wq_a.scale"));
        let t = s.get(W1).unwrap().clone();
        assert_eq!((t.dtype, t.shape.clone()), (DType::Mxfp4, vec![3, 64]));
        assert_eq!(t.bytes.len(), 3 * (4 + 32), "1 byte per 2 weights plus the scales");
        let got = table.read_mat(&Mat::new(3, 64, t.dtype, t.bytes.clone()).unwrap()).unwrap().to_f32();
        for r in 0..3 {
            for c in 0..64 {
                let byte = ((r * 32 + c / 2) * 73 + 5) as u8;
                let nib = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
                let sign = if nib & 8 != 0 { -1.0 } else { 1.0 };
                let scale = 2f32.powi(120 + (r * 2 + c / 32) as i32 - 127);
                assert_eq!(got[r * 64 + c], sign * E2M1[(nib & 7) as usize] * scale, "[{r}, {c}]");
            }
        }
        let rows = Mat::new(3, 64, t.dtype, t.bytes.clone()).unwrap().row_block(1, 2).unwrap();
        assert_eq!(table.read_mat(&rows).unwrap().to_f32(), got[64..]);
        let q = s.get("layers.0.attn.wq_a.weight").unwrap().clone();
        assert_eq!(q.dtype, DType::Fp8 { block: 32 });
        let dense = table.read_mat(&Mat::new(2, 16, q.dtype, q.bytes).unwrap()).unwrap().to_f32();
        let want: Vec<f32> = (0..32usize).map(|i| E4M3[i * 7] * 0.25).collect();
        assert_eq!(dense, want);
    }
}

/// An FP4 expert without its scale, or with scales of the wrong shape or type, or rows
/// that are not whole blocks of 32: one line naming the tensor.
#[test]
fn v4_bad_fp4_experts_are_one_clear_error() {
    for (store, says) in [
        (v4_store("I8", "F8_E8M0", None), format!("{W1} is packed FP4")),
        (v4_store("I8", "F8_E8M0", Some(vec![3, 3])), "w1.scale has shape [3, 3]".into()),
        (v4_store("I8", "F8_E8M0", Some(vec![3])), "needs [3, 2]".into()),
        (v4_store("I8", "F32", Some(vec![3, 2])), "w1.scale: scales must be e8m0".into()),
    ] {
        let mut store = store;
        let e = pair(&mut store, Some([16, 32]), true, None).err().expect("refused").to_string();
        assert!(e.contains(says.as_str()) && !e.contains('\n'), "{says}: {e}");
    }
    let e = pair(&mut v4_store("I8", "F8_E8M0", None), Some([16, 32]), true, None).err().unwrap().to_string();
    assert!(e.contains("w1.scale or layers.0.ffn.experts.1.w1.weight_scale_inv is missing"), "{e}");
    let mut narrow = TensorStore::default();
    let t = [(W1, "I8", vec![2, 8], vec![0u8; 16]), ("layers.0.ffn.experts.1.w1.scale", "U8", vec![2, 0], vec![])];
    narrow.add_file("x", Bytes::from_vec(file(&t))).unwrap();
    let e = pair(&mut narrow, None, true, None).err().unwrap().to_string();
    assert!(e.contains(W1) && e.contains("16 values are not whole blocks of 32"), "{e}");
    // A `.scale` beside a weight that is neither e4m3 nor packed FP4 is named too.
    let mut stray = v4_store("I8", "F8_E8M0", Some(vec![3, 2]));
    stray.insert(
        "norm.weight".into(),
        TensorEntry { dtype: DType::F32, shape: vec![1], bytes: Bytes::from_vec(vec![0; 4]) },
    );
    stray
        .insert("norm.scale".into(), TensorEntry { dtype: DType::U8, shape: vec![1], bytes: Bytes::from_vec(vec![0]) });
    let e = pair(&mut stray, Some([16, 32]), true, None).err().unwrap().to_string();
    assert!(e.contains("tensor norm.scale: a scale for norm.weight"), "{e}");
    // An integer tensor elsewhere is still refused by its dtype.
    let mut other = TensorStore::default();
    let e = other.add_file("x", Bytes::from_vec(file(&[("layers.0.attn.x.weight", "I8", vec![1], vec![0])])));
    assert!(e.unwrap_err().to_string().contains("I8"));
}

/// Byte-typed expert weights are FP4 only where config.json says so (`expert_dtype`
/// "fp4"): in any other checkpoint an unused U8 expert tensor stays an unused U8 tensor
/// (a qwen3_moe file with one stopped loading: helper/tests/it/private_files.rs).
#[test]
fn byte_experts_are_fp4_only_where_the_config_says_so() {
    let t = [(W1, "U8", vec![3, 32], vec![7u8; 96])];
    let mut s = TensorStore::default();
    s.add_file("x", Bytes::from_vec(file(&t))).unwrap();
    assert!(pair(&mut s, None, false, None).unwrap().is_none());
    assert_eq!(s.get(W1).unwrap().dtype, DType::U8);
    assert!(pair(&mut s, None, true, None).err().unwrap().to_string().contains("is packed FP4"));
    assert!(fp4_experts(&serde_json::json!({"expert_dtype": "fp4"})));
    assert!(fp4_experts(&serde_json::json!({"quantization_config": {"expert_dtype": "fp4"}})));
    assert!(!fp4_experts(&serde_json::json!({"expert_dtype": "fp8"})));
    assert!(!fp4_experts(&serde_json::json!({"model_type": "qwen3_moe"})));
}
