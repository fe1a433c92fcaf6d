//! gpt-oss: every tensor of llama.cpp's GGUF of the MXFP4 checkpoint is the checkpoint's;
//! the MXFP4 experts come back byte for byte as the engine's MXFP4 rows (the same bytes
//! `model/gpt_oss.rs` makes of `*_blocks` / `*_scales`), gate_up_proj_bias re-interleaved.
//! (Here rather than in `format`'s tests: it needs the model's expert loader, which sits
//! above the file formats.)

use std::path::PathBuf;

use colibri_engine::format::gguf::Gguf;
use colibri_engine::format::gguf_import::import;
use colibri_engine::format::gguf_tensor::tensor;
use colibri_engine::format::tensors::{TensorEntry, TensorStore};
use colibri_engine::tensor::{Bytes, DType, Mat};
use colibri_engine::ModelConfig;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn f32s(e: &TensorEntry) -> Vec<f32> {
    let cols = *e.shape.last().unwrap();
    let rows = e.bytes.len() / e.dtype.row_bytes(cols).unwrap();
    Mat::new(rows, cols, e.dtype, e.bytes.clone()).unwrap().to_f32()
}

#[test]
fn gpt_oss_mxfp4_experts_are_kept_byte_for_byte() {
    let path = fixtures().join("gguf/gpt-oss-mxfp4.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let g = Gguf::parse(&bytes, &path.display().to_string()).unwrap();
    let file = [Bytes::from_vec(bytes.clone())];
    let im = import(&g).unwrap();
    let st = TensorStore::open_dir(&fixtures().join("gpt_oss_mxfp4")).unwrap();
    let config = std::fs::read(fixtures().join("gpt_oss_mxfp4/config.json")).unwrap();
    let cfg = ModelConfig::from_value(&serde_json::from_slice(&config).unwrap()).unwrap();
    let mut experts = std::collections::HashMap::new();
    let (mut dense, mut parts) = (0, 0);
    for p in &im.tensors {
        let got = tensor(&g, &file, p, None).unwrap();
        if let Some((l, e, part)) = p.expert_of {
            assert_eq!(got.dtype, DType::Mxfp4, "{}", p.name);
            let x = experts.entry(l).or_insert_with(|| {
                colibri_engine::model::gpt_oss::load_experts(&st, &format!("model.layers.{l}.mlp"), &cfg).unwrap()
            });
            let want = [&x[e].gate, &x[e].up, &x[e].down][part];
            assert_eq!((want.dtype, want.rows, want.cols), (DType::Mxfp4, p.shape[0], p.shape[1]), "{}", p.name);
            assert!(got.bytes.as_ref() == want.bytes.as_ref(), "{}: MXFP4 bytes differ", p.name);
            parts += 1;
            continue;
        }
        let want = st.get(&p.name).unwrap_or_else(|_| panic!("{} not in the checkpoint", p.name));
        assert_eq!(p.shape, want.shape, "{}", p.name);
        let (a, b) = (f32s(&got), f32s(want));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len(), "{}", p.name);
        dense += 1;
    }
    // 3 layers x 8 experts x 3 parts; every checkpoint tensor but the 12 blocks/scales.
    assert_eq!((parts, dense), (72, st.names().count() - 12));
}
