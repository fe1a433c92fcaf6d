//! Prefix reuse (generate::reuse) gives exactly the output of a fresh run: tokens and
//! every logit bit, greedy and seeded sampling, on the fixture families with a plain KV
//! cache, a sliding window (mixtral: 24, gpt_oss: 7 on alternate layers) and MLA latents
//! (deepseek_v3) and a recurrent state (qwen3_next's Gated DeltaNet layers), for a prompt
//! that extends the cached conversation, one that diverges mid-way, one that is shorter
//! (the cache cut back), through a ContextPool, and through a cache file (model::kv).

use std::path::PathBuf;

use colibri_engine::generate::{generate_with, keepable, reuse, ContextPool, GenerateOptions};
use colibri_engine::model::kv;
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::{Logits, Model, Session};

fn open(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    Model::open_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// One request on `s`: reuses what it can of it, generates; (tokens, logits rows, kept).
fn turn(model: &Model, s: &mut Session, ids: &[u32], opts: &GenerateOptions) -> (Vec<u32>, Vec<f32>, usize) {
    let kept = reuse(s, ids);
    let mut rows = Vec::new();
    let (history, prompt) = ids.split_at(kept);
    let (out, _) = generate_with(
        &mut |x| {
            let l = model.forward(s, x, Logits::Last)?;
            rows.extend_from_slice(&l);
            Ok(l)
        },
        history,
        prompt,
        model.cfg.max_positions,
        opts,
        &mut |_| true,
    )
    .unwrap();
    (out, rows, kept)
}

fn fresh(model: &Model, ids: &[u32], opts: &GenerateOptions) -> (Vec<u32>, Vec<f32>) {
    let (out, rows, kept) = turn(model, &mut model.new_session(), ids, opts);
    assert_eq!(kept, 0);
    (out, rows)
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{what}: logit {i} is {} with reuse, {} fresh", got[i], want[i]);
    }
}

fn options(sampled: bool) -> GenerateOptions {
    let sampler = if sampled {
        SamplerConfig { temperature: 0.9, top_p: 0.9, repetition_penalty: 1.3, seed: 7, ..SamplerConfig::default() }
    } else {
        SamplerConfig::default()
    };
    GenerateOptions { max_new_tokens: 6, sampler, stop_ids: Vec::new(), logprobs: None }
}

fn check(name: &str) {
    let model = open(name);
    let v = model.cfg.vocab as u32;
    // Ids spread over the vocabulary, as a conversation's would be.
    let base: Vec<u32> = (0..30u32).map(|i| (i * 7919 + 13) % v).collect();
    for sampled in [false, true] {
        let o = options(sampled);
        let what = |case: &str| format!("{name} ({}) {case}", if sampled { "seeded" } else { "greedy" });
        let mut s = model.new_session();
        let first = &base[..12];
        let (out1, rows1, _) = turn(&model, &mut s, first, &o);
        let (f_out, f_rows) = fresh(&model, first, &o);
        assert_eq!(out1, f_out);
        same_bits(&what("first turn"), &rows1, &f_rows);

        // The next turn: the conversation so far, the answer and a new message.
        let mut second: Vec<u32> = first.iter().chain(&out1).copied().collect();
        second.extend_from_slice(&base[12..]);
        let (out2, rows2, kept) = turn(&model, &mut s, &second, &o);
        assert_eq!(kept, first.len() + out1.len() - 1, "{}: everything fed is reused", what("second turn"));
        let (f_out, f_rows) = fresh(&model, &second, &o);
        assert_eq!(out2, f_out, "{}", what("second turn"));
        same_bits(&what("second turn"), &rows2, &f_rows);

        // A recurrent state goes back only to a snapshot (taken where a multi-token call
        // began: the second turn's new ids, at 17), and keepable says so.
        let recurrent = s.caches.iter().any(|c| c.recurrent.is_some());
        let fed = first.len() + out1.len() - 1;
        let mut late = second[..20].to_vec();
        late.push((second[20] + 1) % v);
        assert_eq!(keepable(&s, &late), if recurrent { fed } else { 20 }, "{}", what("keepable"));
        let (out5, rows5, kept) = turn(&model, &mut s, &late, &o);
        assert_eq!(kept, if recurrent { fed } else { 20 }, "{}", what("late divergence"));
        let (f_out, f_rows) = fresh(&model, &late, &o);
        assert_eq!(out5, f_out, "{}", what("late divergence"));
        same_bits(&what("late divergence"), &rows5, &f_rows);

        // A prompt that diverges mid-way: the cache is cut back to the shared prefix (a
        // recurrent state, with no snapshot that early, starts again).
        let mut diverge = second[..9].to_vec();
        diverge.extend_from_slice(&base[20..]);
        diverge[9] = (diverge[9] + 1) % v;
        assert_eq!(keepable(&s, &diverge), if recurrent { 0 } else { 9 }, "{}", what("keepable"));
        let (out3, rows3, kept) = turn(&model, &mut s, &diverge, &o);
        assert_eq!(kept, if recurrent { 0 } else { 9 });
        let (f_out, f_rows) = fresh(&model, &diverge, &o);
        assert_eq!(out3, f_out, "{}", what("diverging"));
        same_bits(&what("diverging"), &rows3, &f_rows);

        // A shorter prompt inside the cache: cut back, its last id fed again.
        let short = &diverge[..5];
        let (out4, rows4, kept) = turn(&model, &mut s, short, &o);
        assert_eq!(kept, if recurrent { 0 } else { 4 });
        let (f_out, f_rows) = fresh(&model, short, &o);
        assert_eq!(out4, f_out, "{}", what("cut back"));
        same_bits(&what("cut back"), &rows4, &f_rows);
    }
}

