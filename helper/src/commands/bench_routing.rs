//! `coli bench-routing`: what a model's routing allows a cache to do, measured on real
//! decoding (greedy, chat prompts of several kinds). Prints one JSON record with
//! - router-lookahead recall: layer L+1's router applied to layer L's FFN input predicts
//!   L+1's experts; the share of truly selected experts that the top-k (and top-2k)
//!   prediction contains, per layer and overall;
//! - cache hit rates for expert caches of several sizes: LRU (warmed on the first half of
//!   the prompts) against a static pin set learned from the first half's usage counts,
//!   both measured on the second half;
//! - the shape of the routing (`routing`, [`shape`]): how skewed the experts' popularity
//!   is, how often a token reuses the previous token's experts, and how well one layer's
//!   experts predict the next layer's, each next to what uniform random routing gives.
//!   These are the numbers `coli synth --routing trained` is calibrated against.
//!
//! `--text FILE` runs teacher-forced on a fixed token stream instead (the file through the
//! model's tokenizer; the first half teaches, the second is measured): what a synthetic
//! model needs, whose greedy decoding falls into a loop.

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
    /// Tokens decoded per prompt (with --text: tokens of the stream fed in all).
    #[arg(long, default_value_t = 48)]
    pub tokens: usize,
    /// Teacher-forced on this text file through the model's tokenizer, instead of greedy
    /// decoding of the built-in prompts.
    #[arg(long, value_name = "FILE")]
    pub text: Option<std::path::PathBuf>,
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

/// One token's routing: the experts chosen at each layer (empty for dense layers).
type Step = Vec<Vec<usize>>;

