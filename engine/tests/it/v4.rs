//! DeepSeek-V4 (tests/fixtures/deepseek_v4) beyond the transformers comparison in
//! transformers_fixtures.rs (logits, greedy tokens, decode == prefill bits, rollback):
//! - the lightning indexer's top-k decides the later positions' logits;
//! - the state a conversation keeps is bounded: past the window it grows by the
//!   compressed entries only;
//! - hash layers use the experts `tid2eid[token id]` names;
//! - a conversation written to a cache file and read back continues with the same bits;
//! - a shared prefix is kept up to a snapshot of the state.

use std::path::{Path, PathBuf};

use colibri_engine::model::kv;
use colibri_engine::{Logits, Model};
use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v4")
}

/// A copy of the fixture whose config.json `edit` changes.
fn variant(tag: &str, edit: impl Fn(&mut serde_json::Map<String, Value>)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("colibri-v4-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(cfg.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    dir
}

fn logits(dir: &Path, ids: &[u32]) -> Vec<f32> {
    let model = Model::open_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    model.forward(&mut model.new_session(), ids, Logits::All).unwrap()
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 398).collect()
}

#[test]
fn the_indexer_selection_decides() {
    let ids = ids(48);
    let sparse = logits(&fixture(), &ids);
    let dense = logits(
        &variant("dense", |c| {
            c.insert("index_topk".into(), 64.into());
        }),
        &ids,
    );
    let vocab = sparse.len() / ids.len();
    // Positions 0..=14 see at most 3 compressed entries (rate 4): the top 3 keep them all.
    let early = 15 * vocab;
    assert!(sparse[..early].iter().zip(&dense[..early]).all(|(a, b)| a.to_bits() == b.to_bits()));
    let worst = sparse[early..].iter().zip(&dense[early..]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst > 0.05, "the indexer's choice changed nothing ({worst})");
}

#[test]
fn the_state_is_bounded() {
    let model = Model::open_dir(&fixture()).unwrap();
    let all = ids(256);
    let mut s = model.new_session();
    model.forward(&mut s, &all[..128], Logits::Last).unwrap();
    let at_128 = s.v4.as_ref().unwrap().floats();
    for (k, &id) in all[128..].iter().enumerate() {
        model.forward(&mut s, &[id], Logits::Last).unwrap();
        // What `coli bench` prices 1k / 8k / 32k contexts with is what the state holds,
        // at every position (through every window and compression boundary).
        let held = 4 * s.v4.as_ref().unwrap().floats();
        assert_eq!(model.kv_cache_bytes_at(129 + k), held, "after {} positions", 129 + k);
    }
    let st = s.v4.as_ref().unwrap();
    // 128 more positions: 32 entries of head_dim 16 on each CSA layer (1 and 3) with the
    // indexer's 32 of 12, and 16 entries of 16 on the HCA layer (2); nothing else grows.
    assert_eq!(st.floats() - at_128, 32 * 16 * 2 + 32 * 12 * 2 + 16 * 16);
    for l in &st.layers {
        assert!(l.window.len() <= 5 * 16, "the window keeps sliding_window - 1 keys");
        assert!(l.comp.buf_kv.len() < 8 * 32 && l.index.buf_kv.len() < 4 * 24);
    }
    // A full cache of 256 keys on 4 layers would hold 256 * 16 * 4 floats.
    assert!(st.floats() < 256 * 16 * 4 / 2, "{}", st.floats());
    assert_eq!(model.cfg.kv_cache_bytes_per_token(), 2 * 4 * (16 + 12) / 4 + 4 * 16 / 8);
}

#[test]
fn hash_layers_use_the_tid2eid_experts() {
    let model = Model::open_dir(&fixture()).unwrap();
    let table = model.v4.as_ref().unwrap().layers[0].tid2eid.clone().expect("layer 0 is hash_moe");
    assert!(model.v4.as_ref().unwrap().layers[2].tid2eid.is_none(), "layer 2 is a learned router");
    let k = model.cfg.router.top_k;
    for id in [5u32, 77, 300] {
        let mut used = Vec::new();
        model
            .forward_with(&mut model.new_session(), &[id], Logits::Last, &mut |l, e, _| {
                if l == 0 {
                    used.push(e as u32)
                }
            })
            .unwrap();
        let mut want = table[id as usize * k..(id as usize + 1) * k].to_vec();
        want.sort_unstable();
        assert_eq!(used, want, "token {id}");
    }
}

