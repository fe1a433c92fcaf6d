//! What a turn writes to the conversation's cache file in browser storage
//! (`colibri_engine::model::kv`, version 2: a header, then one record per turn). The worker
//! wrote the whole file after every generation, so a conversation of 1k positions at
//! OLMoE's shape rewrote 268 MB each turn; now a turn whose ids extend what the file holds
//! appends one record of its new positions, as the helper's `kv_store` does. The file's
//! ids and length are known from this engine's last write or read ([`Held`]); a file of
//! another length (another tab wrote it, a write failed) or a conversation that went
//! another way is rewritten whole. Pure, so its tests run natively.

use colibri_engine::model::{kv, Session};
use colibri_engine::Result;

/// The ids a stored file holds and its length in bytes, as this engine last wrote or read it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Held {
    pub ids: Vec<u32>,
    pub len: u64,
}

/// One save: the bytes to write, whether they go after the file's `len` bytes (else they
/// replace the file), and what the file holds once they are written.
#[derive(Debug)]
pub(crate) struct Save {
    pub bytes: Vec<u8>,
    pub append: bool,
    pub then: Held,
}

/// How many of `ids` (a conversation's cached ids) the file already holds when the
/// conversation extends what it holds (`held`, if the file is still `stored_len` bytes
/// long); 0 when the file must be rewritten whole.
pub(crate) fn held_prefix(held: Option<&Held>, stored_len: u64, ids: &[u32]) -> usize {
    match held {
        Some(h) if h.len == stored_len && !h.ids.is_empty() && ids.starts_with(&h.ids) => h.ids.len(),
        _ => 0,
    }
}

/// What to write for `s` (its model's `fingerprint` as the files carry it) to a file that is
/// `stored_len` bytes long, `held` what this engine knows of it; None: nothing to write (an
/// empty conversation, or the file holds every cached position already). Only the rows of
/// the positions past [`held_prefix`] are read when it appends (a GPU session read back
/// from there on: `GpuModel::session_to_cpu_from`).
pub(crate) fn plan(held: Option<&Held>, stored_len: u64, s: &Session, fingerprint: &str) -> Result<Option<Save>> {
    if s.tokens.is_empty() {
        return Ok(None);
    }
    let ids = &s.tokens[..s.cached_len()];
    let from = held_prefix(held, stored_len, ids);
    if from == ids.len() {
        return Ok(None);
    }
    if from > 0 {
        let bytes = kv::encode_record(s, fingerprint, from)?;
        let then = Held { ids: ids.to_vec(), len: stored_len + bytes.len() as u64 };
        return Ok(Some(Save { bytes, append: true, then }));
    }
    let bytes = kv::encode(s, fingerprint)?;
    let then = Held { ids: ids.to_vec(), len: bytes.len() as u64 };
    Ok(Some(Save { bytes, append: false, then }))
}

/// What a file that was read back whole (`bytes`, decoded as `s`) holds.
pub(crate) fn read_back(s: &Session, bytes: &[u8]) -> Held {
    Held { ids: s.tokens[..s.cached_len()].to_vec(), len: bytes.len() as u64 }
}

// Natively only: the fixture model is read from disk.
#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use colibri_engine::{Logits, Model};

    /// Turn by turn a file grows by one record each, reads back as the whole conversation
    /// (caches, a Gated DeltaNet layer's recurrent state, DeepSeek-V4's state), and equals
    /// the file written whole; a file of another length, a cut conversation or nothing known
    /// is rewritten whole; nothing new writes nothing.
    #[test]
    fn turns_append_records_and_anything_else_rewrites() {
        for fixture in ["qwen3_next", "deepseek_v4"] {
            appends(fixture, false);
        }
        appends("qwen3_moe", true);
    }

    fn appends(fixture: &str, all: bool) {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(fixture);
        let model = Model::open_dir(&dir).unwrap();
        let fp = "abc";
        let mut s = model.new_session();
        assert!(plan(None, 0, &s, fp).unwrap().is_none(), "an empty conversation writes nothing");
        model.forward(&mut s, &[1, 2, 3, 4], Logits::Last).unwrap();
        let first = plan(None, 0, &s, fp).unwrap().unwrap();
        assert!(!first.append);
        let mut file = first.bytes.clone();
        assert!(plan(Some(&first.then), file.len() as u64, &s, fp).unwrap().is_none(), "nothing new");

        model.forward(&mut s, &[5, 6], Logits::Last).unwrap();
        let second = plan(Some(&first.then), file.len() as u64, &s, fp).unwrap().unwrap();
        assert!(second.append, "{fixture}: a turn that extends the file appends");
        file.extend_from_slice(&second.bytes);
        assert_eq!(second.then, Held { ids: vec![1, 2, 3, 4, 5, 6], len: file.len() as u64 });
        let back = kv::decode(&file, fp, &model.cfg).unwrap();
        assert_eq!(back.tokens, s.tokens);
        assert_eq!(back.cached_len(), 6, "{fixture}");
        for (a, b) in back.caches.iter().zip(&s.caches) {
            assert_eq!((&a.k, &a.v), (&b.k, &b.v), "{fixture}");
            let state = |c: &colibri_engine::model::attention::LayerCache| {
                c.recurrent.as_ref().map(|r| (r.pos, r.conv.clone(), r.s.clone()))
            };
            assert_eq!(state(a), state(b), "{fixture}: the recurrent state after the appended record");
        }
        // The next token's logits from the file read back equal those of the session.
        let (mut s2, mut back2) = (s.clone(), back.clone());
        let want = model.forward(&mut s2, &[7], Logits::Last).unwrap();
        let got = model.forward(&mut back2, &[7], Logits::Last).unwrap();
        assert_eq!(got, want, "{fixture}: the conversation continues from the appended file");
        assert_eq!(read_back(&back, &file), second.then);
        if !all {
            return;
        }
        assert!(second.bytes.len() < first.bytes.len() / 2 + 64, "one record of the two new positions");

        // The file is not what this engine last wrote: rewritten whole.
        let other = plan(Some(&second.then), file.len() as u64 + 1, &s, fp).unwrap().unwrap();
        assert!(!other.append);
        assert_eq!(other.bytes, kv::encode(&s, fp).unwrap());
        // A conversation that went another way: rewritten whole.
        let mut cut = model.new_session();
        model.forward(&mut cut, &[1, 2, 9], Logits::Last).unwrap();
        let diverged = plan(Some(&second.then), file.len() as u64, &cut, fp).unwrap().unwrap();
        assert!(!diverged.append);
        assert_eq!(diverged.then.ids, vec![1, 2, 9]);
        // Nothing known (a failed write): rewritten whole.
        assert!(!plan(None, file.len() as u64, &s, fp).unwrap().unwrap().append);
    }
}