#[test]
fn reuse_is_bit_identical_gqa() {
    check("qwen3_moe");
}

#[test]
fn reuse_is_bit_identical_sliding_window() {
    check("mixtral");
    check("gpt_oss");
}

#[test]
fn reuse_is_bit_identical_mla() {
    check("deepseek_v3");
}

#[test]
fn reuse_is_bit_identical_sparse_attention() {
    check("deepseek_v32");
    check("glm_moe_dsa");
}

#[test]
fn reuse_is_bit_identical_recurrent_state() {
    check("qwen3_next");
}

#[test]
fn reuse_is_bit_identical_recurrent_state_qwen3_5_moe() {
    check("qwen3_5_moe");
}

/// A conversation written to a cache file and read back continues as a fresh run would.
#[test]
fn a_cache_file_continues_bit_identically() {
    for name in ["qwen3_moe", "deepseek_v3", "glm_moe_dsa", "gpt_oss", "qwen3_next", "qwen3_5_moe"] {
        let model = open(name);
        let o = options(true);
        let first: Vec<u32> = (3..15).collect();
        let mut s = model.new_session();
        let (out, _, _) = turn(&model, &mut s, &first, &o);
        let bytes = kv::encode(&s, "fp").unwrap();
        let mut back = kv::decode(&bytes, "fp", &model.cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back.tokens, s.tokens);
        assert_eq!(back.bytes(), s.bytes(), "{name}");
        let next: Vec<u32> = first.iter().chain(&out).chain(&[7, 8, 9]).copied().collect();
        let (got, rows, kept) = turn(&model, &mut back, &next, &o);
        assert_eq!(kept, first.len() + out.len() - 1);
        let (want, f_rows) = fresh(&model, &next, &o);
        assert_eq!(got, want, "{name}");
        same_bits(&format!("{name} from a file"), &rows, &f_rows);
        // Another model's shape is refused.
        let other = open(if name == "qwen3_moe" { "mixtral" } else { "qwen3_moe" });
        assert!(kv::decode(&bytes, "fp", &other.cfg).is_err(), "{name} read as another model");
    }
}

#[test]
fn a_pool_serves_two_conversations_bit_identically() {
    let model = open("qwen3_moe");
    let o = options(true);
    let mut pool: ContextPool<Session> = ContextPool::new(4, 1 << 30);
    let a: Vec<u32> = (1..15).collect();
    let b: Vec<u32> = (1..6).chain(40..50).collect();
    let mut answers = Vec::new();
    for ids in [&a, &b] {
        let mut s = model.new_session();
        let (out, _, _) = turn(&model, &mut s, ids, &o);
        answers.push(out);
        pool.put(s);
    }
    assert_eq!(pool.len(), 2);
    let bytes_per_token = model.cfg.kv_cache_bytes_per_token() + 4;
    assert_eq!(pool.bytes(), bytes_per_token * (a.len() + b.len() + 2 * (o.max_new_tokens - 1)));
    for (ids, out) in [&a, &b].into_iter().zip(&answers) {
        let next: Vec<u32> = ids.iter().chain(out).chain(&[60, 61]).copied().collect();
        let (mut s, kept) = pool.take(&next).expect("a conversation to extend");
        assert_eq!(kept, ids.len() + out.len() - 1);
        let (got, rows, _) = turn(&model, &mut s, &next, &o);
        let (want, f_rows) = fresh(&model, &next, &o);
        assert_eq!(got, want);
        same_bits("pool", &rows, &f_rows);
        pool.put(s);
    }
    assert_eq!(pool.len(), 2);
}
