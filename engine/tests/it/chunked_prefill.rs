//! A prompt fed in chunks (generate::prefill, what the server and `coli chat` do so that
//! a long prefill can be stopped between chunks) gives every logit bit of one pass over
//! the whole prompt, on every fixture family: a plain KV cache, sliding windows that a
//! chunk boundary crosses (mixtral, gpt_oss), MLA latents (deepseek_v3), Gated DeltaNet's
//! recurrent state (qwen3_next). At the chunk size the engine uses
//! ([`PREFILL_CHUNK`]) where the fixture's context holds more than one chunk, and at
//! smaller sizes everywhere.

use std::path::PathBuf;

use colibri_engine::generate::{feed_chunked, PREFILL_CHUNK};
use colibri_engine::{Logits, Model};

const FAMILIES: &[&str] = &[
    "olmoe",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v3",
    "deepseek_v3_noqlora",
    "deepseek_v3_mtp",
    "deepseek_v32",
    "glm_moe_dsa",
    "glm4_moe",
    "glm4_moe_mtp",
    "qwen3_5_moe",
    "qwen3_5_moe_mtp",
    "gpt_oss",
    "gpt_oss_mxfp4",
    "qwen3_next",
    "qwen3_next_f32",
    "deepseek_v4",
];

fn open(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    Model::open_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: logit count");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{what}: logit {i} is {} in chunks, {} in one pass", got[i], want[i]);
    }
}

#[test]
fn chunked_prefill_gives_the_same_bits() {
    let mut at_engine_chunk = 0;
    for &name in FAMILIES {
        let model = open(name);
        let v = model.cfg.vocab as u32;
        // Two engine chunks and a partial one, where the context holds them.
        let n = (2 * PREFILL_CHUNK + 37).min(model.cfg.max_positions);
        let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % v).collect();
        // Every position's logits: each chunk's rows, not only the last one.
        let whole = model.forward(&mut model.new_session(), &ids, Logits::All).unwrap();
        let mut chunks = vec![7, 64];
        if n > PREFILL_CHUNK {
            chunks.push(PREFILL_CHUNK);
            at_engine_chunk += 1;
        }
        for chunk in chunks {
            let mut s = model.new_session();
            let mut forward = |part: &[u32], which| model.forward(&mut s, part, which);
            let all = feed_chunked(&mut forward, &ids, Logits::All, chunk, &mut || true).unwrap();
            same_bits(&format!("{name}, {n} positions in chunks of {chunk}"), &all, &whole);
            let mut s = model.new_session();
            let mut forward = |part: &[u32], which| model.forward(&mut s, part, which);
            let last = feed_chunked(&mut forward, &ids, Logits::Last, chunk, &mut || true).unwrap();
            let vocab = model.cfg.vocab;
            same_bits(&format!("{name}, last row, chunks of {chunk}"), &last, &whole[whole.len() - vocab..]);
        }
    }
    assert!(at_engine_chunk >= 5, "only {at_engine_chunk} fixtures hold more than one engine chunk");
}
