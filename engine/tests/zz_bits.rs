//! Temporary: prints a hash of every fixture's CPU logits (prefill all, decode steps).
use colibri_engine::{Logits, Model};
use std::path::PathBuf;
#[test]
fn bits() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("reference.json").exists())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut out = String::new();
    for name in names {
        let dir = root.join(&name);
        let Ok(model) = Model::open_dir(&dir) else {
            out += &format!("{name}: open failed\n");
            continue;
        };
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let ids: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let all = model.forward(&mut model.new_session(), &ids, Logits::All).unwrap();
        let mut s = model.new_session();
        let mut steps = Vec::new();
        for &id in ids.iter().take(6) {
            steps.extend(model.forward(&mut s, &[id], Logits::Last).unwrap());
        }
        let (h1, h2) = (hash(&all), hash(&steps));
        let (_, hid) = model.forward_hidden(&mut model.new_session(), &ids[..ids.len().min(5)], Logits::Last).unwrap();
        out += &format!("{name}: all {h1:016x} steps {h2:016x} hidden {:016x}\n", hash(&hid));
    }
    std::fs::write(std::env::var("BITS_OUT").unwrap_or("/tmp/bits.txt".into()), &out).unwrap();
    eprintln!("{out}");
}
fn hash(v: &[f32]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for x in v {
        h ^= x.to_bits() as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
