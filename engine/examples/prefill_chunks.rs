//! Prefill tokens/s at several chunk sizes (generate::prefill, what the server and `coli
//! chat` feed a prompt in so that it can be stopped between chunks): a prompt of `n` ids
//! fed in chunks of 64, 128, 256 and whole, `reps` rounds interleaved (so that a change
//! in the machine's load hits every size alike); prints the median of each as JSON.
//!
//!     cargo run --release -p colibri-engine --example prefill_chunks -- DIR [n] [reps] [threads]
//!
//! DIR: a model directory (the demo model: models/demo).

use std::time::Instant;

use colibri_engine::generate::feed_chunked;
use colibri_engine::{Logits, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: prefill_chunks DIR [n] [reps] [threads]");
        return;
    };
    let num = |i: usize, d: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (n, reps, threads) = (num(1, 1000), num(2, 5), num(3, 0));
    if threads > 0 && rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().is_err() {
        eprintln!("could not size the thread pool");
        return;
    }
    let model = match Model::open_dir(std::path::Path::new(dir)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{dir}: {e}");
            return;
        }
    };
    let n = n.min(model.cfg.max_positions);
    let v = model.cfg.vocab as u32;
    let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % v).collect();
    let chunks = [64, 128, 256, n];
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); chunks.len()];
    let mut want: Option<Vec<f32>> = None;
    // One round unmeasured: page the weights in, warm the allocator.
    for round in 0..=reps {
        for (i, &chunk) in chunks.iter().enumerate() {
            let mut s = model.new_session();
            let t = Instant::now();
            let mut forward = |part: &[u32], which| model.forward(&mut s, part, which);
            let logits = match feed_chunked(&mut forward, &ids, Logits::Last, chunk, &mut || true) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{e}");
                    return;
                }
            };
            if round > 0 {
                secs[i].push(t.elapsed().as_secs_f64());
            }
            match &want {
                Some(w) if w.iter().zip(&logits).any(|(a, b)| a.to_bits() != b.to_bits()) => {
                    eprintln!("chunk {chunk}: different logits");
                    return;
                }
                Some(_) => {}
                None => want = Some(logits),
            }
        }
    }
    let rows: Vec<serde_json::Value> = chunks
        .iter()
        .zip(&mut secs)
        .map(|(&chunk, s)| {
            s.sort_by(f64::total_cmp);
            let median = s[s.len() / 2];
            serde_json::json!({"chunk": chunk, "median_s": median, "tokens_per_s": n as f64 / median})
        })
        .collect();
    println!("{}", serde_json::json!({"model": dir, "prompt_tokens": n, "reps": reps, "results": rows}));
}
