//! The engine's tiers as JavaScript sees them: where each expert lives, learned usage
//! (counts in, pins at turn ends, the usage file out) and the disk tier, which the worker
//! attaches and detaches as this tab gets or gives up the model's browser storage.

use colibri_engine::experts::usage::UsageFile;
use colibri_engine::Model;
use js_sys::{Function, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::{err, Engine, JsFail, Perf, DISK_SHARE};
use crate::backend::Backend;
use crate::browser_source::BrowserSource;
use crate::disk;
use crate::net::js_err;
use crate::opfs::{estimate, persisted};

/// Bytes a model's browser storage may hold: `asked` (load({diskBytes})), else
/// [`DISK_SHARE`] of the origin's quota; None if the browser does not say.
pub(super) async fn disk_budget(asked: Option<u64>) -> Option<u64> {
    match asked {
        Some(b) => Some(b),
        None => estimate().await.map(|(_, quota)| (quota * DISK_SHARE) as u64),
    }
}

/// Where each expert lives now, one byte per (layer, expert), layer-major over all layers
/// (dense layers are all 0): 0 = only at the helper, 1 = browser disk, 2 = RAM, 3 = GPU pool.
pub(super) fn tier_map(model: &Model, tiers: &BrowserSource, backend: &Backend) -> Vec<u8> {
    let c = &model.cfg;
    let ne = c.router.n_experts;
    let mut out = vec![0u8; c.n_layers * ne];
    let disk = tiers.disk_mask();
    let mut g = 0;
    for l in 0..c.n_layers {
        if !c.moe_layers[l] {
            continue;
        }
        for e in 0..ne {
            if disk.get(g).copied().unwrap_or(false) {
                out[l * ne + e] = 1;
            }
            g += 1;
        }
    }
    for (l, e) in model.experts.cached() {
        if let Some(x) = out.get_mut(l * ne + e) {
            *x = 2;
        }
    }
    for (l, e) in backend.pooled() {
        if let Some(x) = out.get_mut(l * ne + e) {
            *x = 3;
        }
    }
    out
}

/// A forward pass's expert-use callback: counts each use once, by the tier the expert was
/// in when the pass began (`map`, from [`tier_map`]): that tier served it.
pub(super) fn count_use<'a>(
    perf: &'a mut Perf,
    map: &'a [u8],
    n_experts: usize,
) -> impl FnMut(usize, usize, usize) + 'a {
    move |l, e, _| {
        perf.expert_loads += 1;
        let t = map.get(l * n_experts + e).copied().unwrap_or(0) as usize;
        perf.tier_uses[t.min(3)] += 1;
    }
}

/// The usage file `usage_for(name)` resolves to (null: none).
pub(super) async fn learned_usage(usage_for: Option<&Function>, name: &str) -> Result<Option<UsageFile>, String> {
    let Some(f) = usage_for else { return Ok(None) };
    let p = f.call1(&JsValue::NULL, &name.into()).map_err(js_err)?;
    let v = wasm_bindgen_futures::JsFuture::from(Promise::resolve(&p)).await.map_err(js_err)?;
    let Some(text) = v.as_string() else { return Ok(None) };
    serde_json::from_str(&text).map(Some).map_err(|e| format!("usage: not a usage file: {e}"))
}

#[wasm_bindgen]
impl Engine {
    /// Expert-use counts since the last call, as JSON [[layer, expert, count], ...].
    #[wasm_bindgen(js_name = takeUsage)]
    pub fn take_usage(&self) -> Result<String, JsFail> {
        // The expert source counts every use on either backend (one channel, as natively).
        let _idle = self.state()?;
        let counts = self.model.experts.take_usage();
        // Counts of this model's shape: merging cannot fail.
        let _ = self.learned.borrow_mut().merge_triples(&counts);
        serde_json::to_string(&counts).map_err(err)
    }

