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
    let table = pair(&mut s, Some([2, 16]), None).unwrap().unwrap();
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
    let e = pair(&mut store(vec![3, 3], false), Some([2, 16]), None).err().unwrap().to_string();
    assert!(e.contains("down_proj.weight_scale_inv is missing"), "{e}");
    let e = pair(&mut store(vec![3, 2], true), Some([2, 16]), None).err().unwrap().to_string();
    assert!(e.contains("down_proj.weight_scale_inv has shape [3, 2]") && e.contains("needs [3, 3]"), "{e}");
    let e = pair(&mut store(vec![3, 3], true), None, None).err().unwrap().to_string();
    assert!(e.contains("down_proj.weight is float8_e4m3fn") && e.contains("weight_block_size"), "{e}");
    let mut plain = TensorStore::default();
    plain.add_file("x", Bytes::from_vec(file(&[("a.weight_scale_inv", "F32", vec![1], vec![0; 4])]))).unwrap();
    assert!(pair(&mut plain, Some([2, 2]), None).unwrap().is_none(), "nothing to pair without e4m3 tensors");
    let mut orphan = store(vec![3, 3], true);
    orphan.insert(
        "x.weight_scale_inv".into(),
        TensorEntry { dtype: DType::F32, shape: vec![1], bytes: Bytes::from_vec(vec![0; 4]) },
    );
    let e = pair(&mut orphan, Some([2, 16]), None).err().unwrap().to_string();
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
    let table = pair(&mut s, Some([2, 16]), None).unwrap().unwrap();
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
    let table = pair(&mut bad, Some([2, 16]), None).unwrap().unwrap();
    let t = bad.get("model.layers.0.attn.wq_a.weight").unwrap().clone();
    let e = table.read_mat(&Mat::new(5, 40, t.dtype, t.bytes).unwrap()).err().unwrap().to_string();
    assert!(e.contains("wq_a.weight_scale_inv") && e.contains("255") && !e.contains('\n'), "{e}");
}
