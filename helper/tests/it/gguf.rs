//! `coli convert model.gguf` end to end, on GGUF files made by llama.cpp's own
//! convert_hf_to_gguf.py from the committed Hugging Face fixtures
//! (tools/make_gguf_fixtures.py):
//! - lossless sources (F16/F32) give byte-identical weights and bit-identical logits to
//!   `coli convert` of the safetensors checkpoint;
//! - Q8_0 / Q4_0 tensors keep gguf-py's dequantized values exactly (sha256 of every tensor);
//! - the tokenizer rebuilt from the metadata tokenizes and renders the chat template like
//!   the original tokenizer.json;
//! - damaged and hostile GGUFs are one line on stderr from `coli convert` and `coli info`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use colibri_engine::tensor::{decode_row, DType};
use colibri_engine::tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn gguf(name: &str) -> PathBuf {
    fixtures().join("gguf").join(format!("{name}.gguf"))
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-gguf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    coli().args(args).output().unwrap()
}

fn ok(out: Output) -> Output {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn convert(src: &Path, dst: &Path, extra: &[&str]) {
    let mut c = coli();
    c.arg("convert").arg(src).arg("-o").arg(dst).args(extra);
    ok(c.output().unwrap());
}

fn logits(model: &Path, ids: &str) -> Vec<u8> {
    let out = model.join("logits.f32");
    ok(coli().args(["logits", "--model"]).arg(model).args(["--ids", ids, "--out"]).arg(&out).output().unwrap());
    std::fs::read(out).unwrap()
}

/// A copy of a fixture checkpoint whose config.json is changed by `edit` (to what
/// llama.cpp's GGUF of it says where the two differ).
fn checkpoint_with(family: &str, dir: &Path, edit: impl Fn(&mut serde_json::Map<String, Value>)) -> PathBuf {
    let src = fixtures().join(family);
    let dst = dir.join(format!("{family}-hf"));
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    edit(cfg.as_object_mut().unwrap());
    std::fs::write(dst.join("config.json"), serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    dst
}

fn reference_ids(family: &str) -> String {
    let r: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(family).join("reference.json")).unwrap()).unwrap();
    r["ids"].as_array().unwrap().iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// The greedy continuation of the fixture's reference prompt (`reference.json`).
fn greedy(model: &Path, family: &str) -> Vec<u64> {
    let r: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(family).join("reference.json")).unwrap()).unwrap();
    let g = &r["greedy"];
    let prompt: Vec<String> = g["prompt_ids"].as_array().unwrap().iter().map(|x| x.to_string()).collect();
    let n = g["new_ids"].as_array().unwrap().len().to_string();
    let out = ok(coli()
        .args(["generate", "--model"])
        .arg(model)
        .args(["--ids", &prompt.join(","), "--max-new-tokens", &n, "--temperature", "0", "--json"])
        .output()
        .unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

/// llama.cpp's f16 GGUF of a checkpoint, converted as is, equals the checkpoint converted
/// to f16: the same weights.bin bytes, bit-identical logits and the same greedy tokens.
/// The checkpoint's config is first changed by `edit` where llama.cpp's GGUF says less
/// or otherwise (see each test).
fn lossless(name: &str, family: &str, edit: impl Fn(&mut serde_json::Map<String, Value>)) -> Vec<u64> {
    lossless_as(name, family, &["--quant", "f16"], edit)
}

/// [`lossless`] with the checkpoint converted with `hf_args`.
fn lossless_as(
    name: &str,
    family: &str,
    hf_args: &[&str],
    edit: impl Fn(&mut serde_json::Map<String, Value>),
) -> Vec<u64> {
    let dir = scratch(name);
    let hf = checkpoint_with(family, &dir, edit);
    let (a, b) = (dir.join("from-gguf"), dir.join("from-hf"));
    convert(&gguf(name), &a, &[]);
    convert(&hf, &b, hf_args);
    let (wa, wb) = (std::fs::read(a.join("weights.bin")).unwrap(), std::fs::read(b.join("weights.bin")).unwrap());
    assert!(wa == wb, "{name}: weights.bin differs ({} vs {} bytes)", wa.len(), wb.len());
    let ids = reference_ids(family);
    let (la, lb) = (logits(&a, &ids), logits(&b, &ids));
    assert!(la == lb && !la.is_empty(), "{name}: logits differ");
    let (ga, gb) = (greedy(&a, family), greedy(&b, family));
    assert!(ga == gb && !ga.is_empty(), "{name}: greedy {ga:?} vs {gb:?}");
    let info = String::from_utf8(ok(run(&["info".as_ref(), a.as_os_str()])).stdout).unwrap();
    assert!(info.contains(&format!("converted from GGUF {name}.gguf")), "{info}");
    let _ = std::fs::remove_dir_all(&dir);
    ga
}

/// The fixture's own greedy ids (transformers, f32): f16 weights keep them here.
fn reference_greedy(family: &str) -> Vec<u64> {
    let r: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(family).join("reference.json")).unwrap()).unwrap();
    r["greedy"]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn olmoe_f16_gguf_equals_the_checkpoint() {
    // convert_hf_to_gguf's OlmoeModel does not write clip_qkv.
    lossless("olmoe-f16", "olmoe", |c| {
        c.remove("clip_qkv");
    });
}

