use super::*;
use crate::format::gguf::Array;
use crate::format::gguf_quant as q;
use crate::format::gguf_tensor::decode_all;
use crate::format::quant::quantize_row;
use crate::format::tensors::{TensorEntry, TensorStore};
use crate::tensor::{Bytes, DType};
use serde_json::json;

/// A fixture GGUF and its bytes (as the one file of `tensor`'s `files`).
fn fixture(name: &str) -> (Gguf, [Bytes; 1]) {
    let path = format!("{}/../tests/fixtures/gguf/{name}.gguf", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap();
    (Gguf::parse(&bytes, &path).unwrap(), [Bytes::from_vec(bytes)])
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
fn qwen2moe_f16_maps_every_tensor_back() {
    // Shared expert and its gate, q/k/v biases, the dense layer 1.
    same_as_checkpoint("qwen2moe-f16", "qwen2_moe", 138);
}

#[test]
fn glm4moe_f16_maps_every_tensor_back() {
    // Biases, q/k norms, post_attention_norm, exp_probs_b, shared expert, dense layer 0.
    same_as_checkpoint("glm4moe-f16", "glm4_moe", 121);
}

#[test]
fn deepseek2_kv_b_is_put_back_together() {
    // attn_k_b (each head's key block transposed) + attn_v_b -> kv_b_proj.
    same_as_checkpoint("deepseek2-f16", "deepseek_v3", 139);
    let (g, _) = fixture("deepseek2-f16");
    let im = import(&g).unwrap();
    let kv = im.tensors.iter().find(|p| p.name == "model.layers.1.self_attn.kv_b_proj.weight").unwrap();
    assert_eq!((kv.shape.clone(), kv.kv_split.is_some()), (vec![78, 28], true));
    assert_eq!(keep_dtype_for(&g, kv), DType::F16);
    assert!(stores_exactly_for(&g, kv, DType::F16) && !stores_exactly_for(&g, kv, DType::Int8 { group: 32 }));
    // The older layout: kv_b_proj whole (attn_kv_b), a plain q_proj.
    same_as_checkpoint("deepseek2-kv_b-f16", "deepseek_v3_noqlora", 98);
}

/// Q8_0 rows of `cols` values: f16 scale then 32 int8 per block, from a counter.
fn q8_0_rows(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut x = seed;
    for _ in 0..rows * cols / 32 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        out.extend(half::f16::from_f32(0.01 + (x >> 20) as f32 * 1e-5).to_le_bytes());
        for _ in 0..32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            out.push((x >> 16) as u8);
        }
    }
    out
}

/// kv_b_proj from quantized halves (real DeepSeek GGUFs: rows of 128/512 values, whole
/// Q8_0 blocks, unlike the fixtures): f32 gives the halves' exact values in kv_b_proj's
/// order; the kept type is int8/g32, re-quantized from them (not exact, so never claimed).
#[test]
fn kv_b_from_quantized_halves() {
    use crate::format::gguf::tests::Writer;
    let (heads, lora, nope, vd) = (2usize, 32usize, 32usize, 3usize);
    let w = Writer::new()
        .tensor(
            "blk.0.attn_k_b.weight",
            &[nope as u64, lora as u64, heads as u64],
            q::Q8_0,
            q8_0_rows(heads * lora, nope, 1),
        )
        .tensor(
            "blk.0.attn_v_b.weight",
            &[lora as u64, vd as u64, heads as u64],
            q::Q8_0,
            q8_0_rows(heads * vd, lora, 2),
        );
    let bytes = w.bytes();
    let g = Gguf::parse(&bytes, "x").unwrap();
    let file = [Bytes::from_vec(bytes)];
    assert!(kv_b_planned(&g, 0, 0, 1, 3).is_err(), "3 heads do not split 2-head halves");
    let p = kv_b_planned(&g, 0, 0, 1, heads).unwrap();
    assert_eq!(p.shape, vec![heads * (nope + vd), lora]);
    let (k, v) = (decode_all(&file, &g.tensors[0]).unwrap(), decode_all(&file, &g.tensors[1]).unwrap());
    let mut want = Vec::new();
    for h in 0..heads {
        for j in 0..nope {
            want.extend((0..lora).map(|c| k[(h * lora + c) * nope + j]));
        }
        want.extend_from_slice(&v[h * vd * lora..(h + 1) * vd * lora]);
    }
    let got = f32s(&tensor(&g, &file, &p, Some(DType::F32)).unwrap());
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()) && got.len() == want.len());
    let int8 = DType::Int8 { group: 32 };
    assert_eq!(keep_dtype_for(&g, &p), int8);
    assert!(!stores_exactly_for(&g, &p, int8) && stores_exactly_for(&g, &p, DType::F32));
    let kept = tensor(&g, &file, &p, None).unwrap();
    let mut row = vec![0u8; int8.row_bytes(lora).unwrap()];
    for (r, vals) in want.chunks(lora).enumerate() {
        quantize_row(int8, vals, &mut row).unwrap();
        assert_eq!(&kept.bytes.as_ref()[r * row.len()..(r + 1) * row.len()], &row[..], "row {r}");
    }
}

