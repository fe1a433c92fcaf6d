//! `coli bench --batch N`: N sequences decoded together, one forward pass per step for all
//! of them (Model::forward_batch: each matrix read once per step, each routed expert read
//! and run once for every sequence that chose it). Each sequence gets its own prompt (its
//! own stretch of `--text`, teacher-forced, or its own pseudo-random ids decoded greedily);
//! the record gives the aggregate decode tokens/s, the per-step latency a request sees
//! (p50 / p95 time per output token), and the expert bytes read per decode token, which
//! fall as the batch grows when sequences share experts.

use std::time::Instant;

use anyhow::Result;
use colibri_engine::{math, Model};
use serde_json::{json, Value};

/// The run: `prompts[i]` prefilled together, then `decode` steps; `stream[i]`, when given,
/// holds sequence i's teacher-forced tokens after its prompt. Returns the record's fields
/// and every sequence's generated ids (its choices at each step).
pub fn run(
    model: &Model,
    prompts: &[Vec<u32>],
    stream: Option<&[Vec<u32>]>,
    decode: usize,
    bytes_read: &dyn Fn() -> u64,
) -> Result<Value> {
    let n = prompts.len();
    let mut sessions: Vec<_> = (0..n).map(|_| model.new_session()).collect();
    let t0 = Instant::now();
    let inputs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut logits = model.forward_batch(&mut refs(&mut sessions), &inputs)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let read0 = bytes_read();
    let mut ids: Vec<Vec<u32>> = logits.iter().map(|l| vec![math::argmax(l) as u32]).collect();
    let mut step_ms = Vec::with_capacity(decode);
    let t1 = Instant::now();
    for step in 0..decode.saturating_sub(1) {
        if sessions.iter().any(|s| s.len() + 1 > model.cfg.max_positions) {
            break;
        }
        let next: Vec<u32> = match stream {
            Some(st) => match (0..n).map(|i| st[i].get(step).copied()).collect::<Option<Vec<u32>>>() {
                Some(v) => v,
                None => break,
            },
            None => ids.iter().map(|v| *v.last().unwrap_or(&0)).collect(),
        };
        let inputs: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let inputs: Vec<&[u32]> = inputs.iter().map(|a| a.as_slice()).collect();
        let ts = Instant::now();
        logits = model.forward_batch(&mut refs(&mut sessions), &inputs)?;
        step_ms.push(ts.elapsed().as_secs_f64() * 1e3);
        for (v, l) in ids.iter_mut().zip(&logits) {
            v.push(math::argmax(l) as u32);
        }
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let generated: usize = ids.iter().map(|v| v.len() - 1).sum();
    let read = bytes_read() - read0;
    let mut sorted = step_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied();
    Ok(json!({
        "batch": n,
        "prompt_tokens": prompts.iter().map(Vec::len).sum::<usize>(),
        "prefill_seconds": prefill_s,
        "decode_steps": step_ms.len(),
        "decode_tokens": generated,
        "aggregate_decode_tokens_per_second": generated as f64 / decode_s.max(1e-9),
        "per_request_ms_per_token": {"p50": pct(0.5), "p95": pct(0.95)},
        "bytes_read_per_decode_token": read as f64 / generated.max(1) as f64,
        "decode_bytes_read": read,
        "prompts": prompts,
        "generated_ids": ids,
    }))
}

fn refs(s: &mut [colibri_engine::Session]) -> Vec<&mut colibri_engine::Session> {
    s.iter_mut().collect()
}
