//! `coli bench-routing`: what a model's routing allows a cache to do, measured on real
//! decoding (greedy, chat prompts of several kinds). Prints one JSON record with
//! - router-lookahead recall: layer L+1's router applied to layer L's FFN input predicts
//!   L+1's experts; the share of truly selected experts that the top-k (and top-2k)
//!   prediction contains, per layer and overall;
//! - cache hit rates for expert caches of several sizes: LRU (warmed on the first half of
//!   the prompts) against a static pin set learned from the first half's usage counts,
//!   both measured on the second half.

use std::collections::{HashMap, HashSet, VecDeque};

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::kernels::matmul;
use colibri_engine::model::config::RouterConfig;
use colibri_engine::model::moe::route;
use colibri_engine::model::Ffn;
use colibri_engine::tokenizer::ChatMessage;
use colibri_engine::{math, Logits};

use crate::flags::ModelArgs;
use crate::load::open;

#[derive(Args)]
pub struct RoutingBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens decoded per prompt.
    #[arg(long, default_value_t = 48)]
    pub tokens: usize,
}

/// Prompts of several kinds; the first half teaches the pin set, the second is measured.
const PROMPTS: &[&str] = &[
    "What is 47 plus 38?",
    "How many letters are in the word 'garden'?",
    "What is the capital of France?",
    "Tell me a story.",
    "What is 83 minus 29?",
    "Spell 'window' backwards.",
    "What sound does a cow make?",
    "Count the items: apple, pear, plum, fig.",
    "What is 56 plus 17?",
    "How many letters are in the word 'river'?",
    "What is the capital of Japan?",
    "Tell me a story about a fox.",
    "What is 91 minus 46?",
    "Spell 'tiger' backwards.",
    "What colour is the sky?",
    "Count the items: red, blue, green.",
];

fn lru_hit_rate(capacity: usize, warm: &[(usize, usize)], measured: &[(usize, usize)]) -> f64 {
    let mut order: VecDeque<(usize, usize)> = VecDeque::new();
    let mut set: HashSet<(usize, usize)> = HashSet::new();
    let mut hits = 0usize;
    for (i, &k) in warm.iter().chain(measured).enumerate() {
        let hit = set.contains(&k);
        if hit {
            order.retain(|x| *x != k);
        } else if capacity > 0 {
            if set.len() == capacity {
                if let Some(v) = order.pop_front() {
                    set.remove(&v);
                }
            }
            set.insert(k);
        }
        if capacity > 0 {
            order.push_back(k);
        }
        if i >= warm.len() && hit {
            hits += 1;
        }
    }
    hits as f64 / measured.len().max(1) as f64
}

pub fn run(a: RoutingBenchArgs) -> Result<()> {
    let loaded = open(&a.model, true)?;
    let model = &loaded.model;
    let tok = loaded.tokenizer.as_ref().context("this model has no tokenizer")?;
    let c = &model.cfg;
    let moe_layers: Vec<usize> = (0..c.n_layers).filter(|&l| c.moe_layers[l]).collect();
    if moe_layers.is_empty() {
        bail!("this model has no MoE layers");
    }
    let wide = RouterConfig { top_k: (c.router.top_k * 2).min(c.router.n_experts), ..c.router.clone() };
    let (mut hit_k, mut hit_2k, mut truth) =
        (vec![0usize; c.n_layers], vec![0usize; c.n_layers], vec![0usize; c.n_layers]);
    let half = PROMPTS.len() / 2;
    let (mut learn, mut measured) = (Vec::new(), Vec::new());
    let mut counts: HashMap<(usize, usize), u64> = HashMap::new();
    for (pi, q) in PROMPTS.iter().enumerate() {
        let text = if tok.has_chat_template() {
            tok.apply_chat_template(&[ChatMessage { role: "user".into(), content: q.to_string() }], true)?
        } else {
            q.to_string()
        };
        let ids = tok.encode(&text, !tok.has_chat_template())?;
        let mut session = model.new_session();
        let mut logits = model.forward(&mut session, &ids, Logits::Last)?;
        for _ in 0..a.tokens {
            if session.len() + 1 > c.max_positions {
                break;
            }
            let next = math::argmax(&logits) as u32;
            let mut predicted: Vec<Option<(Vec<usize>, Vec<usize>)>> = vec![None; c.n_layers];
            let mut actual: Vec<Vec<usize>> = vec![Vec::new(); c.n_layers];
            logits = model.forward_observed(
                &mut session,
                &[next],
                Logits::Last,
                &mut |l, e, _| actual[l].push(e),
                &mut |l, xn| {
                    if let Some(Ffn::Moe(block)) = model.layers.get(l + 1).map(|x| &x.ffn) {
                        let mut r = vec![0.0f32; block.router.rows];
                        matmul(&block.router, xn, 1, &mut r);
                        let bias = block.correction_bias.as_deref();
                        predicted[l + 1] = Some((route(&r, &block.cfg, bias).experts, route(&r, &wide, bias).experts));
                    }
                },
            )?;
            for &l in &moe_layers {
                if let Some((k, k2)) = &predicted[l] {
                    truth[l] += actual[l].len();
                    hit_k[l] += actual[l].iter().filter(|e| k.contains(e)).count();
                    hit_2k[l] += actual[l].iter().filter(|e| k2.contains(e)).count();
                }
                for &e in &actual[l] {
                    if pi < half {
                        learn.push((l, e));
                        *counts.entry((l, e)).or_default() += 1;
                    } else {
                        measured.push((l, e));
                    }
                }
            }
        }
    }
    let share = |h: &[usize]| {
        let t: usize = truth.iter().sum();
        h.iter().sum::<usize>() as f64 / t.max(1) as f64
    };
    let per_layer: Vec<serde_json::Value> = moe_layers
        .iter()
        .filter(|&&l| truth[l] > 0)
        .map(|&l| serde_json::json!({"layer": l, "recall_top_k": hit_k[l] as f64 / truth[l] as f64, "recall_top_2k": hit_2k[l] as f64 / truth[l] as f64}))
        .collect();
    let total = moe_layers.len() * c.router.n_experts;
    let mut hottest: Vec<((usize, usize), u64)> = counts.into_iter().collect();
    hottest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let caches: Vec<serde_json::Value> = [8usize, 4, 2]
        .iter()
        .map(|&div| {
            let cap = (total / div).max(1);
            let pinned: HashSet<(usize, usize)> = hottest.iter().take(cap).map(|x| x.0).collect();
            let pin_hits = measured.iter().filter(|k| pinned.contains(k)).count() as f64 / measured.len().max(1) as f64;
            serde_json::json!({
                "capacity_experts": cap, "share_of_experts": cap as f64 / total as f64,
                "lru_hit_rate": lru_hit_rate(cap, &learn, &measured), "pinned_hit_rate": pin_hits,
            })
        })
        .collect();
    let out = serde_json::json!({
        "bench": "routing", "model": a.model.model.display().to_string(), "model_type": c.model_type,
        "moe_layers": moe_layers.len(), "experts_per_layer": c.router.n_experts, "top_k": c.router.top_k,
        "prompts": PROMPTS.len(), "decode_tokens_per_prompt": a.tokens,
        "lookahead": {"recall_top_k": share(&hit_k), "recall_top_2k": share(&hit_2k), "per_layer": per_layer,
            "note": "layer L+1's router applied to layer L's FFN input; layer 0 has no predictor"},
        "caches": caches,
        "cache_note": "accesses = (layer, expert) per decode step; LRU warmed on the first half of the prompts, pin set = the first half's most used experts; hit rates measured on the second half",
    });
    println!("{out}");
    Ok(())
}