/// The config keys a GGUF carries equal the checkpoint's, and the config loads.
fn same_config(name: &str, hf: &str, keys: &[&str]) -> Json {
    let (g, _) = fixture(name);
    let c = import(&g).unwrap().config;
    let path = format!("{}/../tests/fixtures/{hf}/config.json", env!("CARGO_MANIFEST_DIR"));
    let want: Json = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    for k in keys {
        assert_eq!(c[*k], want[*k], "{name}: {k}");
    }
    crate::ModelConfig::from_value(&c).unwrap();
    c
}

#[test]
fn config_of_the_newer_families() {
    let common = [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "num_experts_per_tok",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "eos_token_id",
        "intermediate_size",
        "moe_intermediate_size",
        "norm_topk_prob",
    ];
    let moe = ["n_routed_experts", "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group"];
    let c = same_config("qwen2moe-f16", "qwen2_moe", &common);
    let c2 = same_config(
        "qwen2moe-f16",
        "qwen2_moe",
        &["num_experts", "shared_expert_intermediate_size", "mlp_only_layers", "qkv_bias", "num_key_value_heads"],
    );
    assert_eq!((c["mlp_only_layers"].clone(), c2["qkv_bias"].as_bool()), (json!([1]), Some(true)));
    let keys: Vec<&str> = common.iter().chain(&moe).copied().collect();
    let c = same_config("glm4moe-f16", "glm4_moe", &keys);
    same_config("glm4moe-f16", "glm4_moe", &["routed_scaling_factor", "head_dim", "use_qk_norm", "attention_bias"]);
    assert_eq!(c["partial_rotary_factor"], json!(0.5));
    let mla =
        ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_key_value_heads"];
    let c = same_config("deepseek2-f16", "deepseek_v3", &keys);
    same_config("deepseek2-f16", "deepseek_v3", &mla);
    same_config("deepseek2-f16", "deepseek_v3", &["routed_scaling_factor"]);
    // llama.cpp has one mscale (yarn_log_multiplier = 0.1 x mscale_all_dim): mscale equals it.
    let r = &c["rope_scaling"];
    assert_eq!((r["factor"].as_f64(), r["original_max_position_embeddings"].as_u64()), (Some(4.0), Some(64)));
    assert_eq!((r["mscale"].as_f64(), r["mscale_all_dim"].as_f64()), (Some(0.7), Some(0.7)));
    assert_eq!((c["rope_interleave"].as_bool(), c["scoring_func"].as_str()), (Some(true), Some("sigmoid")));
    let c = same_config("deepseek2-kv_b-f16", "deepseek_v3_noqlora", &keys);
    same_config("deepseek2-kv_b-f16", "deepseek_v3_noqlora", &mla);
    assert_eq!((c["q_lora_rank"].clone(), c.get("rope_scaling")), (Json::Null, None));
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
    let w = Writer::new().string("general.architecture", "gemma3");
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("\"gemma3\" is not supported"), "{e}");
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
    // The first part of a split GGUF, not joined with the others (Gguf::join).
    let w = Writer::new().string("general.architecture", "olmoe").u32("split.no", 0).u32("split.count", 3);
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("one of 3 parts of a split GGUF"), "{e}");
    let w = Writer::new().string("general.architecture", "olmoe").u32("split.count", 3);
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("split.no None of split.count Some(3) is not a part"), "{e}");
    let w = Writer::new()
        .string("general.architecture", "olmoe")
        .u32("olmoe.block_count", 1)
        .u32("olmoe.embedding_length", 4)
        .u32("olmoe.attention.head_count", 1);
    let e = import(&Gguf::parse(&w.bytes(), "x").unwrap()).err().unwrap().to_string();
    assert!(e.contains("Mixture-of-Experts"), "{e}");
}

