//! Unit tests of the expert cache (cache.rs).

use super::*;
use crate::experts::source::MemorySource;
use crate::format::manifest::{checksum_hex, plan, ExpertLayerPlan, QuantSummary};
use crate::format::quant::quantize_row;

fn cfg() -> ExpertShape {
    ExpertShape { moe_layers: vec![true; 2], hidden: 8, intermediate: 4, n_experts: 3, top_k: 2, mtp_layers: 0 }
}

/// A container of random int8 experts in memory, and the f32 values they decode to.
fn container() -> (Manifest, Vec<u8>, Vec<Vec<f32>>) {
    let dt = DType::Int8 { group: 8 };
    let layers: Vec<ExpertLayerPlan> = (0..2)
        .map(|l| ExpertLayerPlan { layer: l, count: 3, parts: [(dt, [4, 8]), (dt, [4, 8]), (dt, [8, 4])] })
        .collect();
    let mut m = plan("weights.bin", QuantSummary::default(), serde_json::json!({}), vec![], &[], &layers).unwrap();
    let mut data = vec![0u8; m.data_size as usize];
    let mut gate_rows = Vec::new();
    let mut seed = 3u64;
    for l in &mut m.experts.layers {
        let parts = l.parts.clone();
        for e in &mut l.experts {
            for p in &parts {
                let (rows, cols) = (p.shape[0] as usize, p.shape[1] as usize);
                let rb = dt.row_bytes(cols).unwrap();
                for r in 0..rows {
                    let row: Vec<f32> = (0..cols)
                        .map(|_| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                        })
                        .collect();
                    let at = (e.offset + p.offset) as usize + r * rb;
                    quantize_row(dt, &row, &mut data[at..at + rb]).unwrap();
                    if p.name == "gate" && r == 0 {
                        let mut out = vec![0.0; cols];
                        crate::tensor::decode_row(dt, cols, &data[at..at + rb], &mut out);
                        gate_rows.push(out);
                    }
                }
            }
            e.xxh3 = checksum_hex(checksum(&data[e.offset as usize..(e.offset + e.length) as usize]));
        }
    }
    (m, data, gate_rows)
}

fn source(data: &[u8]) -> Arc<dyn ByteSource> {
    Arc::new(MemorySource { bytes: Bytes::from_vec(data.to_vec()), name: "mem".into() })
}

#[test]
fn reads_decodes_and_caches_under_the_budget() {
    let (m, data, gate_rows) = container();
    let size = m.experts.layers[0].experts[0].length;
    // Each use noted first, as the MoE block does. Budgets keep by recent use count, and a
    // newcomer must have been used more than what it displaces: at one expert, (0, 0) stays
    // (an LRU of one expert would miss 5 times).
    for (budget, want_misses, want_cached) in
        [(Some(0), 5, 0), (Some(size), 3, 1), (Some(size * 2), 3, 2), (Some(size * 4), 3, 3), (None, 3, 3)]
    {
        let x = ExpertCache::new(&m, &cfg(), source(&data), budget).unwrap();
        for (l, e) in [(0, 0), (1, 2), (0, 0), (0, 1), (0, 0)] {
            x.note_use(l, e, 1);
            let got = x.expert(l, e).unwrap();
            let mut row = vec![0.0; 8];
            got.gate.row_into(0, &mut row);
            assert_eq!(row, gate_rows[l * 3 + e]);
        }
        let s = x.stats();
        assert_eq!((s.misses, s.cached_experts), (want_misses, want_cached), "budget {budget:?}");
        assert!(s.cached_bytes <= budget.unwrap_or(u64::MAX));
    }
}

#[test]
fn corruption_and_mismatches_are_errors() {
    let (m, mut data, _) = container();
    let e = &m.experts.layers[1].experts[2];
    data[(e.offset + 5) as usize] ^= 4;
    let x = ExpertCache::new(&m, &cfg(), source(&data), None).unwrap();
    let err = x.expert(1, 2).unwrap_err().to_string();
    assert!(err.contains("mem: checksum mismatch in expert 2 of layer 1"), "{err}");
    assert!(x.expert(0, 2).is_ok());
    assert!(x.expert(0, 3).is_err() && x.expert(5, 0).is_err());
    assert!(x.verify_all(&mut |_, _| {}).is_err());
    let short = &data[..data.len() - 1];
    assert!(ExpertCache::new(&m, &cfg(), source(short), None).unwrap().expert(1, 2).is_err());
    let mut m2 = m.clone();
    m2.experts.layers[0].experts.pop();
    assert!(ExpertCache::new(&m2, &cfg(), source(&data), None).err().unwrap().to_string().contains("lists 2 experts"));
    let mut m3 = m.clone();
    m3.experts.layers.pop();
    assert!(ExpertCache::new(&m3, &cfg(), source(&data), None)
        .err()
        .unwrap()
        .to_string()
        .contains("no experts for MoE layer 1"));
}