#[test]
fn mixtral_f16_gguf_equals_the_checkpoint() {
    // llama.cpp's GGUF does not record mixtral's sliding_window.
    lossless("mixtral-f16", "mixtral", |c| {
        c.remove("sliding_window");
    });
}

#[test]
fn qwen2moe_f16_gguf_equals_the_checkpoint() {
    let ids = lossless("qwen2moe-f16", "qwen2_moe", |_| {});
    assert_eq!(ids, reference_greedy("qwen2_moe"));
}

#[test]
fn glm4moe_f16_gguf_equals_the_checkpoint() {
    let ids = lossless("glm4moe-f16", "glm4_moe", |_| {});
    assert_eq!(ids, reference_greedy("glm4_moe"));
}

/// llama.cpp's deepseek2 has one YaRN mscale (the fixture's mscale 1.0 != mscale_all_dim
/// 0.7 is not expressible: the GGUF means mscale = mscale_all_dim, as in the released
/// checkpoints) and always rotates interleaved pairs (deepseek_v3_noqlora has
/// `rope_interleave: false`): the checkpoints are compared with what the GGUFs mean.
#[test]
fn deepseek2_f16_ggufs_equal_the_checkpoints() {
    lossless("deepseek2-f16", "deepseek_v3", |c| c["rope_parameters"]["mscale"] = serde_json::json!(0.7));
    lossless("deepseek2-kv_b-f16", "deepseek_v3_noqlora", |c| {
        c.insert("rope_interleave".into(), true.into());
    });
}