/// Random damage to real files (bit flips and overwritten bytes in the header, random
/// truncations): parsing, mapping (deepseek2's kv_b put together included), the tokenizer
/// and tensor conversion return errors or values, never panic; a poor man's fuzz run that
/// needs no nightly (fuzz/ has the real one).
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
    for name in ["olmoe-f16", "mixtral-f16", "qwen3moe-q4_0-q8_0", "deepseek2-f16", "glm4moe-f16"] {
        let (g, file) = fixture(name);
        let header = g.data_start as usize;
        for i in 0..300 {
            let mut b = file[0].as_ref().to_vec();
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
            let bytes = [Bytes::from_vec(b)];
            for p in im.tensors.iter().filter(|p| p.shape.iter().product::<usize>() < 1 << 20).take(40) {
                let _ = tensor(&g, &bytes, p, None);
                let _ = tensor(&g, &bytes, p, Some(DType::Int4 { group: 32 }));
            }
        }
    }
    // Most damage lands in strings and values that still parse: the test reaches mapping.
    assert!(parsed > 50 && imported > 20, "parsed {parsed}, imported {imported}");
}

/// gpt-oss: the config llama.cpp's GGUF of the MXFP4 checkpoint carries is the
/// checkpoint's (its tensors: engine/tests/it/gguf_gpt_oss.rs, next to the model's loader).
#[test]
fn gpt_oss_config_is_the_checkpoints() {
    let c =
        same_config("gpt-oss-mxfp4", "gpt_oss_mxfp4", &["hidden_size", "head_dim", "sliding_window", "layer_types"]);
    assert_eq!((c["num_local_experts"].as_u64(), c["intermediate_size"].as_u64()), (Some(8), Some(32)));
    assert_eq!((c["swiglu_limit"].as_f64(), c["attention_bias"].as_bool()), (Some(7.0), Some(true)));
    let r = &c["rope_scaling"];
    assert_eq!(
        (r["rope_type"].as_str(), r["factor"].as_f64(), r["beta_fast"].as_f64()),
        (Some("yarn"), Some(8.0), Some(32.0))
    );
}

/// qwen3next: every tensor of llama.cpp's bf16 GGUF maps back to the checkpoint's:
/// `in_proj_qkvz` re-grouped from `attn_qkv` + `attn_gate` and the squeezed conv1d bit for
/// bit; the norms (stored + 1, rounded to bf16 by the converter) within that rounding;
/// `A_log` from `ssm_a` = -exp(A_log) (computed in bf16) within its rounding.
#[test]
fn qwen3next_maps_every_tensor_back() {
    let (g, file) = fixture("qwen3next-bf16");
    let im = import(&g).unwrap();
    let st = hf("qwen3_next");
    assert_eq!(im.tensors.len(), st.names().count());
    let mut mapped = std::collections::BTreeMap::new();
    for p in &im.tensors {
        let want = st.get(&p.name).unwrap_or_else(|_| panic!("{} not in the checkpoint", p.name));
        assert_eq!(p.shape, want.shape, "{}", p.name);
        let (got, want) = (f32s(&tensor(&g, &file, p, None).unwrap()), f32s(want));
        let kind = match p.values {
            Some(ValueMap::MinusOne) => {
                // bf16(w + 1) - 1: within half a bf16 step of numbers below 4.
                assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1.0 / 128.0), "{}", p.name);
                "norm"
            }
            Some(ValueMap::LogNeg) => {
                let close = got.iter().zip(&want).all(|(a, b)| (a.exp() / b.exp() - 1.0).abs() <= 1.0 / 128.0);
                assert!(close, "{}: {got:?} vs {want:?}", p.name);
                "A_log"
            }
            None => {
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} differs", p.name);
                "exact"
            }
        };
        *mapped.entry(kind).or_insert(0) += 1;
    }
    // 4 layers: 2 norms each (+ q/k norms of the attention layer) and the final norm;
    // A_log of the 3 linear layers.
    assert_eq!((mapped["norm"], mapped["A_log"]), (4 * 2 + 2 + 1, 3));
    let keys = [
        "layer_types",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_value_head_dim",
        "mlp_only_layers",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "intermediate_size",
        "num_experts",
        "head_dim",
        "norm_topk_prob",
    ];
    let c = same_config("qwen3next-bf16", "qwen3_next", &keys);
    assert_eq!(c["partial_rotary_factor"], json!(0.25));
}