/// A conversation written to a cache file turn by turn (a record per turn, as the helper
/// appends them) and read back holds the very state kept in memory, and continues with
/// the same bits; the file of another layout is refused.
#[test]
fn a_restart_continues_bit_identically() {
    let model = Model::open_dir(&fixture()).unwrap();
    let all = ids(40);
    let mut s = model.new_session();
    // Turns that end inside compression windows (13) and on their boundaries (16).
    model.forward(&mut s, &all[..13], Logits::All).unwrap();
    let mut bytes = kv::encode(&s, "fp").unwrap();
    model.forward(&mut s, &all[13..16], Logits::All).unwrap();
    bytes.extend(kv::encode_record(&s, "fp", 13).unwrap());
    model.forward(&mut s, &all[16..21], Logits::All).unwrap();
    bytes.extend(kv::encode_record(&s, "fp", 16).unwrap());
    let mut back = kv::decode(&bytes, "fp", &model.cfg).unwrap();
    assert_eq!(back.tokens, s.tokens);
    assert_eq!(back.v4, s.v4, "the state read back is the one kept in memory");
    assert_eq!(back.cached_len(), 21, "nothing to feed again");
    let mut read = |at: u64, buf: &mut [u8]| {
        buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
        Ok(())
    };
    assert_eq!(kv::scan(&mut read, bytes.len() as u64, 1 << 20).unwrap().header.tokens, s.tokens);
    let got = model.forward(&mut back, &all[21..], Logits::All).unwrap();
    let want = model.forward(&mut s, &all[21..], Logits::All).unwrap();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    // A cut-off file and another model's layout are refused.
    assert!(kv::decode(&bytes[..bytes.len() - 9], "fp", &model.cfg).is_err());
    let other = Model::open_dir(&variant("window", |c| {
        c.insert("sliding_window".into(), 7.into());
    }))
    .unwrap();
    let e = kv::decode(&bytes, "fp", &other.cfg).err().expect("refused").to_string();
    assert!(e.contains("layout"), "{e}");
}

/// Routed experts read from the files when used (a streamed checkpoint) give the bits of
/// the checkpoint read whole, in a prefill and in decode steps, whatever the budget: none
/// (every expert read when used, nothing ahead), three experts, all of them. With a budget
/// the hash layers' experts are read ahead on reader threads (`ExpertSource::known`) and
/// taken by the MoE (`prefetched_hits`); without, none is.
#[test]
fn streamed_experts_give_the_same_bits() {
    use colibri_engine::format::tensors::TensorStore;
    use colibri_engine::model::config::ModelConfig;
    let whole = Model::open_dir(&fixture()).unwrap();
    let ids = ids(40);
    let run = |m: &Model| {
        let mut s = m.new_session();
        let mut out = m.forward(&mut s, &ids[..30], Logits::All).unwrap();
        for id in &ids[30..] {
            out.extend(m.forward(&mut s, &[*id], Logits::Last).unwrap());
        }
        out
    };
    let want = run(&whole);
    let expert = 3 * 16 * 48 * 2;
    for budget in [0, 3 * expert, 1 << 30] {
        let cfg = ModelConfig::from_json_bytes(&std::fs::read(fixture().join("config.json")).unwrap()).unwrap();
        let store = TensorStore::open_dir_unread(&fixture()).unwrap();
        assert!(store.reader().is_some(), "every tensor left in the file");
        let streamed = Model::from_store_with(cfg, &store, budget as u64).unwrap();
        let got = run(&streamed);
        assert!(want.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()), "budget {budget}: logits differ");
        let st = streamed.experts.cache_stats().unwrap();
        if budget == 0 {
            assert_eq!((st.lookahead.known, st.prefetched_hits), (0, 0), "{st:?}");
        } else {
            assert!(st.lookahead.known > 0 && st.prefetched_hits > 0, "budget {budget}: {st:?}");
            assert!(st.prefetched_hits <= st.lookahead.known, "{st:?}");
        }
    }
}

