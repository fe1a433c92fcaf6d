//! The native expert cache changes speed, never the answer: logits are bit-identical for
//! every budget, with and without reader threads, router-lookahead prefetch, pinning and
//! O_DIRECT, and whatever order the reads complete in (a byte source that delays each
//! read pseudo-randomly scrambles it). Also: the counters that benchmarks report add up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use colibri_engine::experts::cache::{CacheOptions, CacheStats};
use colibri_engine::experts::source::ByteSource;
use colibri_engine::experts::usage::ExpertUsage;
use colibri_engine::model::open::ModelDir;
use colibri_engine::tensor::Bytes;
use colibri_engine::{Logits, Model};

fn scratch(base: &Path, tag: &str) -> PathBuf {
    let d = base.join(format!("coli-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn converted(base: &Path, tag: &str) -> PathBuf {
    converted_fixture(base, tag, "olmoe")
}

fn converted_fixture(base: &Path, tag: &str, fixture: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(fixture);
    let dst = scratch(base, tag);
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("convert")
        .arg(&src)
        .arg("-o")
        .arg(&dst)
        .args(["--quant", "int4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dst
}

/// Delays every read by a pseudo-random 0-3 ms and records the order reads finish in.
struct Scrambled {
    inner: Arc<dyn ByteSource>,
    seq: AtomicU64,
    /// (start number, finish number) of every read.
    log: Mutex<Vec<(u64, u64)>>,
    finished: AtomicU64,
}

impl ByteSource for Scrambled {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> colibri_engine::Result<()> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        let h = (offset ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 60;
        std::thread::sleep(std::time::Duration::from_micros(h * 200));
        let r = self.inner.read_at(offset, buf);
        let f = self.finished.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push((n, f));
        r
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

fn open(dir: &Path, opts: CacheOptions, scrambled: bool) -> (Model, Option<Arc<Scrambled>>) {
    let (container, file) = ModelDir::open(dir, opts.direct).unwrap().into_container().unwrap();
    let m = &container.manifest;
    let mut dense = vec![0u8; m.dense.length as usize];
    file.read_at(m.dense.offset, &mut dense).unwrap();
    let file: Arc<dyn ByteSource> = Arc::new(file);
    let (source, s): (Arc<dyn ByteSource>, _) = if scrambled {
        let s = Arc::new(Scrambled {
            inner: file,
            seq: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
            finished: AtomicU64::new(0),
        });
        (s.clone(), Some(s))
    } else {
        (file, None)
    };
    (container.load(&Bytes::from_vec(dense), source, opts).unwrap(), s)
}

/// Prefill, then greedy-free decode steps on fixed ids (the same work for every config).
fn run(model: &Model) -> (Vec<u32>, CacheStats) {
    let mut s = model.new_session();
    let mut bits: Vec<u32> =
        model.forward(&mut s, &[5, 17, 3, 99, 42, 7], Logits::All).unwrap().iter().map(|v| v.to_bits()).collect();
    for id in [11u32, 200, 3, 3, 64, 150, 9, 88] {
        bits.extend(model.forward(&mut s, &[id], Logits::Last).unwrap().iter().map(|v| v.to_bits()));
        model.experts.end_turn().unwrap();
    }
    (bits, model.experts.cache_stats().unwrap())
}

#[test]
fn bits_do_not_depend_on_budget_readers_prefetch_pinning_direct_or_read_order() {
    let tmp = std::env::temp_dir();
    let dir = converted(&tmp, "bits");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("colibri.json")).unwrap()).unwrap();
    let expert = m["experts"]["layers"][0]["experts"][0]["length"].as_u64().unwrap();
    let (reference, _) = run(&Model::open_dir_with(&dir, CacheOptions::with_ram(None)).unwrap());
    let cfg = Model::open_dir_with(&dir, CacheOptions::with_ram(Some(0))).unwrap().cfg;
    // Learned usage that pins a few experts of every layer.
    let mut usage = ExpertUsage::new(cfg.n_layers, cfg.router.n_experts);
    for l in 0..cfg.n_layers {
        for e in 0..3 {
            usage.add(l, e * 2, 10 - e as u64).unwrap();
        }
    }
    let mut checked = 0;
    for ram in [Some(0), Some(expert), Some(expert * 7), None] {
        for readers in [0usize, 3] {
            for lookahead in [false, true] {
                for (pin, scrambled) in [(0u64, false), (expert * 4, false), (0, true), (expert * 4, true)] {
                    let opts = CacheOptions { ram, pin, readers, lookahead, direct: false, usage: Some(usage.clone()) };
                    let (model, src) = open(&dir, opts.clone(), scrambled);
                    let (bits, st) = run(&model);
                    let what = format!("{opts:?} scrambled {scrambled}");
                    assert!(bits == reference, "logits differ: {what}");
                    assert_eq!(st.hits + st.misses, st.pinned_hits + st.ram_hits + st.misses);
                    assert!(st.cached_bytes <= ram.unwrap_or(u64::MAX), "{what}: {st:?}");
                    let pinned = ram.unwrap_or(u64::MAX).min(pin) >= expert;
                    assert_eq!(st.pinned_experts > 0, pinned, "{what}: {st:?}");
                    if pinned {
                        assert!(st.pinned_hits > 0, "{what}: {st:?}");
                    }
                    if lookahead && readers > 0 {
                        assert!(
                            st.lookahead.routed > 0 && st.lookahead.predicted_hits <= st.lookahead.routed,
                            "{what}: {st:?}"
                        );
                        assert!(
                            st.prefetch_wasted_bytes + st.prefetch_cancelled_bytes <= st.prefetch_bytes,
                            "{what}: {st:?}"
                        );
                        if ram == Some(0) {
                            assert!(st.lookahead.prefetched > 0 && st.prefetched_hits > 0, "{what}: {st:?}");
                        }
                    } else {
                        assert_eq!((st.lookahead.routed, st.lookahead.prefetched), (0, 0), "{what}");
                    }
                    if let (Some(s), true) = (src, readers > 0 && ram == Some(0)) {
                        // The reads really did finish out of order.
                        let log = s.log.lock().unwrap();
                        let mut by_start = log.clone();
                        by_start.sort();
                        assert!(by_start.windows(2).any(|w| w[1].1 < w[0].1), "{what}: reads finished in order");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// DeepSeek-V4's hash layers name their experts from the token ids: each pass starts
/// their reads before its first layer, with the router lookahead off, and the logits are
/// the bits of a model with every expert in RAM, whatever order the reads finish in. With
/// the lookahead on, its learned-router layers are guessed from the layer before (and the
/// guesses counted): the same bits.
#[test]
fn hash_layers_read_their_experts_ahead_with_the_same_bits() {
    let tmp = std::env::temp_dir();
    let dir = converted_fixture(&tmp, "hash", "deepseek_v4");
    let (reference, _) = run(&Model::open_dir_with(&dir, CacheOptions::with_ram(None)).unwrap());
    for (readers, lookahead) in [(0usize, false), (3, false), (3, true)] {
        let opts = CacheOptions { ram: Some(0), readers, lookahead, ..Default::default() };
        let (model, _) = open(&dir, opts.clone(), true);
        let (bits, st) = run(&model);
        assert!(bits == reference, "logits differ: {opts:?}");
        if lookahead {
            assert!(st.lookahead.predicted > 0 && st.lookahead.routed > 0, "learned layers guessed: {st:?}");
            assert!(st.lookahead.predicted_hits <= st.lookahead.routed, "{st:?}");
            eprintln!("V4 lookahead: {:?}, recall {:?}", st.lookahead, st.lookahead.recall());
        } else {
            assert_eq!((st.lookahead.routed, st.lookahead.prefetched), (0, 0), "{st:?}");
        }
        if readers > 0 {
            // Two hash layers of top-2 over 7 passes: at least one read each, all used
            // (the lookahead's guesses may be wasted; the known experts never are).
            assert!(st.lookahead.known >= 14 && st.prefetched_hits >= st.lookahead.known, "{st:?}");
            if !lookahead {
                assert_eq!(st.prefetch_wasted_bytes + st.prefetch_cancelled_bytes, 0, "{st:?}");
            }
        } else {
            assert_eq!(st.lookahead.known, 0, "{st:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn direct_io_is_used_where_allowed_and_falls_back_on_tmpfs() {
    let mut bases = vec![(std::env::temp_dir(), "disk")];
    if Path::new("/dev/shm").is_dir() {
        bases.push((PathBuf::from("/dev/shm"), "tmpfs"));
    }
    for (base, kind) in bases {
        let dir = converted(&base, &format!("direct-{kind}"));
        let (reference, _) = run(&Model::open_dir_with(&dir, CacheOptions::with_ram(None)).unwrap());
        let fs_refuses = ModelDir::open(&dir, true).unwrap().container().unwrap().1.direct_note.is_some();
        for readers in [0, 2] {
            let opts = CacheOptions { ram: Some(0), readers, lookahead: true, direct: true, ..Default::default() };
            let (bits, st) = run(&Model::open_dir_with(&dir, opts).unwrap());
            assert!(bits == reference, "{kind}: logits differ with --direct");
            assert!(st.bytes_read > 0);
            // tmpfs refused O_DIRECT before Linux 6.6 and takes it since; either way the
            // answer is the same and the stats say which path ran. (The refusal path on
            // a file system that always refuses, procfs, is an engine unit test.)
            assert_eq!(st.direct_io, !fs_refuses, "{kind}: {st:?}");
            eprintln!("{kind}: O_DIRECT in use: {}", st.direct_io);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn coli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_coli")).args(args).output().unwrap()
}

/// A synthetic model with experts many times the budget: `coli bench` decodes through
/// most of them, and the process's peak RSS (VmHWM) stays within budget + dense weights +
/// a small constant (the binary, thread stacks, the read window, activations).
#[test]
fn peak_rss_stays_within_budget_plus_dense() {
    let root = scratch(&std::env::temp_dir(), "rss");
    let (src, dst) = (root.join("hf"), root.join("q"));
    let out = coli(&[
        "synth",
        "-o",
        src.to_str().unwrap(),
        "--layers",
        "4",
        "--experts",
        "32",
        "--top-k",
        "8",
        "--hidden",
        "512",
        "--intermediate",
        "1024",
        "--heads",
        "8",
        "--vocab",
        "2000",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = coli(&["convert", src.to_str().unwrap(), "-o", dst.to_str().unwrap(), "--quant", "int4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&src).unwrap();
    let budget: u64 = 8 << 20;
    let out = coli(&[
        "bench",
        "--model",
        dst.to_str().unwrap(),
        "--ram",
        "8M",
        "--decode-tokens",
        "24",
        "--probe-bytes",
        "4M",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dense = r["model"]["dense_bytes"].as_u64().unwrap();
    let experts = r["model"]["expert_bytes"].as_u64().unwrap();
    let peak = r["peak_rss_bytes"].as_u64().unwrap();
    let constant: u64 = 64 << 20;
    let touched = r["prefill"]["bytes_read"].as_u64().unwrap() + r["decode"]["bytes_read"].as_u64().unwrap();
    eprintln!(
        "peak RSS {:.1} MiB; budget 8 MiB, dense {:.1} MiB, experts {:.1} MiB, read {:.1} MiB",
        peak as f64 / 1048576.0,
        dense as f64 / 1048576.0,
        experts as f64 / 1048576.0,
        touched as f64 / 1048576.0
    );
    assert!(experts > budget + constant, "the model is too small to show anything");
    assert!(touched > budget + constant, "the run did not read enough experts to show anything");
    assert!(peak <= budget + dense + constant, "peak RSS {peak} > budget {budget} + dense {dense} + {constant}");
    assert!(r["expert_cache"]["cached_bytes_at_end"].as_u64().unwrap() <= budget);
    assert!(r["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&root);
}
