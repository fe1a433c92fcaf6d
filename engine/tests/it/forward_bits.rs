//! The forward pass's bits on every transformers fixture, against the fingerprints
//! committed in tests/fixtures/forward_bits.txt: the teacher-forced logits of every
//! position (one prefill), the first six tokens decoded one by one, and the final-normed
//! hidden states an MTP head reads. The CPU backend is the reference every other path
//! (SIMD builds, threads, wasm, WGSL) reproduces bit for bit, so these fingerprints hold on
//! every machine; a change to the model code that moves one bit fails here, whatever the
//! tolerance tests against transformers still accept. An intended change of the numbers
//! regenerates the file (`COLIBRI_UPDATE_BITS=1`) and says why in its commit.

use std::fmt::Write;
use std::path::PathBuf;

use colibri_engine::{Logits, Model};

/// FNV-1a over the f32 bit patterns.
fn fingerprint(v: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in v {
        h ^= x.to_bits() as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[test]
fn every_fixture_gives_the_committed_bits() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("reference.json").exists())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.len() >= 13, "fixtures missing: {names:?}");
    let mut got = String::new();
    for name in &names {
        let dir = root.join(name);
        let model = Model::open_dir(&dir).unwrap();
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let ids: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let all = model.forward(&mut model.new_session(), &ids, Logits::All).unwrap();
        let mut s = model.new_session();
        let mut steps = Vec::new();
        for &id in ids.iter().take(6) {
            steps.extend(model.forward(&mut s, &[id], Logits::Last).unwrap());
        }
        let (_, hidden) =
            model.forward_hidden(&mut model.new_session(), &ids[..ids.len().min(5)], Logits::Last).unwrap();
        writeln!(
            got,
            "{name} prefill {:016x} decode {:016x} hidden {:016x}",
            fingerprint(&all),
            fingerprint(&steps),
            fingerprint(&hidden)
        )
        .unwrap();
    }
    let file = root.join("forward_bits.txt");
    if std::env::var_os("COLIBRI_UPDATE_BITS").is_some() {
        std::fs::write(&file, &got).unwrap();
    }
    let want = std::fs::read_to_string(&file).unwrap();
    for (g, w) in got.lines().zip(want.lines()) {
        assert_eq!(g, w, "the forward pass's bits changed (tests/fixtures/forward_bits.txt)");
    }
    assert_eq!(got.lines().count(), want.lines().count(), "fixtures and fingerprints differ in number:\n{got}");
}
