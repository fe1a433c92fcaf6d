//! Times [`Sampler::sample`] on rows of random logits the size of a real vocabulary: what
//! a sampled generation pays per token outside the forward pass (`coli serve` runs it for
//! every sequence of a batch between two passes), and what `logprobs` adds
//! ([`token_logprob`]).
//!
//!     cargo run --release -p colibri-engine --example sampler_bench -- [VOCAB=50304] [ROWS=200]
//!
//! Prints one JSON line: microseconds per row for temperature 1, temperature 0.7 with
//! top-p 0.9, top-k 40, greedy, and the log-probabilities of one token with its best
//! alternative. `COLIBRI_SIMD=scalar` times the scalar path.

use std::time::Instant;

use colibri_engine::generate::logprobs::token_logprob;
use colibri_engine::sampler::{Rng, Sampler, SamplerConfig};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (vocab, rows) = (*args.first().unwrap_or(&50304), (*args.get(1).unwrap_or(&200)).max(1));
    // Logits spread like a language model's: most far below the few likely ones.
    let mut rng = Rng::new(7);
    let logits: Vec<Vec<f32>> = (0..rows)
        .map(|_| {
            (0..vocab)
                .map(|_| {
                    let u = rng.next_f64();
                    (if u < 0.001 { 10.0 + 8.0 * rng.next_f64() } else { 12.0 * rng.next_f64() - 6.0 }) as f32
                })
                .collect()
        })
        .collect();
    let settings = [
        ("temperature_1", SamplerConfig { temperature: 1.0, seed: 1, ..SamplerConfig::default() }),
        ("top_p_0.9_t_0.7", SamplerConfig { temperature: 0.7, top_p: 0.9, seed: 1, ..SamplerConfig::default() }),
        ("top_k_40", SamplerConfig { temperature: 1.0, top_k: 40, seed: 1, ..SamplerConfig::default() }),
        ("greedy", SamplerConfig::default()),
    ];
    let mut out = serde_json::Map::new();
    out.insert("vocab".into(), vocab.into());
    let mut check = 0u64;
    for (name, cfg) in settings {
        let Ok(mut s) = Sampler::new(cfg) else {
            eprintln!("{name}: invalid sampler settings");
            std::process::exit(2);
        };
        let t = Instant::now();
        for row in &logits {
            check = check.wrapping_mul(31).wrapping_add(s.sample(row, &[], &[]) as u64);
        }
        out.insert(format!("{name}_us"), (t.elapsed().as_secs_f64() * 1e6 / rows as f64).into());
    }
    let t = Instant::now();
    for row in &logits {
        check = check.wrapping_add(token_logprob(row, 0, 1).logprob.to_bits());
    }
    out.insert("logprobs_top1_us".into(), (t.elapsed().as_secs_f64() * 1e6 / rows as f64).into());
    out.insert("checksum".into(), check.into());
    println!("{}", serde_json::Value::Object(out));
}