/// gpt-oss: llama.cpp's bf16 GGUF of the MXFP4 checkpoint keeps the MXFP4 experts (in
/// ggml's block layout, moved back here nibble for nibble) and the bf16 weights, so it
/// equals the checkpoint converted with MXFP4 experts (no --quant) and bf16 dense weights.
/// llama.cpp's gpt-oss has the clamped SwiGLU's limit 7.0 as a constant (the fixture's
/// is 2.0) and rounds YaRN's correction range outward (transformers' `truncate: true`):
/// the checkpoint is compared with what the GGUF means.
#[test]
fn gpt_oss_mxfp4_gguf_equals_the_checkpoint() {
    let bf16 = ["--embed", "bf16", "--lm-head", "bf16", "--attn", "bf16"];
    lossless_as("gpt-oss-mxfp4", "gpt_oss_mxfp4", &bf16, |c| {
        c.insert("swiglu_limit".into(), 7.0.into());
        c["rope_parameters"]["truncate"] = true.into();
    });
    // The experts really are MXFP4 in the container, not widened.
    let dir = scratch("gpt-oss-kinds");
    convert(&gguf("gpt-oss-mxfp4"), &dir.join("o"), &[]);
    let m: Value = serde_json::from_slice(&std::fs::read(dir.join("o/colibri.json")).unwrap()).unwrap();
    for p in m["experts"]["layers"][0]["parts"].as_array().unwrap() {
        assert_eq!(p["dtype"], "mxfp4", "{p}");
    }
    let info = String::from_utf8(ok(run(&["info".as_ref(), dir.join("o").as_os_str()])).stdout).unwrap();
    assert!(info.contains("gpt-oss; tensors BF16 x 14, F32 x 37, MXFP4 x 9"), "{info}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// qwen3next: llama.cpp's converter stores the norms plus one (undone exactly: f32 sums of
/// bf16 weights) and `ssm_a` = -exp(A_log) computed by torch, so A_log = ln(-ssm_a) is
/// the checkpoint's only within the last bits (weights.bin differs there); the engine's
/// -exp(A_log) maps both to the same f32 on this fixture, so the logits are bit-identical,
/// and the greedy tokens are the checkpoint's and transformers'.
#[test]
fn qwen3next_gguf_runs_as_the_checkpoint() {
    let dir = scratch("qwen3next");
    let (a, b) = (dir.join("from-gguf"), dir.join("from-hf"));
    convert(&gguf("qwen3next-bf16"), &a, &[]);
    convert(&fixtures().join("qwen3_next"), &b, &["--quant", "bf16"]);
    let ids = reference_ids("qwen3_next");
    let f32s =
        |v: Vec<u8>| -> Vec<f32> { v.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let (la, lb) = (f32s(logits(&a, &ids)), f32s(logits(&b, &ids)));
    assert_eq!(la.len(), lb.len());
    let mean = lb.iter().sum::<f32>() / lb.len() as f32;
    let std = (lb.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / lb.len() as f32).sqrt();
    let max = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    eprintln!("qwen3next GGUF vs checkpoint: max |logit diff| {max:e}, logit std {std:e}");
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()), "max |diff| {max} vs std {std}");
    let (ga, gb) = (greedy(&a, "qwen3_next"), greedy(&b, "qwen3_next"));
    assert_eq!(ga, gb);
    assert_eq!(ga, reference_greedy("qwen3_next"));
    let info = String::from_utf8(ok(run(&["info".as_ref(), a.as_os_str()])).stdout).unwrap();
    assert!(info.contains("converted from GGUF qwen3next-bf16.gguf (qwen3next;"), "{info}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// `coli logits` of `model` on the fixture's reference ids against transformers' logits
/// (`logits.bin`): the largest |difference| over the logits' standard deviation.
fn against_transformers(model: &Path, family: &str) -> f64 {
    let got = f32s(&logits(model, &reference_ids(family)));
    let want = f32s(&std::fs::read(fixtures().join(family).join("logits.bin")).unwrap());
    assert_eq!(got.len(), want.len());
    let r: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(family).join("reference.json")).unwrap()).unwrap();
    let std = r["logits_std"].as_f64().unwrap();
    got.iter().zip(&want).map(|(a, b)| (*a as f64 - *b as f64).abs()).fold(0.0, f64::max) / std
}

/// The two newest architectures, written in llama.cpp's layout (fixtures_gguf_layout.py)
/// from bf16 checkpoints: the converted GGUF gives transformers' logits within 1e-3 of
/// their standard deviation (as the checkpoints themselves do) and its greedy tokens, the
/// same logits bit for bit as the checkpoint converted to bf16 (qwen35moe's norms, stored
/// plus one in f32, come back exactly; A_log = ln(-ssm_a) may differ in its last bits, which
/// the engine's -exp maps to the same f32 here, as for qwen3next), and a sequence longer
/// than glm-dsa's index_topk (6) so the sparse selection decides.
#[test]
fn qwen35moe_and_glm_dsa_ggufs_run_as_the_checkpoints() {
    for (name, family) in [("qwen35moe-bf16", "qwen3_5_moe"), ("glm-dsa-bf16", "glm_moe_dsa")] {
        let dir = scratch(name);
        let (a, b) = (dir.join("from-gguf"), dir.join("from-hf"));
        convert(&gguf(name), &a, &[]);
        convert(&fixtures().join(family), &b, &["--quant", "bf16"]);
        let rel = against_transformers(&a, family);
        let rel_hf = against_transformers(&b, family);
        let ids = reference_ids(family);
        assert!(ids.split(',').count() > 6, "{family}: the sequence must be longer than index_topk");
        let (la, lb) = (f32s(&logits(&a, &ids)), f32s(&logits(&b, &ids)));
        let max = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        eprintln!("{name}: max |diff| / std vs transformers {rel:e} (checkpoint: {rel_hf:e}); vs the checkpoint converted: max |diff| {max:e}");
        assert!(rel < 1e-3, "{name}: {rel} of the logits' std from transformers'");
        assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: max |diff| {max}");
        let (ga, gb) = (greedy(&a, family), greedy(&b, family));
        assert_eq!(ga, reference_greedy(family), "{name}");
        assert_eq!(ga, gb, "{name}");
        let info = String::from_utf8(ok(run(&["info".as_ref(), a.as_os_str()])).stdout).unwrap();
        assert!(info.contains(&format!("converted from GGUF {name}.gguf")), "{info}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A glm-dsa GGUF without an indexer key, or without a full layer's indexer tensor (here
/// renamed into the shared layer), is one line naming it, and nothing is written.
#[test]
fn glm_dsa_without_indexer_parts_is_one_line() {
    let dir = scratch("glm-dsa-bad");
    let good = std::fs::read(gguf("glm-dsa-bf16")).unwrap();
    let patch = |from: &[u8], to: &[u8]| {
        let mut b = good.clone();
        let at = good.windows(from.len()).position(|w| w == from).unwrap();
        b[at..at + to.len()].copy_from_slice(to);
        b
    };
    let b = patch(b"glm-dsa.attention.indexer.top_k", b"glm-dsa.attention.indexer.top_x");
    let e = refused(&b, &dir, "no-topk");
    assert!(e.contains("no glm-dsa.attention.indexer.top_k"), "{e}");
    let b = patch(b"blk.0.indexer.proj.weight", b"blk.1.indexer.proj.weight");
    let e = refused(&b, &dir, "no-proj");
    assert!(e.contains("tensor blk.0.indexer.proj.weight is missing"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Hugging Face name of a qwen3moe GGUF tensor, or the expert part for stacked ones.
fn hf_name(gguf_name: &str) -> Result<String, (usize, &'static str)> {
    let map = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    if let Some((_, h)) = map.iter().find(|(g, _)| *g == gguf_name) {
        return Ok(h.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.").unwrap();
    let (l, rest) = rest.split_once('.').unwrap();
    let l: usize = l.parse().unwrap();
    for (part, g) in [("gate", "ffn_gate_exps.weight"), ("up", "ffn_up_exps.weight"), ("down", "ffn_down_exps.weight")]
    {
        if rest == g {
            return Err((l, part));
        }
    }
    let suffix = match rest {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_gate_inp.weight" => "mlp.gate.weight",
        other => panic!("unexpected {other}"),
    };
    Ok(format!("model.layers.{l}.{suffix}"))
}

fn dtype(v: &Value) -> DType {
    DType::from_name(v["dtype"].as_str().unwrap(), v["group_size"].as_u64().map(|g| g as u32)).unwrap()
}

/// Decodes `rows` rows of `cols` values at `offset` of the data file into `out` (LE f32).
fn decode(data: &[u8], dt: DType, offset: usize, rows: usize, cols: usize, out: &mut Vec<u8>) {
    let rb = dt.row_bytes(cols).unwrap();
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        decode_row(dt, cols, &data[offset + r * rb..offset + (r + 1) * rb], &mut row);
        out.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
}

/// Every tensor of fixture `name` (the names of `name.ref.json`) as the conversion `out`
/// stores it, decoded: (GGUF name, GGUF type, stored type, LE f32 values in GGUF order).
fn stored_values(out: &Path, name: &str) -> Vec<(String, String, DType, Vec<u8>)> {
    let m: Value = serde_json::from_slice(&std::fs::read(out.join("colibri.json")).unwrap()).unwrap();
    let data = std::fs::read(out.join("weights.bin")).unwrap();
    let refs: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(format!("gguf/{name}.ref.json"))).unwrap()).unwrap();
    let mut all = Vec::new();
    for (name, r) in refs.as_object().unwrap() {
        let mut values = Vec::new();
        let dt = match hf_name(name) {
            Ok(hf) => {
                let t = m["dense"]["tensors"].as_array().unwrap().iter().find(|t| t["name"] == hf.as_str()).unwrap();
                let shape: Vec<usize> =
                    t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
                let cols = *shape.last().unwrap();
                let rows = shape.iter().product::<usize>() / cols;
                decode(&data, dtype(t), t["offset"].as_u64().unwrap() as usize, rows, cols, &mut values);
                dtype(t)
            }
            Err((l, part)) => {
                let layer = m["experts"]["layers"].as_array().unwrap().iter().find(|x| x["layer"] == l).unwrap();
                let p = layer["parts"].as_array().unwrap().iter().find(|p| p["name"] == part).unwrap();
                let (rows, cols) = (p["shape"][0].as_u64().unwrap() as usize, p["shape"][1].as_u64().unwrap() as usize);
                for e in layer["experts"].as_array().unwrap() {
                    let at = (e["offset"].as_u64().unwrap() + p["offset"].as_u64().unwrap()) as usize;
                    decode(&data, dtype(p), at, rows, cols, &mut values);
                }
                dtype(p)
            }
        };
        all.push((name.clone(), r["type"].as_str().unwrap().to_string(), dt, values));
    }
    all
}

/// Every tensor of the conversion `out` of fixture `name` decoded and compared with
/// gguf-py's values (`name.ref.json`: sha256 per tensor); returns "GGUF type->stored type"
/// for each kind met.
fn assert_values_kept(out: &Path, name: &str) -> Vec<String> {
    let refs: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(format!("gguf/{name}.ref.json"))).unwrap()).unwrap();
    let mut kinds = std::collections::BTreeSet::new();
    for (name, ty, dt, values) in stored_values(out, name) {
        let sum = format!("{:x}", Sha256::digest(&values));
        assert_eq!(sum, refs[&name]["sha256"].as_str().unwrap(), "{name} ({ty}): values differ from gguf-py's");
        kinds.insert(format!("{ty}->{dt}"));
    }
    kinds.into_iter().collect()
}

#[test]
fn q8_0_and_q4_0_values_are_kept_exactly() {
    let dir = scratch("q");
    let out = dir.join("q3");
    convert(&gguf("qwen3moe-q4_0-q8_0"), &out, &[]);
    let kinds = assert_values_kept(&out, "qwen3moe-q4_0-q8_0");
    assert_eq!(kinds, ["F16->f16", "F32->f32", "Q4_0->int4/g32", "Q8_0->int8/g32"]);
    // An explicit int8 keeps Q4_0 and Q8_0 exactly too (the same scales, wider integers);
    // and the model runs.
    let out8 = dir.join("q3-int8");
    convert(&gguf("qwen3moe-q4_0-q8_0"), &out8, &["--quant", "int8"]);
    let l = logits(&out8, "1,2,3");
    assert_eq!(l.len(), 3 * 401 * 4);
    // `coli info` says which GGUF tensors were re-quantized rather than kept.
    let info = |d: &Path| String::from_utf8(ok(run(&["info".as_ref(), d.as_os_str()])).stdout).unwrap();
    assert!(info(&out).contains("every tensor's values kept exactly"), "{}", info(&out));
    let out4 = dir.join("q3-int4");
    convert(&gguf("qwen3moe-q4_0-q8_0"), &out4, &["--quant", "int4", "--attn", "int4"]);
    let i4 = info(&out4);
    // int4 holds Q4_0 exactly, not Q8_0 (but the embeddings, int8 by default) nor F16.
    let (_, requantized) = i4.split_once("re-quantized, not kept exactly: ").expect(&i4);
    assert!(requantized.starts_with("F16 x 4, Q8_0 x 6)"), "{i4}");
    let f = info(&gguf("qwen3moe-q4_0-q8_0"));
    assert!(f.contains("`coli convert` keeps every value exactly"), "{f}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The logits of the fixture conversion `out` (eight ids of the 1700-token vocabulary)
/// within `max` relative L2 of those of its f32 conversion `f32_out` (the quantized kernels
/// against plain float arithmetic), and on wgpu (where an adapter answers) the CPU's bits.
fn assert_logits_near_f32_and_wgpu_same(out: &Path, f32_out: &Path, dir: &Path, what: &str, max: f64) {
    let ids = "1,2,3,40,500,1600,7,7";
    let f = |b: Vec<u8>| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let (k, want) = (f(logits(out, ids)), f(logits(f32_out, ids)));
    assert_eq!(k.len(), 8 * 1700);
    let err: f64 = k.iter().zip(&want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
    eprintln!("{what} logits against f32: relative L2 {:.2e}", err / norm);
    assert!(norm > 0.0 && err / norm < max, "{what} logits {:.3e} from f32's", err / norm);
    let wgpu = dir.join(format!("{what}-wgpu.f32"));
    let mut cmd = coli();
    cmd.args(["logits", "--model"]).arg(out).args(["--ids", ids, "--backend", "wgpu", "--out"]).arg(&wgpu);
    let o = cmd.output().unwrap();
    if o.status.success() {
        assert!(f(std::fs::read(&wgpu).unwrap()) == k, "wgpu logits of {what} differ from the CPU's");
        return;
    }
    // Only a missing adapter is a reason to leave wgpu out (gpu_cli.rs's rule): any other
    // failure (a shader that does not compile for this dtype) fails the test.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no Vulkan adapter; install mesa-vulkan-drivers"), "wgpu run of {what} failed: {err}");
    assert!(std::env::var("COLIBRI_REQUIRE_GPU").ok().as_deref() != Some("1"), "COLIBRI_REQUIRE_GPU=1 but: {err}");
    eprintln!("skipping wgpu for {what}: {err}");
}

/// A Q4_K GGUF (what Q4_K_M and Q4_K_S files mostly hold): `coli convert` keeps its blocks
/// as q4_k (gguf-py's values bit for bit, half the bytes of the int8/g32 it was before), and
/// the model runs: its logits within int8 activation rounding of those of the same GGUF
/// converted to f32 (the Q4K kernels against plain float arithmetic), and on wgpu (where an
/// adapter answers) the CPU's bits.
#[test]
fn q4_k_blocks_are_kept_and_run() {
    let dir = scratch("q4k");
    let out = dir.join("k");
    convert(&gguf("olmoe-q4_k"), &out, &[]);
    assert_eq!(assert_values_kept(&out, "olmoe-q4_k"), ["F32->f32", "Q4_K->q4_k"]);
    let info = |d: &Path| String::from_utf8(ok(run(&["info".as_ref(), d.as_os_str()])).stdout).unwrap();
    assert!(info(&out).contains("every tensor's values kept exactly"), "{}", info(&out));
    assert!(info(&gguf("olmoe-q4_k")).contains("`coli convert` keeps every value exactly"));
    let f32_out = dir.join("f");
    convert(&gguf("olmoe-q4_k"), &f32_out, &["--quant", "f32"]);
    assert_logits_near_f32_and_wgpu_same(&out, &f32_out, &dir, "q4_k", 0.02);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The conversion `out` of fixture `name` against its f32 conversion `f32_out` (which holds
/// gguf-py's values exactly): the tensors of the GGUF types in `requant` re-quantized to
/// the stored type named there (int8: every value within half a step, amax / 127 of its
/// group, the f16 scale's rounding included; int4, whose search may clip: each group's
/// squared error within that of rounding every value to half a step, amax / 7), every
/// other tensor kept bit for bit. Returns "GGUF type->stored type" for each kind met.
fn assert_kept_or_requantized(out: &Path, f32_out: &Path, name: &str, requant: &[(&str, DType)]) -> Vec<String> {
    let refs: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join(format!("gguf/{name}.ref.json"))).unwrap()).unwrap();
    let exact: std::collections::BTreeMap<_, _> =
        stored_values(f32_out, name).into_iter().map(|(n, _, _, v)| (n, v)).collect();
    let f = |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let mut kinds = std::collections::BTreeSet::new();
    for (name, ty, dt, values) in stored_values(out, name) {
        assert_eq!(format!("{:x}", Sha256::digest(&exact[&name])), refs[&name]["sha256"].as_str().unwrap(), "{name}");
        kinds.insert(format!("{ty}->{dt}"));
        let Some((_, want_dt)) = requant.iter().find(|(t, _)| *t == ty) else {
            assert!(values == exact[&name], "{name} ({ty}) not kept exactly");
            continue;
        };
        assert_eq!(dt, *want_dt, "{name} ({ty})");
        let (got, want) = (f(&values), f(&exact[&name]));
        assert!(got != want, "{name}: {dt} cannot hold {ty}'s values exactly");
        let levels = if matches!(dt, DType::Int4 { .. }) { 7.0 } else { 127.0 };
        // Rows are 256 long: a group never straddles two rows.
        for (g, w) in got.chunks(dt.group().unwrap() as usize).zip(want.chunks(dt.group().unwrap() as usize)) {
            let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let half = amax / levels * 0.5 * 1.002 + 1e-7;
            if levels == 127.0 {
                let worst = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(worst <= half, "{name}: {worst} from exact, amax {amax}");
            } else {
                let sse: f32 = g.iter().zip(w).map(|(a, b)| (a - b) * (a - b)).sum();
                assert!(sse <= g.len() as f32 * half * half, "{name}: squared error {sse}, amax {amax}");
            }
        }
    }
    kinds.into_iter().collect()
}

/// A Q4_K_M file as llama.cpp's own quantizer writes it (Q4_K, and Q6_K for the output
/// and layer 1's attn_v and ffn_down): the Q4_K tensors kept bit for bit, the Q6_K ones
/// re-quantized to int8 with group `G` (128) within half a step of gguf-py's values, and
/// `coli info` naming them; the logits close to the f32 conversion's, and on wgpu (where
/// an adapter answers) the CPU's bits.
#[test]
fn a_q4_k_m_file_keeps_q4_k_and_requantizes_q6_k_finely() {
    const G: u32 = colibri_engine::format::gguf_import::REQUANT_GROUP;
    let dir = scratch("q4km");
    let (out, f32_out) = (dir.join("k"), dir.join("f"));
    convert(&gguf("olmoe-q4_k_m"), &out, &[]);
    convert(&gguf("olmoe-q4_k_m"), &f32_out, &["--quant", "f32"]);
    let kinds = assert_kept_or_requantized(&out, &f32_out, "olmoe-q4_k_m", &[("Q6_K", DType::Int8 { group: G })]);
    assert_eq!(kinds, ["F32->f32".to_string(), "Q4_K->q4_k".into(), format!("Q6_K->int8/g{G}")]);
    let info = String::from_utf8(ok(run(&["info".as_ref(), out.as_os_str()])).stdout).unwrap();
    assert!(info.contains("re-quantized, not kept exactly: Q6_K x 3"), "{info}");
    assert_logits_near_f32_and_wgpu_same(&out, &f32_out, &dir, "q4_k_m", 0.02);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Q5_K_M file as llama.cpp's quantizer writes it (Q5_K, and Q6_K where Q4_K_M has it):
/// the Q5_K tensors kept bit for bit as q5_k (fifth bits and all), the Q6_K ones re-quantized
/// to int8/g128 within half a step; the logits close to the f32 conversion's, and on wgpu
/// (where an adapter answers) the CPU's bits.
#[test]
fn a_q5_k_m_file_keeps_q5_k() {
    const G: u32 = colibri_engine::format::gguf_import::REQUANT_GROUP;
    let dir = scratch("q5km");
    let (out, f32_out) = (dir.join("k"), dir.join("f"));
    convert(&gguf("olmoe-q5_k_m"), &out, &[]);
    convert(&gguf("olmoe-q5_k_m"), &f32_out, &["--quant", "f32"]);
    let kinds = assert_kept_or_requantized(&out, &f32_out, "olmoe-q5_k_m", &[("Q6_K", DType::Int8 { group: G })]);
    assert_eq!(kinds, ["F32->f32".to_string(), "Q5_K->q5_k".into(), format!("Q6_K->int8/g{G}")]);
    let info = String::from_utf8(ok(run(&["info".as_ref(), out.as_os_str()])).stdout).unwrap();
    assert!(info.contains("re-quantized, not kept exactly: Q6_K x 3"), "{info}");
    assert_logits_near_f32_and_wgpu_same(&out, &f32_out, &dir, "q5_k_m", 0.02);
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama.cpp's Q2_K, Q3_K, IQ3_S, IQ4_XS, IQ4_NL, Q4_1, Q5_0 and Q5_1 tensors in one file
/// (the fixture takes each matrix from one of its quantizations of one f16 model): Q5_0 and
/// IQ4_NL kept bit for bit as int8/g32 (their integers under their own f16 scales), Q4_1,
/// Q5_1, IQ4_XS and Q6_K re-quantized to int8/g128, Q2_K, Q3_K and IQ3_S to int4/g32, each within
/// its bound of gguf-py's values; `coli info` of the file says which and to what; the
/// logits close to the f32 conversion's and on wgpu the CPU's bits.
#[test]
fn llama_cpp_k_legacy_and_i_quant_tensors_convert() {
    use colibri_engine::format::gguf_import::REQUANT_GROUP as G;
    let dir = scratch("mix");
    let (out, f32_out) = (dir.join("m"), dir.join("f"));
    convert(&gguf("olmoe-mix"), &out, &[]);
    convert(&gguf("olmoe-mix"), &f32_out, &["--quant", "f32"]);
    let (i8g, i4) = (DType::Int8 { group: G }, DType::Int4 { group: 32 });
    let requant = [("Q4_1", i8g), ("Q5_1", i8g), ("IQ4_XS", i8g), ("Q6_K", i8g), ("Q2_K", i4), ("Q3_K", i4)];
    let requant = [requant.as_slice(), &[("IQ3_S", i4)]].concat();
    let kinds = assert_kept_or_requantized(&out, &f32_out, "olmoe-mix", &requant);
    let want = ["F32->f32", "IQ3_S->int4/g32", "IQ4_NL->int8/g32", "IQ4_XS->int8/g128", "Q2_K->int4/g32"];
    let want = want.into_iter().chain(["Q3_K->int4/g32", "Q4_1->int8/g128", "Q5_0->int8/g32", "Q5_1->int8/g128"]);
    let want = want.chain(["Q6_K->int8/g128"]);
    assert_eq!(kinds, want.collect::<Vec<_>>());
    let info = String::from_utf8(ok(run(&["info".as_ref(), gguf("olmoe-mix").as_os_str()])).stdout).unwrap();
    let says =
        "but those of IQ3_S, Q2_K, Q3_K (re-quantized to int4/g32), IQ4_XS, Q4_1, Q5_1, Q6_K (re-quantized to int8/g128)";
    assert!(info.contains(says), "{info}");
    // int4 re-quantization moves a 2-layer model of random weights by about 10% (1.01e-1
    // measured; the values' own bounds are checked above); a wrong decoding moves it by 100%.
    assert_logits_near_f32_and_wgpu_same(&out, &f32_out, &dir, "mix", 0.15);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tokenizer_from_metadata_matches_tokenizer_json() {
    let dir = scratch("tok");
    let out = dir.join("o");
    convert(&gguf("olmoe-f16"), &out, &[]);
    let ours = Tokenizer::from_dir(&out).unwrap();
    let orig = Tokenizer::from_dir(&fixtures().join("olmoe")).unwrap();
    let r: Value = serde_json::from_slice(&std::fs::read(fixtures().join("olmoe/reference.json")).unwrap()).unwrap();
    let mut texts: Vec<String> =
        r["tokenizer"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap().to_string()).collect();
    texts.push("<|im_start|>user\nhi<|im_end|> <|endoftext|>  \n\t 12345 don't WE'LL ünïcödé 🦙".into());
    for t in &texts {
        let (a, b) = (ours.encode(t, true).unwrap(), orig.encode(t, true).unwrap());
        assert_eq!(a, b, "{t:?}");
        assert_eq!(ours.decode(&a, false).unwrap(), orig.decode(&b, false).unwrap());
    }
    for (i, t) in r["tokenizer"].as_array().unwrap().iter().enumerate() {
        let want: Vec<u32> = t["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(ours.encode(texts[i].as_str(), false).unwrap(), want, "transformers' ids");
    }
    let msgs: Vec<ChatMessage> = r["chat"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(ours.apply_chat_template(&msgs, true).unwrap(), r["chat"]["rendered"].as_str().unwrap());
    assert_eq!(ours.eos_token_ids(), orig.eos_token_ids());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `coli convert` and `coli info` on `bytes` and returns the one stderr line.
fn refused(bytes: &[u8], dir: &Path, tag: &str) -> String {
    let f = dir.join(format!("{tag}.gguf"));
    std::fs::write(&f, bytes).unwrap();
    let mut lines = Vec::new();
    for args in [
        vec!["convert".as_ref(), f.as_os_str(), "-o".as_ref(), dir.join(tag).as_os_str()],
        vec!["info".as_ref(), f.as_os_str()],
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
        assert!(!out.status.success(), "{tag}: {args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{tag}: {args:?}: {err}");
        assert!(!err.contains("panicked"), "{tag}: {err}");
        lines.push(err);
    }
    assert!(!dir.join(tag).join("colibri.json").exists());
    lines.join(" | ")
}

#[test]
fn damaged_and_hostile_ggufs_are_one_line_errors() {
    let dir = scratch("bad");
    let good = std::fs::read(gguf("qwen3moe-q4_0-q8_0")).unwrap();
    let e = refused(&good[..good.len() / 2], &dir, "truncated");
    assert!(e.contains("runs past the end of the file"), "{e}");
    for n in [0, 3, 10, 30, 100, 1000] {
        let e = refused(&good[..n], &dir, &format!("header{n}"));
        assert!(e.contains("truncated") || e.contains("too short") || e.contains("more than the file"), "{e}");
    }
    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGUG");
    let e = refused(&b, &dir, "magic");
    assert!(e.contains("magic"), "{e}");
    let mut b = good.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(refused(&b, &dir, "v1").contains("version 1"));
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(refused(&b, &dir, "count").contains("tensor count"));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(refused(&b, &dir, "kv").contains("metadata count"));
    // Every tensor offset moved past the end of the file (the last u64 of each entry).
    let mut b = good.clone();
    let g = colibri_engine::format::gguf::Gguf::parse(&good, "x").unwrap();
    let name = g.tensors[3].name.as_bytes();
    let at = good.windows(name.len()).position(|w| w == name).unwrap();
    let n_dims = u32::from_le_bytes(good[at + name.len()..at + name.len() + 4].try_into().unwrap()) as usize;
    let off_at = at + name.len() + 4 + 8 * n_dims + 4;
    b[off_at..off_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = refused(&b, &dir, "offset");
    assert!(e.contains(&format!("tensor {}", g.tensors[3].name)) && e.contains("runs past the end"), "{e}");
    // A well-formed GGUF of an architecture colibri does not run.
    let mut b = good.clone();
    let arch = good.windows(8).position(|w| w == b"qwen3moe").unwrap();
    b[arch..arch + 8].copy_from_slice(b"qwen9moe");
    assert!(refused(&b, &dir, "arch").contains("\"qwen9moe\" is not supported"));
    // A deepseek2 file whose router is a softmax (DeepSeek-V2's): expert_gating_func 2 -> 1.
    let mut b = std::fs::read(gguf("deepseek2-f16")).unwrap();
    let key = b"deepseek2.expert_gating_func";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(&b[at..at + 8], &[4, 0, 0, 0, 2, 0, 0, 0], "a u32 2 follows the key");
    b[at + 4] = 1;
    let e = refused(&b, &dir, "softmax");
    assert!(e.contains("expert_gating_func is 1") && e.contains("sigmoid router"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A split GGUF (three files written by llama.cpp's converter with --split-max-tensors, as
/// gguf-split names and lays them out) converts from its first part to exactly what the
/// same GGUF in one file converts to; a missing, damaged or wrongly named part, or a part
/// other than the first, is one line.
#[test]
fn a_split_gguf_converts_like_the_whole_file() {
    let dir = scratch("split");
    let part = |i: usize| gguf(&format!("deepseek2-kv_b-split-{i:05}-of-00003"));
    let (a, b) = (dir.join("from-split"), dir.join("from-one"));
    convert(&part(1), &a, &[]);
    convert(&gguf("deepseek2-kv_b-f16"), &b, &[]);
    let (wa, wb) = (std::fs::read(a.join("weights.bin")).unwrap(), std::fs::read(b.join("weights.bin")).unwrap());
    assert!(wa == wb && !wa.is_empty(), "weights.bin differs");
    let info = String::from_utf8(ok(run(&["info".as_ref(), part(1).as_os_str()])).stdout).unwrap();
    assert!(info.contains("deepseek2"), "{info}");
    let e = refused(&std::fs::read(part(2)).unwrap(), &dir, "x-00002-of-00003");
    assert!(e.contains("part 2 of a split GGUF of 3 parts: convert the first part"), "{e}");
    // The first part alone, beside the second: the third is missing.
    let lone = dir.join("lone");
    std::fs::create_dir_all(&lone).unwrap();
    for i in 1..=2 {
        std::fs::copy(part(i), lone.join(format!("m-{i:05}-of-00003.gguf"))).unwrap();
    }
    let first = lone.join("m-00001-of-00003.gguf");
    let out = run(&["convert".as_ref(), first.as_os_str(), "-o".as_ref(), dir.join("lone-out").as_os_str()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.trim_end().lines().count() == 1, "{e}");
    assert!(e.contains("part 3 of 3 of this split GGUF is missing") && e.contains("m-00003-of-00003.gguf"), "{e}");
    // A truncated part is refused by its own name; a part from another split by its number.
    let third = std::fs::read(part(3)).unwrap();
    std::fs::write(lone.join("m-00003-of-00003.gguf"), &third[..third.len() - 100]).unwrap();
    let out = run(&["convert".as_ref(), first.as_os_str(), "-o".as_ref(), dir.join("lone-out").as_os_str()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("m-00003-of-00003.gguf") && e.contains("runs past the end"), "{e}");
    std::fs::copy(part(2), lone.join("m-00003-of-00003.gguf")).unwrap();
    let out = run(&["convert".as_ref(), first.as_os_str(), "-o".as_ref(), dir.join("lone-out").as_os_str()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("says it is part 2 of 3, expected part 3 of 3"), "{e}");
    // The first part under another name: its siblings cannot be found.
    let e = refused(&std::fs::read(part(1)).unwrap(), &dir, "renamed");
    assert!(e.contains("not named NAME-00001-of-00003.gguf"), "{e}");
    assert!(!dir.join("lone-out/colibri.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where tensor `name`'s type (u32) and offset (u64) are in a GGUF's bytes.
fn entry_fields(bytes: &[u8], name: &str) -> (usize, usize) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key.as_slice()).unwrap() + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    (ty, ty + 4)
}

/// Tensors whose data overlap, a type swapped for one of the same block but fewer bytes,
/// and an alignment edited so that the data section starts elsewhere: each converted
/// without a word before (NaN or other logits); now one line naming the tensor, and no
/// output directory.
#[test]
fn overlapping_misaligned_or_retyped_tensors_are_refused() {
    let dir = scratch("layout");
    let good = std::fs::read(gguf("qwen3moe-q4_0-q8_0")).unwrap();
    let g = colibri_engine::format::gguf::Gguf::parse(&good, "x").unwrap();
    let mut by_offset: Vec<_> = g.tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    let check = |bytes: &[u8], tag: &str, want: &[&str]| {
        let e = refused(bytes, &dir, tag);
        for w in want {
            assert!(e.contains(w), "{tag}: {e:?} lacks {w:?}");
        }
        assert!(!dir.join(tag).exists(), "{tag}: an output directory was made");
    };

    // The second tensor's data moved onto the first one's.
    let (a, b) = (by_offset[0], by_offset[1]);
    let mut bytes = good.clone();
    let (_, off) = entry_fields(&good, &b.name);
    bytes[off..off + 8].copy_from_slice(&(a.offset - g.data_start).to_le_bytes());
    check(&bytes, "overlap", &[&format!("tensor {}", b.name), &format!("overlaps tensor {}", a.name)]);

    // A Q8_0 tensor declared Q4_0 (both blocks of 32 values: 18 bytes a block, not 34).
    let q8 = by_offset.iter().find(|t| t.ty.name == "Q8_0").unwrap();
    let mut bytes = good.clone();
    let (ty, _) = entry_fields(&good, &q8.name);
    bytes[ty..ty + 4].copy_from_slice(&2u32.to_le_bytes());
    check(&bytes, "retyped", &[&format!("tensor {} (", q8.name), "of Q4_0", "unused bytes"]);

    // general.file_type (a u32 key of the same length) renamed general.alignment, with a
    // value that moves the start of the data section.
    let key = b"general.file_type";
    let at = good.windows(key.len()).position(|w| w == key).unwrap();
    let last = g.tensors.last().unwrap();
    let (_, off) = entry_fields(&good, &last.name);
    let header_end = (off + 8) as u64;
    let align = [16u32, 8, 4, 2, 1].into_iter().find(|&a| header_end.div_ceil(a as u64) * a as u64 != g.data_start);
    let align = align.expect("the fixture's header ends on a multiple of 32");
    let mut bytes = good.clone();
    bytes[at..at + key.len()].copy_from_slice(b"general.alignment");
    assert_eq!(&bytes[at + key.len()..at + key.len() + 4], &4u32.to_le_bytes(), "a u32 follows the key");
    bytes[at + key.len() + 4..at + key.len() + 8].copy_from_slice(&align.to_le_bytes());
    check(&bytes, "alignment", &["tensor ", "changed alignment"]);
    let _ = std::fs::remove_dir_all(&dir);
}