/// A source that checks experts itself (the browser's) claims it; then the cache does
/// not hash them again, so whatever such a source hands out is what the cache uses.
#[test]
fn a_source_that_checks_experts_is_not_hashed_twice() {
    struct Checked(MemorySource, (u64, usize));
    impl ByteSource for Checked {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            self.0.read_at(offset, buf)
        }
        fn name(&self) -> String {
            self.0.name()
        }
        fn checks_expert(&self, offset: u64, len: usize) -> bool {
            (offset, len) == self.1
        }
    }
    let (m, mut data, _) = container();
    let e = &m.experts.layers[1].experts[2];
    data[(e.offset + 5) as usize] ^= 4;
    let e0 = &m.experts.layers[0].experts[0];
    data[(e0.offset + 5) as usize] ^= 4;
    let mem = MemorySource { bytes: Bytes::from_vec(data), name: "mem".into() };
    let x = ExpertCache::new(&m, &cfg(), Arc::new(Checked(mem, (e.offset, e.length as usize))), None).unwrap();
    assert!(x.expert(1, 2).is_ok(), "the source's own check is trusted");
    let err = x.expert(0, 0).unwrap_err().to_string();
    assert!(err.contains("checksum mismatch in expert 0 of layer 0"), "{err}");
}

/// `local` (hybrid placement's candidates): in the RAM tiers, or in the source's own
/// local tier (`holds_locally`); `ready` stays the RAM tiers only.
#[test]
fn local_is_ready_or_held_by_the_source() {
    struct Disk(MemorySource, u64);
    impl ByteSource for Disk {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            self.0.read_at(offset, buf)
        }
        fn name(&self) -> String {
            self.0.name()
        }
        fn holds_locally(&self, offset: u64, _len: usize) -> bool {
            offset == self.1
        }
    }
    let (m, data, _) = container();
    let mem = MemorySource { bytes: Bytes::from_vec(data), name: "mem".into() };
    let on_disk = m.experts.layers[1].experts[2].offset;
    let x = ExpertCache::new(&m, &cfg(), Arc::new(Disk(mem, on_disk)), Some(0)).unwrap();
    assert!(x.local(1, 2) && !x.ready(1, 2));
    assert!(!x.local(0, 2) && !x.local(1, 1) && !x.local(5, 0));
}

/// Counts learned after construction (the browser reads them once its disk tier is
/// open) pin at the next turn end, and are not handed out again as this run's use.
#[test]
fn learned_counts_pin_at_the_next_turn_end() {
    let (m, data, _) = container();
    let size = m.experts.layers[0].experts[0].length;
    let opts = CacheOptions { ram: Some(size * 4), pin: size * 2, ..Default::default() };
    let x = ExpertCache::with_options(&m, &cfg(), source(&data), opts).unwrap();
    assert_eq!(x.stats().pinned_experts, 0);
    let mut u = ExpertUsage::new(2, 3);
    u.merge_triples(&[(1, 2, 9), (0, 1, 5), (0, 0, 1)]).unwrap();
    x.learn(&u);
    x.learn(&ExpertUsage::new(3, 3)); // another shape: ignored
    assert!(x.take_usage().is_empty());
    x.end_turn().unwrap();
    let mut pinned = x.cached();
    pinned.sort_unstable();
    assert_eq!(pinned, vec![(0, 1), (1, 2)]);
    assert_eq!((x.stats().pinned_experts, x.stats().misses), (2, 0));
    x.expert(1, 2).unwrap();
    assert_eq!(x.stats().pinned_hits, 1);
}

