//! The browser's expert tiers behind the engine's `ByteSource`: the persistent OPFS tier,
//! then the helper over HTTP Range. (The RAM tier is the engine's own expert cache on top
//! of this source; the GPU pool sits above that.) Every expert is checked against its
//! manifest checksum before it is used or stored.

use std::cell::RefCell;
use std::collections::HashMap;

use colibri_engine::experts::ram_tiers::{plan_repin, Key};
use colibri_engine::experts::source::ByteSource;
use colibri_engine::experts::usage::ExpertUsage;
use colibri_engine::format::byteranges::Part;
use colibri_engine::format::manifest::parse_checksum;
use colibri_engine::format::manifest::{checksum, Manifest};
use colibri_engine::{Error, Result};
use serde::Serialize;

use crate::disk::{Disk, Store};
use crate::idb::{Idb, Read};
use crate::net::{now_ms, xhr_ranges};

#[derive(Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierStats {
    /// Experts served from the browser's disk tier.
    pub disk_hits: u64,
    /// Experts fetched from the helper.
    pub helper_fetches: u64,
    /// Bytes fetched from the helper for experts.
    pub bytes_fetched: u64,
    /// Requests made for experts (several experts can share one).
    pub requests: u64,
    /// Fetches repeated after a network error or a bad checksum.
    pub retries: u64,
    /// Stored experts that failed their checksum and were fetched again.
    pub corrupt_dropped: u64,
    /// Bytes staged by a prefetch (router lookahead) and dropped unused.
    pub prefetch_wasted_bytes: u64,
    /// Expert bytes read from the disk tier, and the time those reads took (ms).
    pub disk_bytes: u64,
    pub disk_ms: f64,
    pub disk_enabled: bool,
    /// Experts evicted from the disk tier to stay under its budget, evicted experts
    /// fetched again, and experts not stored because pinned ones filled the budget.
    pub disk_evictions: u64,
    pub disk_refetches: u64,
    pub disk_skipped: u64,
    /// Experts moved into or out of the disk tier's pin set after it opened.
    pub disk_repinned: u64,
    /// "opfs" or "indexeddb" while the disk tier is on.
    pub disk_kind: Option<&'static str>,
    /// Why the disk tier is off, if it is ("quota exceeded", "not available").
    pub disk_error: Option<String>,
}

/// The disk tier's budget (None: none), the expert bytes it holds, its files' bytes, and
/// the experts (and bytes) of its pin set that it holds.
#[derive(Clone, Copy)]
pub struct DiskUsage {
    pub budget: Option<u64>,
    pub stored: u64,
    pub file: u64,
    pub pinned: usize,
    pub pinned_bytes: u64,
}

struct StoredExpert {
    expert: usize,
    len: usize,
    xxh3: u64,
}

pub struct BrowserSource {
    data_url: String,
    /// The server answers several ranges in one request (multipart/byteranges); if not
    /// (S3, GCS, many CDNs answer with the whole file), one range per request.
    multi_range: bool,
    slots: HashMap<u64, StoredExpert>,
    /// (layer, expert) -> the expert's number in manifest order
    numbers: HashMap<Key, usize>,
    /// (expert in manifest order) -> its bytes
    lens: Vec<u64>,
    disk: RefCell<Option<Disk>>,
    /// The disk tier's pin set (kept across a hand-off between tabs).
    disk_pins: RefCell<Vec<Key>>,
    n_experts: usize,
    /// Expert bytes fetched (or read from disk) by `prefetch`, waiting for their `read_at`.
    staged: RefCell<HashMap<u64, Vec<u8>>>,
    pub stats: RefCell<TierStats>,
}

// SAFETY: the engine's Send + Sync bounds exist for the native build. In the browser this
// source is only touched from the engine's worker: the threaded build (feature `threads`)
// hands the pool's workers weight bytes and activations inside a kernel, never an expert
// source (experts are fetched before the kernels run), and JS objects cannot cross anyway.
unsafe impl Send for BrowserSource {}
unsafe impl Sync for BrowserSource {}