/// Without --quant every GGUF type is stored exactly (Q4_K as q4_k, Q5_K as q5_k, Q5_0 and
/// IQ4_NL as int8/g32) but the ones with offsets, 8-bit sub-scales, non-linear levels,
/// 16-value sub-blocks or codebooks, which `coli info` then names.
#[test]
fn which_gguf_types_are_kept_exactly() {
    let kept = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q5_0", "IQ4_NL"];
    let requantized = ["Q6_K", "Q4_1", "Q5_1", "IQ4_XS", "Q2_K", "Q3_K", "IQ3_S", "IQ2_XXS", "IQ1_M"];
    for name in kept.into_iter().chain(requantized) {
        let ty = crate::format::gguf::GgmlType::by_name(name).unwrap();
        assert_eq!(stores_exactly(ty, keep_dtype(ty)), kept.contains(&name), "{name}");
    }
    assert_eq!(keep_dtype(crate::format::gguf::GgmlType::by_name("Q4_K").unwrap()), DType::Q4K);
    assert_eq!(keep_dtype(crate::format::gguf::GgmlType::by_name("Q5_K").unwrap()), DType::Q5K);
}

/// Every tensor of a bf16 GGUF of a bf16 checkpoint equals the checkpoint's bit for bit
/// (in f32), but those `ValueMap` changes (counted per kind, checked within bf16's
/// rounding as for qwen3next); a routed expert is compared with its rows of a fused
/// `experts.gate_up_proj` / `experts.down_proj` where the checkpoint has those.
fn bf16_as_checkpoint(name: &str, family: &str) -> std::collections::BTreeMap<&'static str, usize> {
    let (g, file) = fixture(name);
    let im = import(&g).unwrap();
    let st = hf(family);
    let mut kinds = std::collections::BTreeMap::new();
    let mut hf_names = std::collections::BTreeSet::new();
    for p in &im.tensors {
        let got = f32s(&tensor(&g, &file, p, None).unwrap());
        let want: Vec<f32> = match (st.get(&p.name), p.expert_of) {
            (Ok(t), _) => {
                assert_eq!(p.shape, t.shape, "{}", p.name);
                hf_names.insert(p.name.clone());
                f32s(t)
            }
            (Err(_), Some((l, e, part))) => {
                let fused = if part == 2 { "down_proj" } else { "gate_up_proj" };
                let fused = format!("model.layers.{l}.mlp.experts.{fused}");
                let t = st.get(&fused).unwrap_or_else(|_| panic!("{} not in the checkpoint", p.name));
                hf_names.insert(fused);
                let all = f32s(t);
                let n = p.shape[0] * p.shape[1];
                let per = all.len() / t.shape[0];
                let skip = e * per + if part == 1 { n } else { 0 };
                all[skip..skip + n].to_vec()
            }
            _ => panic!("{} not in the checkpoint", p.name),
        };
        let kind = match p.values {
            Some(ValueMap::MinusOne) => {
                assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1.0 / 128.0), "{}", p.name);
                "norm"
            }
            Some(ValueMap::LogNeg) => {
                let close = got.iter().zip(&want).all(|(a, b)| (a.exp() / b.exp() - 1.0).abs() <= 1.0 / 128.0);
                assert!(close, "{}: {got:?} vs {want:?}", p.name);
                "A_log"
            }
            None => {
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} differs", p.name);
                if p.vheads.is_some() {
                    "reordered"
                } else {
                    "exact"
                }
            }
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    // Every checkpoint tensor came back (the MTP module aside).
    let missing: Vec<&String> = st.names().filter(|n| !hf_names.contains(*n) && !n.starts_with("mtp.")).collect();
    assert!(missing.is_empty(), "{name}: not imported: {missing:?}");
    kinds
}

