use super::*;
use crate::format::tensors::TensorStore;

fn fixture(name: &str) -> (Gguf, Bytes) {
    let path = format!("{}/../tests/fixtures/gguf/{name}.gguf", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap();
    (Gguf::parse(&bytes, &path).unwrap(), Bytes::from_vec(bytes))
}

fn hf(family: &str) -> TensorStore {
    let dir = std::path::PathBuf::from(format!("{}/../tests/fixtures/{family}", env!("CARGO_MANIFEST_DIR")));
    TensorStore::open_dir(&dir).unwrap()
}

fn f32s(e: &TensorEntry) -> Vec<f32> {
    let cols = *e.shape.last().unwrap();
    let rows = e.bytes.len() / e.dtype.row_bytes(cols).unwrap();
    crate::tensor::Mat::new(rows, cols, e.dtype, e.bytes.clone()).unwrap().to_f32()
}

/// Every tensor of an f16 GGUF made by llama.cpp equals the Hugging Face fixture's
/// tensor of the same name rounded to f16 (mixtral: after undoing the rope permutation).
fn same_as_checkpoint(name: &str, family: &str, n_tensors: usize) {
    let (g, file) = fixture(name);
    let im = import(&g).unwrap();
    let st = hf(family);
    assert_eq!(im.tensors.len(), n_tensors);
    assert_eq!(st.names().count(), n_tensors);
    for p in &im.tensors {
        let want = st.get(&p.name).unwrap_or_else(|_| panic!("{} not in the checkpoint", p.name));
        assert_eq!(p.shape, want.shape, "{}", p.name);
        let got = f32s(&tensor(&g, &file, p, Some(DType::F32)).unwrap());
        let want: Vec<f32> = f32s(want).iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let ggml = g.tensors[p.src].ty.name;
        let want: Vec<f32> = if ggml == "F32" { f32s(st.get(&p.name).unwrap()) } else { want };
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} ({ggml}) differs", p.name);
    }
}

#[test]
fn olmoe_f16_maps_every_tensor_back() {
    same_as_checkpoint("olmoe-f16", "olmoe", 165);
}

#[test]
fn mixtral_q_and_k_rows_are_unpermuted() {
    same_as_checkpoint("mixtral-f16", "mixtral", 96);
    let (g, _) = fixture("mixtral-f16");
    let im = import(&g).unwrap();
    let q = im.tensors.iter().find(|p| p.name == "model.layers.0.self_attn.q_proj.weight").unwrap();
    let k = im.tensors.iter().find(|p| p.name == "model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!((q.unpermute_heads, k.unpermute_heads), (Some(4), Some(2)));
}

#[test]
fn config_from_metadata() {
    let (g, _) = fixture("qwen3moe-q4_0-q8_0");
    let c = import(&g).unwrap().config;
    let hf: Json = serde_json::from_str(include_str!("../../../tests/fixtures/qwen3_moe/config.json")).unwrap();
    for k in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "moe_intermediate_size",
        "num_experts_per_tok",
        "norm_topk_prob",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "eos_token_id",
    ] {
        assert_eq!(c[k], hf[k], "{k}");
    }
    assert_eq!(c["num_experts"], hf["num_local_experts"]);
    assert_eq!(c["rope_scaling"], json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}));
    crate::ModelConfig::from_value(&c).unwrap();
    let (g, _) = fixture("mixtral-f16");
    let c = import(&g).unwrap().config;
    assert_eq!((c["model_type"].as_str(), c["sliding_window"].is_null()), (Some("mixtral"), true));
    assert_eq!((c["rope_theta"].as_f64(), c["intermediate_size"].as_u64()), (Some(1e6), Some(56)));
}

#[test]
fn q8_0_and_q4_0_keep_their_values() {
    let (g, file) = fixture("qwen3moe-q4_0-q8_0");
    let im = import(&g).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for p in &im.tensors {
        let ty = g.tensors[p.src].ty;
        let kept = tensor(&g, &file, p, None).unwrap();
        let exact = f32s(&tensor(&g, &file, p, Some(DType::F32)).unwrap());
        assert_eq!(kept.dtype, keep_dtype(ty));
        assert_eq!(f32s(&kept), exact, "{}", p.name);
        if ty.name == "Q4_0" {
            // Q4_0 fits int8 with group 32 exactly too.
            let as8 = tensor(&g, &file, p, Some(DType::Int8 { group: 32 })).unwrap();
            assert_eq!(f32s(&as8), exact, "{}", p.name);
        }
        seen.insert((ty.name, kept.dtype.to_string()));
    }
    let seen: Vec<_> = seen.into_iter().collect();
    assert_eq!(
        seen,
        [("F16", "f16".to_string()), ("F32", "f32".into()), ("Q4_0", "int4/g32".into()), ("Q8_0", "int8/g32".into())]
    );
}

#[test]
fn unknown_arch_and_unknown_tensors_are_refused() {
    use crate::format::gguf::tests::Writer;
    let w = Writer::new().string("general.architecture", "deepseek2");
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("\"deepseek2\" is not supported"), "{e}");
    let w = Writer::new()
        .string("general.architecture", "olmoe")
        .u32("olmoe.block_count", 1)
        .u32("olmoe.embedding_length", 4)
        .u32("olmoe.attention.head_count", 1)
        .u32("olmoe.expert_count", 2)
        .u32("olmoe.expert_used_count", 1)
        .tensor("blk.0.mystery.weight", &[4], 0, vec![0; 16]);
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("blk.0.mystery.weight is not part of a olmoe model"), "{e}");
    let w = Writer::new().string("general.architecture", "olmoe").u32("split.count", 3);
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("one of 3 parts of a split GGUF"), "{e}");
    let w = Writer::new()
        .string("general.architecture", "olmoe")
        .u32("olmoe.block_count", 1)
        .u32("olmoe.embedding_length", 4)
        .u32("olmoe.attention.head_count", 1);
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("Mixture-of-Experts"), "{e}");
}

/// Random damage to real files (bit flips and overwritten bytes in the header, random
/// truncations): parsing, mapping, the tokenizer and tensor conversion return errors or
/// values, never panic; a poor man's fuzz run that needs no nightly (fuzz/ has the real one).
#[test]
fn damaged_files_never_panic() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut parsed, mut imported) = (0, 0);
    for name in ["olmoe-f16", "mixtral-f16", "qwen3moe-q4_0-q8_0"] {
        let (g, file) = fixture(name);
        let header = g.data_start as usize;
        for i in 0..300 {
            let mut b = file.as_ref().to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % header;
                match next() % 3 {
                    0 => b[at] ^= 1 << (next() % 8),
                    1 => b[at] = next() as u8,
                    _ => b[at..(at + 8).min(header)].copy_from_slice(&next().to_le_bytes()[..(8).min(header - at)]),
                }
            }
            if i % 10 == 0 {
                b.truncate((next() as usize) % b.len());
            }
            let Ok(g) = Gguf::parse(&b, "x") else { continue };
            parsed += 1;
            let Ok(im) = import(&g) else { continue };
            imported += 1;
            let bytes = Bytes::from_vec(b);
            for p in im.tensors.iter().filter(|p| p.shape.iter().product::<usize>() < 1 << 20).take(40) {
                let _ = tensor(&g, &bytes, p, None);
                let _ = tensor(&g, &bytes, p, Some(DType::Int4 { group: 32 }));
            }
        }
    }
    // Most damage lands in strings and values that still parse: the test reaches mapping.
    assert!(parsed > 50 && imported > 20, "parsed {parsed}, imported {imported}");
}