impl BrowserSource {
    /// The tiers of the model `m` without a disk tier ([`BrowserSource::attach`] adds it;
    /// `disk_error` says why there is none until then).
    pub fn new(m: &Manifest, data_url: String, multi_range: bool, disk_error: Option<String>) -> Self {
        let mut slots = HashMap::new();
        let mut numbers = HashMap::new();
        let mut lens = Vec::new();
        let mut expert = 0;
        for layer in &m.experts.layers {
            for (i, e) in layer.experts.iter().enumerate() {
                slots.insert(
                    e.offset,
                    StoredExpert { expert, len: e.length as usize, xxh3: parse_checksum(&e.xxh3).unwrap_or(0) },
                );
                numbers.insert((layer.layer as usize, i), expert);
                lens.push(e.length);
                expert += 1;
            }
        }
        let stats = TierStats { disk_error, ..Default::default() };
        BrowserSource {
            data_url,
            multi_range,
            slots,
            numbers,
            lens,
            disk: RefCell::new(None),
            disk_pins: RefCell::new(Vec::new()),
            n_experts: expert,
            staged: RefCell::new(HashMap::new()),
            stats: RefCell::new(stats),
        }
    }

    pub fn multi_range(&self) -> bool {
        self.multi_range
    }

    /// Bytes of each expert, in manifest order (what the disk tier stores).
    pub fn expert_lens(&self) -> &[u64] {
        &self.lens
    }

    /// Bytes of expert `key` (layer, expert); 0 if there is none.
    pub fn expert_len(&self, key: Key) -> u64 {
        self.numbers.get(&key).map_or(0, |&e| self.lens[e])
    }

    /// Turns the disk tier on (this tab holds the model's browser storage now).
    pub fn attach(&self, d: Disk) {
        let mut s = self.stats.borrow_mut();
        s.disk_enabled = true;
        s.disk_kind = Some(d.kind());
        s.disk_error = None;
        drop(s);
        let mut d = d;
        let pins: Vec<usize> = self.disk_pins.borrow().iter().filter_map(|k| self.numbers.get(k).copied()).collect();
        d.policy.set_pinned(&pins);
        if let Some(old) = self.disk.borrow_mut().replace(d) {
            old.close();
        }
    }

    /// Turns the disk tier off, closing its files (another tab takes the storage over,
    /// or waits for it); `why` is what `stats().diskError` says.
    pub fn detach(&self, why: String) {
        if let Some(d) = self.disk.borrow_mut().take() {
            d.close();
        }
        let mut s = self.stats.borrow_mut();
        s.disk_enabled = false;
        s.disk_kind = None;
        s.disk_error = Some(why);
    }

    /// Re-pins the disk tier at a turn end: the hottest experts by `counts` that fit half
    /// its budget are never evicted, chosen with the engine's rule and hysteresis
    /// ([`plan_repin`], as the RAM tier); returns how many moved. No budget, no pins.
    pub fn repin_disk(&self, counts: &ExpertUsage) -> usize {
        let mut disk = self.disk.borrow_mut();
        let Some(d) = disk.as_mut() else { return 0 };
        let Some(budget) = d.policy.budget() else { return 0 };
        let mut pins = self.disk_pins.borrow_mut();
        let size = |k: Key| self.numbers.get(&k).map_or(0, |&e| self.lens[e]);
        let (add, drop) = plan_repin(&pins, counts, &size, budget / 2);
        pins.retain(|k| !drop.contains(k));
        pins.extend(&add);
        let numbers: Vec<usize> = pins.iter().filter_map(|k| self.numbers.get(k).copied()).collect();
        d.policy.set_pinned(&numbers);
        self.stats.borrow_mut().disk_repinned += (add.len() + drop.len()) as u64;
        add.len() + drop.len()
    }

    /// What the disk tier holds; None while it is off.
    pub fn disk_usage(&self) -> Option<DiskUsage> {
        let disk = self.disk.borrow();
        let d = disk.as_ref()?;
        let (pinned, pinned_bytes) = d.policy.pinned_stored();
        Some(DiskUsage {
            budget: d.policy.budget(),
            stored: d.policy.stored_bytes(),
            file: d.file_bytes(),
            pinned,
            pinned_bytes,
        })
    }

    /// Per expert in manifest order: is it in the disk tier?
    pub fn disk_mask(&self) -> Vec<bool> {
        self.disk.borrow().as_ref().map(|d| d.mask(self.n_experts)).unwrap_or_default()
    }

    pub fn disk_count(&self) -> usize {
        self.disk.borrow().as_ref().map_or(0, |d| d.count())
    }

    /// Whether a step stopped for experts that IndexedDB must read asynchronously.
    pub fn has_pending(&self) -> bool {
        matches!(&*self.disk.borrow(), Some(Disk { store: Store::Idb(i), .. }) if i.has_pending())
    }