/// qwen35moe: the value heads llama.cpp's converter tiled (2 key heads, 4 value heads) are
/// put back grouped in in_proj_qkv, in_proj_z, in_proj_b/a, conv1d, out_proj's columns,
/// dt_bias and A_log; the norms stored + 1 and A_log as -exp(A_log) are mapped back; the
/// config is the checkpoint's text config.
#[test]
fn qwen35moe_maps_every_tensor_back() {
    let kinds = bf16_as_checkpoint("qwen35moe-bf16", "qwen3_5_moe");
    // 3 linear layers: qkv, z, b, a, conv1d, out_proj, dt_bias reordered (A_log too, counted
    // as A_log); 4 x 2 layer norms + q/k norms + the final norm.
    assert_eq!((kinds["reordered"], kinds["A_log"], kinds["norm"]), (3 * 7, 3, 4 * 2 + 2 + 1));
    let (g, _) = fixture("qwen35moe-bf16");
    let c = import(&g).unwrap().config;
    let path = format!("{}/../tests/fixtures/qwen3_5_moe/config.json", env!("CARGO_MANIFEST_DIR"));
    let want: Json = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let t = &want["text_config"];
    for k in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "layer_types",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_value_head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "eos_token_id",
    ] {
        assert_eq!(c[k], t[k], "{k}");
    }
    for k in ["partial_rotary_factor", "mrope_section", "mrope_interleaved", "rope_theta"] {
        assert_eq!(c["rope_parameters"][k], t["rope_parameters"][k], "{k}");
    }
    assert_eq!(c["model_type"], "qwen3_5_moe_text");
    let m = crate::ModelConfig::from_value(&c).unwrap();
    // (By name: a path into crate::model from format would be an arrow up the floors.)
    assert_eq!(format!("{:?}", m.family), "Qwen35Moe");
}

/// glm-dsa: every tensor of the bf16 GGUF is the checkpoint's (kv_b_proj put back
/// together from attn_k_b / attn_v_b, the indexer of the two full layers under its Hugging
/// Face names), and the config carries the indexer's sizes and per-layer kinds.
#[test]
fn glm_dsa_maps_every_tensor_back() {
    let kinds = bf16_as_checkpoint("glm-dsa-bf16", "glm_moe_dsa");
    assert_eq!(kinds.keys().copied().collect::<Vec<_>>(), ["exact"]);
    let keys = [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "num_experts_per_tok",
        "rms_norm_eps",
        "max_position_embeddings",
        "eos_token_id",
        "intermediate_size",
        "moe_intermediate_size",
        "norm_topk_prob",
        "n_routed_experts",
        "n_shared_experts",
        "first_k_dense_replace",
        "n_group",
        "topk_group",
        "routed_scaling_factor",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "num_key_value_heads",
        "index_n_heads",
        "index_head_dim",
        "index_topk",
        "indexer_types",
    ];
    let c = same_config("glm-dsa-bf16", "glm_moe_dsa", &keys);
    assert_eq!(c["indexer_types"], json!(["full", "shared", "full"]));
    let m = crate::ModelConfig::from_value(&c).unwrap();
    let dsa = m.mla.as_ref().and_then(|m| m.dsa.as_ref()).unwrap();
    assert_eq!((dsa.topk, dsa.full.clone(), dsa.interleave), (6, vec![true, false, true], true));
}

