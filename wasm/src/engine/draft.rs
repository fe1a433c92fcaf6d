//! A draft model in the browser engine (`load({draft})`, `engine.loadDraft(...)`, then
//! `generate({draft: "model"})`): a second, smaller model of the same tokenizer, loaded
//! into the same worker with weights and expert tiers of its own (the RAM tier, then the
//! helper or the static host over HTTP Range; no disk tier), proposes greedy drafts
//! ([`ModelDrafter`], as `coli generate --draft DIR` does). It runs on the CPU backend
//! whatever the target's backend: the target verifies the drafts in one pass and draws
//! every token itself, so the drafts change how many passes run, never a token.

use std::rc::Rc;
use std::sync::Arc;

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::generate::draft::cpu_forward_keep;
use colibri_engine::generate::{check_same_tokenizer, Drafter, ModelDrafter};
use colibri_engine::model::open::Container;
use colibri_engine::tensor::Bytes;
use colibri_engine::tokenizer::Tokenizer;
use colibri_engine::Model;
use js_sys::Function;
use serde::Deserialize;

use super::{err, report, JsFail};
use crate::browser_source::BrowserSource;
use crate::net::fetch;

/// Most times a proposal is retried after its experts were read from IndexedDB.
const PENDING_RETRIES: usize = 4;

/// What `generate({draft: "model"})` says when no draft model is loaded.
pub(super) const NO_DRAFT: &str =
    "draft: \"model\" needs a draft model: load({draft: \"<model>\"}) or engine.loadDraft({model})";

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct DraftOptions {
    /// The draft's RAM tier for experts in bytes (default 256 MiB).
    ram_bytes: Option<u64>,
    /// Whether its server answers several ranges in one request (the worker asks a static
    /// host first; default true, as the helper does).
    multi_range: Option<bool>,
}

/// The draft model, its tiers and its drafter (whose context persists between
/// generations: a new prompt that starts like the last one is not fed again).
pub(super) struct DraftModel {
    model: Rc<Model>,
    tiers: Arc<BrowserSource>,
    drafter: ModelDrafter<'static>,
    /// What the page named it (an id of the helper's or a URL).
    name: String,
}

/// Fetches `total` bytes at `offset` of `url` in 8 MiB ranges (each retried on failure),
/// reporting `phase` progress.
pub(super) async fn fetch_range(
    url: &str,
    offset: u64,
    total: u64,
    phase: &str,
    on_progress: &Option<Function>,
) -> Result<Vec<u8>, JsFail> {
    const CHUNK: u64 = 8 << 20;
    let mut out = Vec::with_capacity(total as usize);
    let mut off = 0;
    report(on_progress, phase, 0.0, total as f64);
    while off < total {
        let end = (off + CHUNK).min(total);
        out.extend_from_slice(&fetch(url, Some((offset + off, offset + end - 1)), 6).await.map_err(err)?);
        off = end;
        report(on_progress, phase, off as f64, total as f64);
    }
    Ok(out)
}

impl DraftModel {
    /// Loads the converted model at `base` (named `name`) as a draft for a target with
    /// tokenizer `target` and `target_vocab` ids; refused when its tokenizer differs (the
    /// message of `coli generate --draft`).
    pub(super) async fn load(
        base: &str,
        name: String,
        opts: DraftOptions,
        target: &Tokenizer,
        target_vocab: usize,
        on_progress: &Option<Function>,
    ) -> Result<DraftModel, JsFail> {
        let base = if base.ends_with('/') { base.to_string() } else { format!("{base}/") };
        let named = |e: &dyn std::fmt::Display| JsFail::msg(&format!("draft {name}: {e}"));
        let manifest = fetch(&format!("{base}colibri.json"), None, 5).await.map_err(|e| named(&e))?;
        let container = Container::parse(&manifest, &base).map_err(|e| named(&e))?;
        let m = &container.manifest;
        let tok_json = fetch(&format!("{base}tokenizer.json"), None, 5).await.map_err(|e| named(&e))?;
        let tok_cfg = if m.files.iter().any(|f| f == "tokenizer_config.json") {
            Some(fetch(&format!("{base}tokenizer_config.json"), None, 5).await.map_err(|e| named(&e))?)
        } else {
            None
        };
        let tok = Tokenizer::from_bytes(&tok_json, tok_cfg.as_deref()).map_err(|e| named(&e))?;
        check_same_tokenizer(target, &tok).map_err(|e| named(&e))?;

        let data_url = format!("{base}{}", m.data_file);
        let dense = fetch_range(&data_url, m.dense.offset, m.dense.length, "draft", on_progress).await?;
        let why = "a draft model keeps its experts in RAM".to_string();
        let tiers = Arc::new(BrowserSource::new(m, data_url, opts.multi_range.unwrap_or(true), Some(why)));
        let cache = CacheOptions::with_ram(Some(opts.ram_bytes.unwrap_or(256 << 20)));
        let model = Rc::new(container.load(&Bytes::from_vec(dense), tiers.clone(), cache).map_err(|e| named(&e))?);
        let drafter = ModelDrafter::new(cpu_forward_keep(model.clone()), model.cfg.max_positions, target_vocab);
        Ok(DraftModel { model, tiers, drafter, name })
    }

    /// Up to `k` greedy drafts after `context`.
    pub(super) async fn propose(&mut self, context: &[u32], k: usize) -> colibri_engine::Result<Vec<u32>> {
        propose_tiered(&mut self.drafter, &self.tiers, context, k).await
    }

    /// What the page sees in `stats().draft`.
    pub(super) fn stats(&self) -> serde_json::Value {
        let c = &self.model.cfg;
        let t = self.tiers.stats.borrow();
        let cache = self.model.experts.cache_stats().unwrap_or_default();
        serde_json::json!({
            "model": self.name, "backend": "cpu", "modelType": c.model_type, "layers": c.n_layers,
            "experts": c.router.n_experts, "vocab": c.vocab, "contextLength": c.max_positions,
            "bytesFetched": t.bytes_fetched, "helperFetches": t.helper_fetches, "ramHits": cache.hits,
        })
    }
}

/// Drafts from `d`, whose experts come from `tiers`: a proposal that stopped for experts
/// still to be read from IndexedDB is retried once they are read.
pub(super) async fn propose_tiered(
    d: &mut dyn Drafter,
    tiers: &BrowserSource,
    context: &[u32],
    k: usize,
) -> colibri_engine::Result<Vec<u32>> {
    let mut attempts = 0;
    loop {
        match d.propose(context, k) {
            Err(_) if tiers.has_pending() && attempts < PENDING_RETRIES => {
                attempts += 1;
                tiers.load_pending().await?;
            }
            other => return other,
        }
    }
}