    /// Reads the experts a step stopped for (IndexedDB) so that its retry finds them.
    pub async fn load_pending(&self) -> Result<()> {
        let (keys, store) = match &mut *self.disk.borrow_mut() {
            Some(Disk { store: Store::Idb(i), .. }) if i.has_pending() => i.take_pending().map_err(Error::Invalid)?,
            _ => return Ok(()),
        };
        let t0 = now_ms();
        let records = Idb::load(&keys, &store)
            .await
            .map_err(|e| Error::Invalid(format!("reading experts from IndexedDB: {e}")))?;
        self.stats.borrow_mut().disk_ms += now_ms() - t0;
        if let Some(Disk { store: Store::Idb(i), .. }) = &mut *self.disk.borrow_mut() {
            i.loaded(records);
        }
        Ok(())
    }

    /// Hit: `buf` holds the verified expert. Pending: stored in IndexedDB, to be read
    /// asynchronously before the step is retried.
    fn read_disk(&self, slot: &StoredExpert, buf: &mut [u8]) -> Read {
        let mut disk = self.disk.borrow_mut();
        let Some(d) = disk.as_mut() else { return Read::Miss };
        let t0 = now_ms();
        match d.read(slot.expert, buf) {
            Read::Hit => {}
            other => return other,
        }
        {
            let mut s = self.stats.borrow_mut();
            s.disk_bytes += buf.len() as u64;
            s.disk_ms += now_ms() - t0;
        }
        if checksum(buf) == slot.xxh3 {
            return Read::Hit;
        }
        self.stats.borrow_mut().corrupt_dropped += 1;
        let _ = d.forget(slot.expert);
        Read::Miss
    }

    fn to_disk(&self, slot: &StoredExpert, bytes: &[u8]) {
        let mut disk = self.disk.borrow_mut();
        let Some(d) = disk.as_mut() else { return };
        if d.policy.take_evicted(slot.expert) {
            self.stats.borrow_mut().disk_refetches += 1;
        }
        match d.write(slot.expert, bytes) {
            Ok(r) => {
                let mut s = self.stats.borrow_mut();
                s.disk_evictions += r.evicted;
                s.disk_skipped += r.skipped as u64;
            }
            Err(e) => {
                // A full quota (or any storage failure) degrades to the RAM tier.
                d.close();
                *disk = None;
                let mut s = self.stats.borrow_mut();
                s.disk_enabled = false;
                s.disk_kind = None;
                s.disk_error = Some(format!("browser storage refused a write ({e}); keeping experts in RAM only"));
            }
        }
    }

    /// Fetches `ranges` (offset, len) from the helper in one request, verifying every
    /// expert among them; retries the unverified remainder a few times.
    fn fetch(&self, wanted: &[(u64, usize)], out: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let mut left: Vec<(u64, usize)> = wanted.to_vec();
        let mut last = String::new();
        for attempt in 0..3 {
            if left.is_empty() {
                return Ok(());
            }
            if attempt > 0 {
                self.stats.borrow_mut().retries += 1;
            }
            let ranges: Vec<(u64, u64)> = left.iter().map(|&(o, l)| (o, o + l as u64 - 1)).collect();
            let parts = match self.request(&ranges) {
                Ok(p) => p,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let mut still = Vec::new();
            for &(off, len) in &left {
                // Match by containment: a server or CDN may merge adjacent ranges into one part.
                let part = parts.iter().find_map(|p| {
                    let start = off.checked_sub(p.offset)? as usize;
                    p.data.get(start..start + len).map(|data| Part {
                        offset: off,
                        data: data.to_vec(),
                        complete: p.complete,
                    })
                });
                let part = part.as_ref();
                let ok = match (part, self.slots.get(&off)) {
                    (Some(p), Some(slot)) if slot.len == len => checksum(&p.data) == slot.xxh3,
                    (Some(_), _) => true,
                    (None, _) => false,
                };
                match part {
                    Some(p) if ok => {
                        let mut s = self.stats.borrow_mut();
                        if self.slots.contains_key(&off) {
                            s.helper_fetches += 1;
                        }
                        s.bytes_fetched += len as u64;
                        drop(s);
                        if let Some(slot) = self.slots.get(&off) {
                            self.to_disk(slot, &p.data);
                        }
                        out(off, &p.data)?;
                    }
                    _ => {
                        last = format!("bytes {off}+{len} failed their checksum or were missing from the response");
                        still.push((off, len));
                    }
                }
            }
            left = still;
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(format!("{}: could not fetch expert bytes from the helper: {last}", self.data_url)))
        }
    }
}