/// Under a budget the second tier keeps the experts used most of late, even where the
/// budget holds a whole token's experts (4 here): one used less than every resident is
/// read but not kept (an LRU would keep it), and the counts fade (halved every
/// DECAY_TOKENS tokens' worth of uses, here 64), so an expert used more than the residents
/// of late takes a place although they were used more in all.
#[test]
fn recent_uses_decide_what_stays_and_fade() {
    let (m, data, _) = container();
    let size = m.experts.layers[0].experts[0].length;
    let x = ExpertCache::new(&m, &cfg(), source(&data), Some(size * 4)).unwrap();
    assert_eq!(DECAY_TOKENS * 2 * 2, 64, "the counts below assume a halving every 64 uses");
    // 200 uses each, a halving after each note: recent 12, 25, 50, 100.
    let hot = [(0, 0), (0, 1), (1, 0), (1, 1)];
    for &(l, e) in &hot {
        x.note_use(l, e, 200);
        x.expert(l, e).unwrap();
    }
    x.note_use(0, 2, 1);
    for _ in 0..2 {
        x.expert(0, 2).unwrap();
    }
    let mut kept = x.cached();
    kept.sort_unstable();
    assert_eq!((kept, x.stats().misses), (hot.to_vec(), 6));
    // 151 uses, then a halving: 75 against the residents' 6, 12, 25 and 50 (but 200 each in
    // all): it takes the place of the 6.
    x.note_use(0, 2, 150);
    x.expert(0, 2).unwrap();
    x.expert(0, 2).unwrap();
    let s = x.stats();
    assert_eq!((s.misses, s.ram_hits, s.cached_experts), (7, 1, 4));
    let kept = x.cached();
    assert!(!kept.contains(&(0, 0)) && kept.contains(&(0, 2)), "{kept:?}");
}

#[test]
fn repin_reads_in_batches_of_bounded_bytes() {
    let keys: Vec<Key> = (0..5).map(|e| (0, e)).collect();
    let mb15 = |_: Key| 15u64 << 20;
    let lens: Vec<usize> = repin_batches(&keys, &mb15).iter().map(|b| b.len()).collect();
    assert_eq!(lens, [2, 2, 1]);
    // An expert larger than a batch is a batch of its own; nothing is lost.
    let big = |k: Key| if k.1 == 1 { 50u64 << 20 } else { 1 << 20 };
    let lens: Vec<usize> = repin_batches(&keys, &big).iter().map(|b| b.len()).collect();
    assert_eq!(lens, [1, 1, 3]);
    assert!(repin_batches(&[], &mb15).is_empty());
}

/// A lookahead read still queued when the router chooses otherwise is cancelled: never
/// read, counted as cancelled (not wasted), and the bandwidth goes to the layer's reads.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn queued_prefetches_the_router_did_not_choose_are_cancelled_unread() {
    use std::sync::atomic::AtomicUsize;
    /// Reads block until the gate opens; `started` counts the reads begun.
    struct Gated {
        mem: MemorySource,
        open: Mutex<bool>,
        opened: std::sync::Condvar,
        started: AtomicUsize,
    }
    impl ByteSource for Gated {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            self.started.fetch_add(1, Ordering::SeqCst);
            let mut g = self.open.lock().unwrap();
            while !*g {
                g = self.opened.wait(g).unwrap();
            }
            self.mem.read_at(offset, buf)
        }
        fn name(&self) -> String {
            self.mem.name()
        }
    }
    let (m, data, gate_rows) = container();
    let size = m.experts.layers[0].experts[0].length;
    let src = Arc::new(Gated {
        mem: MemorySource { bytes: Bytes::from_vec(data), name: "mem".into() },
        open: Mutex::new(false),
        opened: std::sync::Condvar::new(),
        started: AtomicUsize::new(0),
    });
    let opts = CacheOptions { ram: Some(0), readers: 1, lookahead: true, ..Default::default() };
    let x = ExpertCache::with_options(&m, &cfg(), src.clone(), opts).unwrap();
    x.lookahead(1, &[0, 1, 2]);
    // The one reader begins expert 0 and blocks; experts 1 and 2 wait in the queue.
    let t0 = std::time::Instant::now();
    while src.started.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed().as_secs() < 10, "the reader never began");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    x.prepare(1, &[0]).unwrap();
    let s = x.stats();
    assert_eq!((s.prefetch_bytes, s.prefetch_cancelled_bytes, s.prefetch_wasted_bytes), (3 * size, 2 * size, 0));
    *src.open.lock().unwrap() = true;
    src.opened.notify_all();
    let mut row = vec![0.0; 8];
    x.expert(1, 0).unwrap().gate.row_into(0, &mut row);
    assert_eq!(row, gate_rows[3]);
    // A cancelled expert asked for later is read on demand, once.
    x.prepare(1, &[2]).unwrap();
    x.expert(1, 2).unwrap().gate.row_into(0, &mut row);
    assert_eq!(row, gate_rows[5]);
    let s = x.stats();
    assert_eq!((s.prefetched_hits, s.misses, s.bytes_read), (1, 2, 2 * size), "{s:?}");
    drop(x); // joins the reader: every queued job has run by now
    assert_eq!(src.started.load(Ordering::SeqCst), 2, "a cancelled prefetch was read");
}

