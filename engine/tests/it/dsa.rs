//! DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa) beyond the transformers fixtures
//! (transformers_fixtures.rs checks their logits and greedy tokens):
//! - with `index_topk` at least the context, DSA is plain MLA, bit for bit (the same
//!   checkpoint read as deepseek_v3, its indexer weights unused);
//! - at the fixtures' `index_topk` (6) the selection decides: the positions that see at
//!   most 6 keep every bit of plain MLA, the later ones differ.

use std::path::{Path, PathBuf};

use colibri_engine::{Logits, Model};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// A copy of fixture `name` whose config.json `edit` changes.
fn variant(name: &str, tag: &str, edit: impl Fn(&mut serde_json::Map<String, Value>)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("colibri-dsa-{}-{name}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
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
    let mut s = model.new_session();
    model.forward(&mut s, ids, Logits::All).unwrap()
}

/// The same weights as plain MLA: deepseek_v3 without the DSA fields.
fn as_mla(name: &str, tag: &str) -> PathBuf {
    variant(name, tag, |c| {
        c.insert("model_type".into(), "deepseek_v3".into());
        for k in ["index_topk", "index_n_heads", "index_head_dim", "indexer_types", "layer_types", "mlp_layer_types"] {
            c.remove(k);
        }
    })
}

#[test]
fn dsa_covering_the_context_is_plain_mla() {
    for name in ["deepseek_v32", "glm_moe_dsa"] {
        let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 300).collect();
        let dense = variant(name, "dense", |c| {
            c.insert("index_topk".into(), 64.into());
        });
        let (a, b) = (logits(&dense, &ids), logits(&as_mla(name, "mla-a"), &ids));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: index_topk 64 is not plain MLA");
    }
}

#[test]
fn the_selection_decides_past_index_topk() {
    for name in ["deepseek_v32", "glm_moe_dsa"] {
        let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 300).collect();
        let (sparse, mla) = (logits(&fixture(name), &ids), logits(&as_mla(name, "mla-b"), &ids));
        let vocab = sparse.len() / ids.len();
        // Positions 0..=5 see at most index_topk (6) positions: everything is kept.
        let early = 6 * vocab;
        assert!(sparse[..early].iter().zip(&mla[..early]).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}");
        // Later positions attend to 6 of their keys only.
        let worst = sparse[early..].iter().zip(&mla[early..]).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst > 0.1, "{name}: the sparse selection changed nothing ({worst})");
    }
}

#[test]
fn a_shared_first_layer_is_refused() {
    let dir = variant("glm_moe_dsa", "shared0", |c| {
        c.insert("indexer_types".into(), serde_json::json!(["shared", "full", "full"]));
    });
    let err = Model::open_dir(&dir).err().expect("refused").to_string();
    assert!(err.contains("shared"), "{err}");
}