impl BrowserSource {
    /// The bytes of `ranges` (inclusive ends): one request, or one per range where the
    /// server cannot answer several at once.
    fn request(&self, ranges: &[(u64, u64)]) -> std::result::Result<Vec<Part>, String> {
        if self.multi_range || ranges.len() < 2 {
            self.stats.borrow_mut().requests += 1;
            return xhr_ranges(&self.data_url, ranges);
        }
        let mut parts = Vec::with_capacity(ranges.len());
        for r in ranges {
            self.stats.borrow_mut().requests += 1;
            parts.extend(xhr_ranges(&self.data_url, std::slice::from_ref(r))?);
        }
        Ok(parts)
    }

    /// The error that stops a step whose experts IndexedDB must read first; the engine
    /// sees `has_pending`, awaits `load_pending` and retries the step.
    fn pending_error(&self) -> Result<()> {
        if self.has_pending() {
            Err(Error::Invalid("experts are being read from IndexedDB".into()))
        } else {
            Ok(())
        }
    }
}

impl ByteSource for BrowserSource {
    /// A layer's experts: those on disk are read (and verified) now, all the others come
    /// from the helper in one multi-range request.
    fn prefetch(&self, ranges: &[(u64, usize)]) -> Result<()> {
        // Each prefetch names what the next reads will be: bytes staged earlier and not
        // asked for again were a wrong guess of the router lookahead.
        {
            let mut staged = self.staged.borrow_mut();
            let before: usize = staged.values().map(Vec::len).sum();
            staged.retain(|off, _| ranges.iter().any(|&(o, _)| o == *off));
            let after: usize = staged.values().map(Vec::len).sum();
            self.stats.borrow_mut().prefetch_wasted_bytes += (before - after) as u64;
        }
        let mut need = Vec::new();
        for &(off, len) in ranges {
            if self.staged.borrow().contains_key(&off) {
                continue;
            }
            if let Some(slot) = self.slots.get(&off).filter(|s| s.len == len) {
                let mut buf = vec![0u8; len];
                match self.read_disk(slot, &mut buf) {
                    Read::Hit => {
                        self.stats.borrow_mut().disk_hits += 1;
                        self.staged.borrow_mut().insert(off, buf);
                        continue;
                    }
                    Read::Pending => continue,
                    Read::Miss => {}
                }
            }
            need.push((off, len));
        }
        if !need.is_empty() {
            self.fetch(&need, &mut |off, data| {
                self.staged.borrow_mut().insert(off, data.to_vec());
                Ok(())
            })?;
        }
        self.pending_error()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let staged = self.staged.borrow_mut().remove(&offset);
        if let Some(data) = staged.filter(|d| d.len() == buf.len()) {
            buf.copy_from_slice(&data);
            return Ok(());
        }
        if let Some(slot) = self.slots.get(&offset).filter(|s| s.len == buf.len()) {
            match self.read_disk(slot, buf) {
                Read::Hit => {
                    self.stats.borrow_mut().disk_hits += 1;
                    return Ok(());
                }
                Read::Pending => return self.pending_error(),
                Read::Miss => {}
            }
        }
        let len = buf.len();
        self.fetch(&[(offset, len)], &mut |_, data| {
            buf.copy_from_slice(data);
            Ok(())
        })
    }

    fn name(&self) -> String {
        self.data_url.clone()
    }

    /// Every expert this source hands out was checked as it came from the helper
    /// (`fetch`) or from the disk tier (`read_disk`).
    fn checks_expert(&self, offset: u64, len: usize) -> bool {
        self.slots.get(&offset).is_some_and(|s| s.len == len)
    }

    /// The expert's bytes are here already: fetched by a prefetch (the layer's misses,
    /// the lookahead) and waiting for their read, or in the disk tier. Hybrid placement on
    /// WebGPU may then compute it on the CPU threads, reading it from there as the GPU side
    /// would to upload it.
    fn holds_locally(&self, offset: u64, len: usize) -> bool {
        if self.staged.try_borrow().is_ok_and(|s| s.get(&offset).is_some_and(|b| b.len() == len)) {
            return true;
        }
        let Some(slot) = self.slots.get(&offset).filter(|s| s.len == len) else { return false };
        self.disk.try_borrow().is_ok_and(|d| d.as_ref().is_some_and(|d| d.holds(slot.expert)))
    }
}