/// The shape of the routing over `seqs` (sequences of steps; `half`: how many sequences
/// teach the next-layer predictor, the rest measure it): per MoE layer and on average,
/// - `usage_entropy_ratio`: entropy of the experts' share of routing slots over
///   log2(experts) (1: uniform popularity);
/// - `top_eighth_share`: share of the slots taken by the most used eighth of the experts
///   (uniform: 1/8);
/// - `reuse_prev_token`: share of a token's experts that the previous token also chose
///   (uniform: top_k / experts), and `reuse_lift`, its ratio to that;
/// - `next_layer_recall`: share of layer L+1's experts among the top-k predicted from
///   layer L's by co-occurrence counts of the teaching sequences (uniform: top_k /
///   experts), and `next_layer_lift`.
pub fn shape(
    seqs: &[Vec<Step>],
    half: usize,
    moe_layers: &[usize],
    n_experts: usize,
    top_k: usize,
) -> serde_json::Value {
    let chance = top_k as f64 / n_experts as f64;
    let mut per_layer = Vec::new();
    let (mut ent, mut top8, mut reuse, mut next) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (li, &l) in moe_layers.iter().enumerate() {
        let mut counts = vec![0u64; n_experts];
        let (mut same, mut pairs) = (0usize, 0usize);
        for seq in seqs {
            for (t, step) in seq.iter().enumerate() {
                for &e in &step[l] {
                    counts[e.min(n_experts - 1)] += 1;
                }
                if t > 0 {
                    same += step[l].iter().filter(|e| seq[t - 1][l].contains(e)).count();
                    pairs += step[l].len();
                }
            }
        }
        let total: u64 = counts.iter().sum();
        let h: f64 = counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / total as f64;
                -p * p.log2()
            })
            .sum();
        let mut sorted = counts.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let eighth = (n_experts / 8).max(1);
        let t8 = sorted[..eighth].iter().sum::<u64>() as f64 / total.max(1) as f64;
        let er = h / (n_experts as f64).log2();
        let ru = same as f64 / pairs.max(1) as f64;
        let mut entry = serde_json::json!({"layer": l, "usage_entropy_ratio": er, "top_eighth_share": t8,
            "reuse_prev_token": ru});
        ent.push(er);
        top8.push(t8);
        reuse.push(ru);
        // Layer L -> L+1 co-occurrence, taught on the first `half` sequences.
        if let Some(&l2) = moe_layers.get(li + 1) {
            let mut co = vec![vec![0u64; n_experts]; n_experts];
            for seq in &seqs[..half.min(seqs.len())] {
                for step in seq {
                    for &e in &step[l] {
                        for &e2 in &step[l2] {
                            co[e.min(n_experts - 1)][e2.min(n_experts - 1)] += 1;
                        }
                    }
                }
            }
            let (mut hit, mut all) = (0usize, 0usize);
            for seq in &seqs[half.min(seqs.len())..] {
                for step in seq {
                    let mut score = vec![0u64; n_experts];
                    for &e in &step[l] {
                        for (s, c) in score.iter_mut().zip(&co[e.min(n_experts - 1)]) {
                            *s += c;
                        }
                    }
                    let mut order: Vec<usize> = (0..n_experts).collect();
                    order.sort_by(|a, b| score[*b].cmp(&score[*a]).then(a.cmp(b)));
                    let predicted = &order[..top_k.min(n_experts)];
                    hit += step[l2].iter().filter(|e| predicted.contains(e)).count();
                    all += step[l2].len();
                }
            }
            if all > 0 {
                let r = hit as f64 / all as f64;
                next.push(r);
                entry["next_layer_recall"] = serde_json::json!(r);
            }
        }
        per_layer.push(entry);
    }
    let mean = |v: &[f64]| if v.is_empty() { None } else { Some(v.iter().sum::<f64>() / v.len() as f64) };
    let (ru, nx) = (mean(&reuse), mean(&next));
    serde_json::json!({
        "usage_entropy_ratio": mean(&ent), "top_eighth_share": mean(&top8),
        "reuse_prev_token": ru, "reuse_lift": ru.map(|r| r / chance),
        "next_layer_recall": nx, "next_layer_lift": nx.map(|r| r / chance),
        "uniform": {"usage_entropy_ratio": 1.0, "top_eighth_share": (n_experts / 8).max(1) as f64 / n_experts as f64,
            "reuse_prev_token": chance, "next_layer_recall": chance},
        "tokens": seqs.iter().map(Vec::len).sum::<usize>(),
        "per_layer": per_layer,
    })
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
    // Sequences of token ids to feed: the prompts (decoded greedily), or the --text
    // stream (teacher-forced), cut in two so that the first half teaches.
    let (inputs, forced): (Vec<Vec<u32>>, bool) = match &a.text {
        Some(path) => {
            let text = colibri_engine::fsio::read_text(path, 256 << 20).with_context(|| "--text")?;
            let mut ids = tok.encode(&text, true)?;
            ids.truncate(a.tokens.max(4).min(c.max_positions));
            let mid = ids.len() / 2;
            (vec![ids[..mid].to_vec(), ids[mid..].to_vec()], true)
        }
        None => {
            let mut v = Vec::new();
            for q in PROMPTS {
                let text = if tok.has_chat_template() {
                    tok.apply_chat_template(&[ChatMessage { role: "user".into(), content: q.to_string() }], true)?
                } else {
                    q.to_string()
                };
                v.push(tok.encode(&text, !tok.has_chat_template())?);
            }
            (v, false)
        }
    };
    let half = inputs.len() / 2;
    let (mut learn, mut measured) = (Vec::new(), Vec::new());
    let mut counts: HashMap<(usize, usize), u64> = HashMap::new();
    let mut seqs: Vec<Vec<Step>> = Vec::new();
    for (pi, ids) in inputs.iter().enumerate() {
        let mut session = model.new_session();
        // Teacher-forced: the first token is fed alone, then each next one, all observed.
        let (first, steps): (&[u32], usize) = if forced { (&ids[..1], ids.len() - 1) } else { (&ids[..], a.tokens) };
        let mut logits = model.forward(&mut session, first, Logits::Last)?;
        let mut seq = Vec::new();
        for s in 0..steps {
            if session.len() + 1 > c.max_positions {
                break;
            }
            let next = if forced { ids[s + 1] } else { math::argmax(&logits) as u32 };
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
            seq.push(actual);
        }
        seqs.push(seq);
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
        "input": if forced { serde_json::json!({"text": a.text.as_ref().map(|p| p.display().to_string()), "teacher_forced_tokens": seqs.iter().map(Vec::len).sum::<usize>()}) }
            else { serde_json::json!({"prompts": PROMPTS.len(), "decode_tokens_per_prompt": a.tokens}) },
        "routing": shape(&seqs, half, &moe_layers, c.router.n_experts, c.router.top_k),
        "lookahead": {"recall_top_k": share(&hit_k), "recall_top_2k": share(&hit_2k), "per_layer": per_layer,
            "note": "layer L+1's router applied to layer L's FFN input; layer 0 has no predictor"},
        "caches": caches,
        "cache_note": "accesses = (layer, expert) per decode step; LRU warmed on the first half of the prompts (or of the --text stream), pin set = the first half's most used experts; hit rates measured on the second half",
    });
    println!("{out}");
    Ok(())
}