/// glm-dsa without a key or an indexer tensor it needs is one line naming it; without
/// `indexer.types`, llama.cpp's rule for a short context (every layer full) applies, and
/// the shared layer's missing indexer is named.
#[test]
fn glm_dsa_missing_indexer_parts_are_named() {
    let (g, _) = fixture("glm-dsa-bf16");
    for k in ["head_count", "key_length", "top_k"] {
        let mut b = g.clone();
        b.metadata.remove(&format!("glm-dsa.attention.indexer.{k}"));
        let e = import(&b).err().unwrap().to_string();
        assert!(e.contains(&format!("no glm-dsa.attention.indexer.{k}")), "{e}");
    }
    for t in ["blk.0.indexer.proj.weight", "blk.2.indexer.k_norm.bias", "blk.2.indexer.attn_q_b.weight"] {
        let mut b = g.clone();
        b.tensors.retain(|x| x.name != t);
        let e = import(&b).err().unwrap().to_string();
        assert!(e.contains(&format!("tensor {t} is missing")) && e.contains("indexer is full"), "{e}");
    }
    let mut b = g.clone();
    b.metadata.remove("glm-dsa.attention.indexer.types");
    let e = import(&b).err().unwrap().to_string();
    assert!(e.contains("tensor blk.1.indexer.attn_q_b.weight is missing") && e.contains("< 2^20"), "{e}");
    // A shared first layer cannot be run; an indexer tensor in a shared layer is refused.
    let mut b = g.clone();
    b.metadata.insert("glm-dsa.attention.indexer.types".into(), Value::Array(Array::Bool(vec![false, true, true])));
    assert!(import(&b).err().unwrap().to_string().contains("layer 0's indexer is shared"));
    let mut b = g.clone();
    b.metadata.insert("glm-dsa.attention.indexer.types".into(), Value::Array(Array::U8(vec![1, 0, 0])));
    let e = import(&b).err().unwrap().to_string();
    assert!(e.contains("tensor blk.2.indexer.") && e.contains("whose indexer is shared"), "{e}");
}

/// Experts whose gate and up are stacked in one tensor (`ffn_gate_up_exps`, per expert
/// the gate rows then the up rows), which llama.cpp's loader accepts as well as the two
/// apart, import to the same per-expert tensors as the glm-dsa fixture's separate ones.
#[test]
fn fused_gate_up_experts_import_like_separate_ones() {
    let (g, file) = fixture("glm-dsa-bf16");
    let bytes = file[0].as_ref();
    let (gate, up) = (g.tensor("blk.1.ffn_gate_exps.weight").unwrap(), g.tensor("blk.1.ffn_up_exps.weight").unwrap());
    let (n_e, block) = (gate.ne[2] as usize, gate.size as usize / gate.ne[2] as usize);
    let mut data = bytes.to_vec();
    let at = data.len() as u64;
    for e in 0..n_e {
        for t in [gate, up] {
            let o = t.offset as usize + e * block;
            data.extend_from_slice(&bytes[o..o + block]);
        }
    }
    let mut fused = g.clone();
    let mut info = gate.clone();
    (info.name, info.ne, info.offset, info.size) =
        ("blk.1.ffn_gate_up_exps.weight".into(), vec![gate.ne[0], 2 * gate.ne[1], gate.ne[2]], at, 2 * gate.size);
    fused.tensors.retain(|t| t.name != gate.name && t.name != up.name);
    fused.tensors.push(info);
    let files = [Bytes::from_vec(data)];
    let (a, b) = (import(&g).unwrap(), import(&fused).unwrap());
    assert_eq!(a.config, b.config);
    fn experts(im: &Imported) -> Vec<&Planned> {
        let mut v: Vec<&Planned> =
            im.tensors.iter().filter(|p| p.name.starts_with("model.layers.1.mlp.experts.")).collect();
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v
    }
    let (ea, eb) = (experts(&a), experts(&b));
    assert_eq!(ea.len(), 3 * n_e);
    assert_eq!(
        ea.iter().map(|p| (&p.name, &p.shape)).collect::<Vec<_>>(),
        eb.iter().map(|p| (&p.name, &p.shape)).collect::<Vec<_>>()
    );
    for (pa, pb) in ea.iter().zip(&eb) {
        let (ta, tb) = (tensor(&g, &file, pa, None).unwrap(), tensor(&fused, &files, pb, None).unwrap());
        assert_eq!((ta.dtype, ta.bytes.as_ref()), (tb.dtype, tb.bytes.as_ref()), "{}", pa.name);
    }
}