/// A conversation's state goes back only to a snapshot: where a multi-token pass began
/// and where one ended. A prompt that shares a prefix beyond one keeps up to it
/// ([`colibri_engine::generate::keepable`]), one that shares less than the first keeps
/// nothing, one that extends the session keeps all of it; a speculative pass's rejected
/// drafts go back to its start. Every case gives a fresh run's bits.
#[test]
fn a_shared_prefix_is_kept_up_to_a_snapshot() {
    use colibri_engine::generate::{keepable, reuse};
    let model = Model::open_dir(&fixture()).unwrap();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let fresh = |ids: &[u32]| bits(model.forward(&mut model.new_session(), ids, Logits::Last).unwrap());
    // A prompt of 19 (inside compression windows of 4 and 8), then three decode steps:
    // snapshots where the prompt ended (19) and nowhere else.
    let mut held = ids(19);
    let mut s = model.new_session();
    model.forward(&mut s, &held, Logits::Last).unwrap();
    for id in [7, 8, 9] {
        model.forward(&mut s, &[id], Logits::Last).unwrap();
        held.push(id);
    }
    let mut longer = held.clone();
    longer.extend(ids(3));
    assert_eq!(keepable(&s, &longer), held.len(), "an extension keeps everything");
    let mut branch = held[..21].to_vec();
    branch.extend([5, 9, 2]);
    assert_eq!(keepable(&s, &branch), 19, "back to where the prompt ended");
    let mut copy = s.clone();
    assert_eq!(reuse(&mut copy, &branch), 19);
    assert_eq!(copy.cached_len(), 19);
    assert_eq!(bits(model.forward(&mut copy, &branch[19..], Logits::Last).unwrap()), fresh(&branch));
    let mut early = held[..12].to_vec();
    early.extend([5, 9, 2]);
    assert_eq!(keepable(&s, &early), 0, "before any snapshot: nothing is kept");
    assert_eq!(reuse(&mut s, &early), 0);
    assert_eq!(bits(model.forward(&mut s, &early, Logits::Last).unwrap()), fresh(&early));

    // A speculative pass of five drafts, two kept: back to the pass's start (a snapshot)
    // and those two fed again, with the bits of a run that never drafted.
    let mut spec = model.new_session();
    let prompt = ids(17);
    model.forward(&mut spec, &prompt, Logits::Last).unwrap();
    model.forward(&mut spec, &[4], Logits::Last).unwrap();
    model.forward(&mut spec, &[11, 12, 13, 14, 15], Logits::All).unwrap();
    spec.truncate(20);
    assert_eq!(spec.cached_len(), 18, "the speculative pass's start");
    let got = bits(model.forward(&mut spec, &[30], Logits::Last).unwrap());
    let mut plain = prompt.clone();
    plain.extend([4, 11, 12, 30]);
    assert_eq!(got, fresh(&plain));

    // Every slot filled (a pinned snapshot, two kept, a verify pass's): the bytes stay
    // inside the bound a request's admission counts on.
    spec.pin_snapshot(spec.len());
    model.forward(&mut spec, &ids(5), Logits::Last).unwrap();
    model.forward(&mut spec, &ids(6), Logits::Last).unwrap();
    model.forward(&mut spec, &[3, 4, 5], Logits::All).unwrap();
    model.forward(&mut spec, &[6, 7], Logits::All).unwrap();
    let (n, bytes) = (spec.len(), spec.snapshot_bytes());
    assert_eq!(spec.cached_len(), n);
    let bound = model.snapshot_bytes_bound(n);
    assert!(bytes <= bound && 2 * bytes > bound, "{bytes} of {bound} at {n}");
}