/// Experts named by hash routing are read ahead with the router lookahead off: missing
/// ones only, counted as `known`, unknown ids ignored; then they are read once, not twice.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn known_experts_are_read_ahead_without_the_lookahead() {
    let (m, data, gate_rows) = container();
    let size = m.experts.layers[0].experts[0].length;
    let opts = CacheOptions { ram: Some(4 * size), readers: 1, lookahead: false, ..Default::default() };
    let x = ExpertCache::with_options(&m, &cfg(), source(&data), opts).unwrap();
    assert!(!x.lookahead_enabled());
    x.known(1, &[0, 2, 7]);
    x.known(5, &[0]);
    let t0 = std::time::Instant::now();
    while !(x.ready(1, 0) && x.ready(1, 2)) {
        assert!(t0.elapsed().as_secs() < 10, "the known experts were never read");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!x.ready(1, 1));
    // Named again while staged or held: no second read.
    x.known(1, &[0, 2]);
    x.prepare(1, &[0, 2]).unwrap();
    let mut row = vec![0.0; 8];
    x.expert(1, 2).unwrap().gate.row_into(0, &mut row);
    assert_eq!(row, gate_rows[5]);
    x.expert(1, 0).unwrap().gate.row_into(0, &mut row);
    assert_eq!(row, gate_rows[3]);
    let s = x.stats();
    assert_eq!((s.lookahead.known, s.lookahead.prefetched, s.lookahead.predicted), (2, 0, 0), "{s:?}");
    assert_eq!((s.prefetch_bytes, s.bytes_read, s.prefetched_hits, s.misses), (2 * size, 2 * size, 2, 2), "{s:?}");
}

/// Each expert is hashed the first time this process reads it: streamed again after an
/// eviction it is not hashed again, while `load` and `verify_all` (coli doctor) always hash.
/// A failed check leaves the expert unchecked, so every later read fails too.
#[test]
fn an_expert_is_hashed_on_its_first_read_and_by_verify_all() {
    struct Flipping(std::sync::Mutex<Vec<u8>>);
    impl ByteSource for Flipping {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            let d = self.0.lock().unwrap();
            let o = offset as usize;
            buf.copy_from_slice(d.get(o..o + buf.len()).ok_or_else(|| Error::Invalid("short".into()))?);
            Ok(())
        }
        fn name(&self) -> String {
            "flip".into()
        }
    }
    let (m, data, _) = container();
    let src = Arc::new(Flipping(std::sync::Mutex::new(data)));
    // A budget of nothing: every use reads the expert again.
    let x = ExpertCache::new(&m, &cfg(), src.clone(), Some(0)).unwrap();
    let (e, e1) = (&m.experts.layers[1].experts[2], &m.experts.layers[0].experts[1]);
    let gate = |x: &ExpertCache| x.expert(1, 2).map(|w| [&w.gate, &w.up, &w.down].map(|m| m.bytes.as_ref().to_vec()));
    let good = gate(&x).unwrap();
    src.0.lock().unwrap()[(e.offset + 5) as usize] ^= 4;
    src.0.lock().unwrap()[(e1.offset + 5) as usize] ^= 4;
    // Checked once already: the second stream is taken as it comes (here: the changed bytes).
    assert_ne!(gate(&x).unwrap(), good, "a second read of a checked expert is not hashed");
    for _ in 0..2 {
        let err = x.expert(0, 1).unwrap_err().to_string();
        assert!(err.contains("flip: checksum mismatch in expert 1 of layer 0"), "{err}");
    }
    let err = x.load(1, 2).unwrap_err().to_string();
    assert!(err.contains("checksum mismatch in expert 2 of layer 1"), "{err}");
    assert!(x.verify_all(&mut |_, _| {}).is_err());
}