    /// Where the routed experts were computed since the last call (WebGPU), as JSON
    /// [[layer, expert, uses on the CPU threads, uses on the GPU], ...]; null on the CPU
    /// backend. The uses add up to the growth of `stats().hybrid`'s counts.
    #[wasm_bindgen(js_name = takePlacement)]
    pub fn take_placement(&self) -> Result<String, JsFail> {
        let _idle = self.state()?;
        let placed = self.backend.take_placement().map_err(err)?;
        let rows =
            placed.map(|p| p.iter().map(|p| [p.layer as u64, p.expert as u64, p.cpu, p.gpu]).collect::<Vec<_>>());
        serde_json::to_string(&rows).map_err(err)
    }

    /// A conversation turn ended: re-pins the RAM tier (the expert cache's rule and
    /// hysteresis, as natively), the disk tier and the GPU pool by the learned counts; returns how many
    /// experts moved. Experts newly pinned in RAM that are not resident are read now.
    #[wasm_bindgen(js_name = endTurn)]
    pub fn end_turn(&self) -> Result<u32, JsFail> {
        let _idle = self.state()?;
        let before = self.model.experts.cache_stats().map_or(0, |c| c.repinned);
        self.model.experts.end_turn().map_err(err)?;
        let ram = self.model.experts.cache_stats().map_or(0, |c| c.repinned) - before;
        let learned = self.learned.borrow();
        let disk = self.tiers.repin_disk(&learned);
        let gpu = self.backend.repin(&learned, &|k| self.tiers.expert_len(k)).map_err(err)?;
        Ok((ram as usize + disk + gpu) as u32)
    }

    /// The learned counts as a usage file (JSON, docs/api.md), for browser storage when no
    /// helper keeps them.
    #[wasm_bindgen(js_name = usageFile)]
    pub fn usage_file(&self) -> String {
        let f: UsageFile = self.learned.borrow().to_file(&self.storage_name, Some(&self.fingerprint));
        serde_json::to_string(&f).unwrap_or_default()
    }

    /// The name of this model's browser storage (also the Web Lock the worker holds
    /// while this tab uses it).
    #[wasm_bindgen(js_name = storageName)]
    pub fn storage_name(&self) -> String {
        self.storage_name.clone()
    }

    /// Opens the disk tier (OPFS or IndexedDB, as `load({storage})` asked) under its
    /// budget and pins its hottest experts: a promise of null, or of why it is off.
    #[wasm_bindgen(js_name = attachDisk)]
    pub fn attach_disk(&self) -> Promise {
        let (tiers, learned, granted) = (self.tiers.clone(), self.learned.clone(), self.persisted.clone());
        let (storage, name, asked) = (self.storage.clone(), self.storage_name.clone(), self.disk_bytes);
        // The browser's copy of the dense weights takes its share of the budget first.
        let dense = self.dense.stored_bytes;
        future_to_promise(async move {
            let budget = disk_budget(asked).await.map(|b| b.saturating_sub(dense));
            match disk::open(&storage, &name, tiers.expert_lens(), budget).await {
                Ok(d) => {
                    tiers.attach(d);
                    tiers.repin_disk(&learned.borrow());
                    granted.set(persisted().await);
                    Ok(JsValue::NULL)
                }
                Err(e) => {
                    let why = format!("browser storage unavailable: {e}");
                    tiers.detach(why.clone());
                    Ok(why.into())
                }
            }
        })
    }

    /// Closes the disk tier (the storage goes to another tab); `why` is what
    /// `stats().diskError` says meanwhile.
    #[wasm_bindgen(js_name = detachDisk)]
    pub fn detach_disk(&self, why: String) {
        self.tiers.detach(why);
    }

    /// Where each expert lives now (see [`tier_map`]; the browser disk is OPFS or IndexedDB).
    #[wasm_bindgen(js_name = expertTiers)]
    pub fn expert_tiers(&self) -> Vec<u8> {
        tier_map(&self.model, &self.tiers, &self.backend)
    }
}
