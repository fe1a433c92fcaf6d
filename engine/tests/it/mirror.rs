//! Experts read from two copies of a converted model (`COLI_MODEL_MIRROR`, issue #34 item 4):
//! the logits are the bits of one copy alone, reads go to both copies, and a copy that
//! goes bad while the model runs (truncated under it) is left out with one warning while
//! decoding goes on from the other, bit for bit.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::model::open::ModelDir;
use colibri_engine::{Logits, Model};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo")
}

fn copy_model(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for f in ["colibri.json", "config.json", "weights.bin"] {
        std::fs::copy(demo().join(f), dst.join(f)).unwrap();
    }
}

/// Decode steps of each run (the bad copy is cut short after the first step).
const STEPS: usize = 24;

/// A small expert budget, so that experts are read again and again while decoding.
fn opts() -> CacheOptions {
    CacheOptions::with_ram(Some(1 << 20))
}

/// Greedy decoding: every step's logits.
fn decode(model: &Model, steps: usize, mut between: impl FnMut(usize)) -> Vec<Vec<f32>> {
    let mut s = model.new_session();
    let mut next = vec![1u32, 17, 300, 42, 9];
    let mut out = Vec::new();
    for i in 0..steps {
        between(i);
        let l = model.forward(&mut s, &next, Logits::Last).unwrap();
        let id = l.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        out.push(l);
        next = vec![id];
    }
    out
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
}

#[test]
fn two_copies_give_the_bits_of_one_and_survive_a_copy_going_bad() {
    let root = std::env::temp_dir().join(format!("colibri-mirror-{}", std::process::id()));
    let (a, b) = (root.join("a/demo"), root.join("b/demo"));
    copy_model(&a);
    copy_model(&b);
    let alone = ModelDir::open(&a, false).unwrap().load(opts()).unwrap();
    let want = decode(&alone, STEPS, |_| {});
    drop(alone);

    let said = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = said.clone();
    let mut md = ModelDir::open(&a, false).unwrap();
    md.add_mirror(&b, Box::new(move |w| s2.lock().unwrap().push(w.to_string()))).unwrap();
    let mirrored = md.load(opts()).unwrap();
    let stats = mirrored.experts.cache_stats().unwrap();
    // After a few steps, the copy is cut short under the running model.
    let data = b.join("weights.bin");
    let mut at_cut = 0;
    let got = decode(&mirrored, STEPS, |i| {
        if i == 1 {
            at_cut = mirrored.experts.cache_stats().unwrap().misses;
            std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(4096).unwrap();
        }
    });
    assert_eq!(bits(&got), bits(&want), "the mirrored model's logits are one copy's");
    let end = mirrored.experts.cache_stats().unwrap().misses;
    assert!(end - stats.misses > 20, "experts were read while decoding ({} misses)", end - stats.misses);
    // Which copy serves a read depends on measured speed, but a copy that took none of the
    // last 16 reads takes the next one: past 16 reads after the cut, the bad copy was tried
    // whatever the timing (it once went untried in 12 steps on a loaded machine).
    assert!(
        end - at_cut > 16,
        "{} experts read after the cut: too few to be sure the bad copy was tried",
        end - at_cut
    );
    let said = said.lock().unwrap().clone();
    assert_eq!(said.len(), 1, "one warning for the copy that went bad: {said:?}");
    assert!(said[0].contains(&*b.display().to_string()) && said[0].contains("past the end"), "{}", said[0]);

    // A copy of another model, or an unfinished one, is refused before anything changes.
    let mut md = ModelDir::open(&a, false).unwrap();
    let e = md.add_mirror(&b, Box::new(|_| {})).unwrap_err().to_string();
    assert!(e.contains("an unfinished copy"), "{e}");
    std::fs::write(b.join("colibri.json"), b"{}").unwrap();
    let e = md.add_mirror(&b, Box::new(|_| {})).unwrap_err().to_string();
    assert!(e.contains("not a copy of"), "{e}");
    assert_eq!(bits(&decode(&md.load(opts()).unwrap(), 4, |_| {})), bits(&want[..4]));
    let _ = std::fs::remove_dir_all(&root);
}
