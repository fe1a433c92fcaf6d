//! Conversation caches on disk, so that a conversation continues after a restart with
//! nothing prefilled again: `<data dir>/kv/<model fingerprint>/<xxh3 of the first ids>.kv`,
//! one file per conversation in the format of `colibri_engine::model::kv` (checksummed,
//! with the model's fingerprint and the ids). After every turn (`coli serve`, `coli chat`)
//! the turn's positions are appended to the file of the conversation it extends (one
//! record; a new file, written whole, only for a new conversation or a version 1 file);
//! read when a prompt extends a file's ids further than the caches in memory do.
//! Private: directories 0700 and files 0600 whoever creates them (crate::paths), no symlink
//! followed, nothing but regular files opened (a FIFO there would block the reader), and
//! a file's length checked against what its header and records describe before a byte of
//! it is read whole. A stale or corrupt file is ignored with one warning line and
//! removed, never trusted. Bounded by count and bytes; the least recently written go first.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use colibri_engine::format::manifest::{checksum, checksum_hex};
use colibri_engine::generate::reusable;
use colibri_engine::model::config::ModelConfig;
use colibri_engine::model::kv;
use colibri_engine::Session;

pub struct KvStore {
    dir: PathBuf,
    fingerprint: String,
    /// Most files and bytes kept for this model.
    max_files: usize,
    max_bytes: u64,
}

/// Which version of the model in `root` a cache belongs to: the fingerprint of its
/// colibri.json, else (a Hugging Face directory) the xxh3 of config.json with the name,
/// size and modification time of every safetensors file.
pub fn model_fingerprint(root: &Path) -> Option<String> {
    if let Some(f) = crate::usage_store::fingerprint(root) {
        return Some(f);
    }
    let mut data = std::fs::read(root.join("config.json")).ok()?;
    let mut files: Vec<_> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .collect();
    files.sort_by_key(|e| e.file_name());
    for e in files {
        let m = e.metadata().ok()?;
        let mtime = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        data.extend_from_slice(e.file_name().to_string_lossy().as_bytes());
        data.extend_from_slice(&m.len().to_le_bytes());
        data.extend_from_slice(&mtime.map_or(0, |d| d.as_nanos()).to_le_bytes());
    }
    Some(checksum_hex(checksum(&data)))
}

impl KvStore {
    /// The store of the model in `root` under `base` (`<data dir>/kv`); None when the
    /// model has no fingerprint.
    pub fn new(base: &Path, root: &Path, max_files: usize, max_bytes: u64) -> Option<Self> {
        let fingerprint = model_fingerprint(root)?;
        Some(KvStore { dir: base.join(&fingerprint), fingerprint, max_files, max_bytes })
    }

    /// The same model's store for another backend's caches (`tag`, e.g. one GPU
    /// adapter's): a directory and fingerprint of their own, so that neither backend
    /// reads the other's files.
    pub fn for_backend(mut self, tag: &str) -> Self {
        self.fingerprint = format!("{}.{tag}", self.fingerprint);
        self.dir.set_file_name(&self.fingerprint);
        self
    }

    /// [`KvStore::new`] under the data directory's `kv/`.
    pub fn in_data_dir(root: &Path, max_files: usize, max_bytes: u64) -> Option<Self> {
        Self::new(&crate::paths::data_dir()?.join("kv"), root, max_files, max_bytes)
    }

    /// The regular `.kv` files of the directory (what `lstat` says: no symlink, FIFO or
    /// device), with their metadata.
    fn files(&self) -> Vec<(PathBuf, std::fs::Metadata)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        rd.filter_map(|e| e.ok())
            .take(100_000)
            .filter(|e| e.path().extension().is_some_and(|x| x == "kv"))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
            .filter(|(_, m)| m.is_file())
            .collect()
    }

    /// The header and ids of the file at `path` (at most `max_positions` of them), read
    /// with small reads: its length must be what they describe.
    fn scan(path: &Path, max_positions: usize) -> colibri_engine::Result<kv::Scanned> {
        let io = |e: std::io::Error| colibri_engine::Error::Invalid(format!("{}: {e}", path.display()));
        let f = crate::paths::open_private_read(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut read = |at: u64, buf: &mut [u8]| -> colibri_engine::Result<()> {
            use std::io::Seek;
            (&f).seek(std::io::SeekFrom::Start(at)).and_then(|_| (&f).read_exact(buf)).map_err(io)
        };
        kv::scan(&mut read, len, max_positions)
    }

    /// Warns once about a file that cannot be used and removes it.
    fn drop_bad(path: &Path, e: impl std::fmt::Display) {
        eprintln!("coli: warning: ignoring the KV cache file {}: {e}", path.display());
        let _ = std::fs::remove_file(path);
    }

    /// The cache on disk that keeps more of `ids` than `better_than` tokens, checked and
    /// cut back to what `ids` reuses: (session, tokens kept). None when no file does, or
    /// when the one that does holds no more than `better_than` positions once cut back
    /// (`Session::cached_len`: a recurrent state cut inside the file restarts).
    pub fn find(&self, cfg: &ModelConfig, ids: &[u32], better_than: usize) -> Option<(Session, usize)> {
        let mut best: Option<(PathBuf, usize, u64)> = None;
        for (path, m) in self.files() {
            if m.len() > self.max_bytes {
                Self::drop_bad(&path, format!("{} bytes, more than the cache keeps ({})", m.len(), self.max_bytes));
                continue;
            }
            match Self::scan(&path, cfg.max_positions) {
                Ok(sc) if sc.header.fingerprint == self.fingerprint => {
                    let kept = reusable(&sc.header.tokens, ids);
                    if kept > better_than && best.as_ref().is_none_or(|b| kept > b.1) {
                        best = Some((path, kept, sc.len));
                    }
                }
                Ok(_) => Self::drop_bad(&path, "made by another model"),
                Err(e) => Self::drop_bad(&path, e),
            }
        }
        let (path, kept, len) = best?;
        let read = || -> std::io::Result<Vec<u8>> {
            let f = crate::paths::open_private_read(&path)?;
            let mut bytes = Vec::new();
            // Never more than the length just checked against the header, even if the
            // file grew since.
            f.take(len + 1).read_to_end(&mut bytes)?;
            if bytes.len() as u64 != len {
                return Err(std::io::Error::other(format!(
                    "{} bytes instead of {len}: changed while read",
                    bytes.len()
                )));
            }
            Ok(bytes)
        };
        let bytes = match read() {
            Ok(b) => b,
            Err(e) => {
                Self::drop_bad(&path, e);
                return None;
            }
        };
        match kv::decode(&bytes, &self.fingerprint, cfg) {
            Ok(mut s) => {
                s.truncate(kept);
                // A recurrent state (Gated DeltaNet, DeepSeek-V4's compressor) cut inside
                // the file restarts, and the next pass feeds its tokens again: the file is
                // only worth taking if it spares more than the caller already holds.
                (s.cached_len() > better_than).then_some((s, kept))
            }
            Err(e) => {
                Self::drop_bad(&path, e);
                None
            }
        }
    }

    /// Writes `s`: appends its new positions to the file of the conversation it extends,
    /// or writes a new file (atomically: a temporary file renamed); removes the files whose
    /// ids it extends, then the oldest while over a bound. Errors are one warning line.
    pub fn save(&self, s: &Session) {
        self.save_with(s, None)
    }

    /// [`KvStore::save`] of a session whose rows are read on demand (a GPU's, read back):
    /// `shape` has its tokens, shapes and states (its rows may be zeros), and `rows(from)`
    /// gives the session with the real rows of positions `from..`, asked for once the file
    /// it extends (and so `from`) is known. None: `shape` is the whole session.
    pub fn save_with(&self, shape: &Session, rows: Option<&dyn Fn(usize) -> std::io::Result<Session>>) {
        if shape.tokens.is_empty() || self.max_files == 0 || shape.bytes() as u64 > self.max_bytes {
            return;
        }
        if let Err(e) = self.write(shape, rows) {
            eprintln!("coli: warning: could not write the KV cache to {}: {e}", self.dir.display());
        }
    }

    /// The file that `want` (a session's header with its ids) extends by appending: a
    /// version 2 file of the same shape whose ids are a prefix of its ids, whose length is
    /// what its records say, the longest such; (path, its positions).
    fn to_extend(&self, files: &[(PathBuf, std::fs::Metadata)], want: &kv::KvHeader) -> Option<(PathBuf, usize)> {
        let mut best: Option<(PathBuf, usize)> = None;
        for (p, m) in files {
            let Ok(sc) = Self::scan(p, want.tokens.len()) else { continue };
            let h = &sc.header;
            if sc.version == 2
                && sc.len == m.len()
                && h.same_shape(want)
                && want.tokens.starts_with(&h.tokens)
                && best.as_ref().is_none_or(|b| h.tokens.len() > b.1)
            {
                best = Some((p.clone(), h.tokens.len()));
            }
        }
        best
    }

    fn write(&self, s: &Session, rows: Option<&dyn Fn(usize) -> std::io::Result<Session>>) -> std::io::Result<()> {
        let want = kv::header_of(s, &self.fingerprint).map_err(std::io::Error::other)?;
        // Encodes (with `f`) the session with the rows of positions `from..` in it.
        let encode = |from: usize, f: &dyn Fn(&Session) -> colibri_engine::Result<Vec<u8>>| {
            let read;
            let whole = match rows {
                Some(r) => {
                    read = r(from)?;
                    &read
                }
                None => s,
            };
            f(whole).map_err(std::io::Error::other)
        };
        let n = want.tokens.len();
        // `kv/` and the model's directory in it, tightened if an older coli made them 0755.
        if let Some(base) = self.dir.parent() {
            crate::paths::private_dir(base)?;
        }
        crate::paths::private_dir(&self.dir)?;
        let mut files = self.files();
        let path = match self.to_extend(&files, &want) {
            Some((path, held)) => {
                if held < n {
                    let record = encode(held, &|x| kv::encode_record(x, &self.fingerprint, held))?;
                    let mut f = crate::paths::open_private(&path, false)?;
                    f.write_all(&record)?;
                }
                path
            }
            None => {
                let bytes = encode(0, &|x| kv::encode(x, &self.fingerprint))?;
                let ids: Vec<u8> = want.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
                let path = self.dir.join(format!("{}.kv", checksum_hex(checksum(&ids))));
                let tmp = path.with_extension(format!("kv.tmp.{}", std::process::id()));
                let written = crate::paths::open_private(&tmp, true).and_then(|mut f| f.write_all(&bytes));
                if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, &path)) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                path
            }
        };
        files.retain(|(p, _)| {
            let subsumed = *p != path && Self::scan(p, n).is_ok_and(|sc| want.tokens.starts_with(&sc.header.tokens));
            if subsumed {
                let _ = std::fs::remove_file(p);
            }
            !subsumed
        });
        // Newest first (the file just written or appended to is); keep while within both bounds.
        let mut files: Vec<_> = files
            .into_iter()
            .filter(|(p, _)| *p != path)
            .filter_map(|(p, _)| Some((std::fs::symlink_metadata(&p).ok()?, p)))
            .collect();
        files.sort_by_key(|(m, _)| std::cmp::Reverse(m.modified().ok()));
        let mut total = std::fs::metadata(&path).map_or(0, |m| m.len());
        for (i, (m, p)) in files.iter().enumerate() {
            total += m.len();
            if i + 1 >= self.max_files || total > self.max_bytes {
                let _ = std::fs::remove_file(p);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use colibri_engine::Model;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_moe")
    }

    /// A Gated DeltaNet model's file cut inside its recurrent state (files hold no
    /// snapshots) spares nothing: it is taken only when the caller holds nothing better,
    /// and says so (`cached_len` 0 of the kept ids); cut at its end it spares every id.
    #[test]
    fn a_recurrent_state_cut_inside_a_file_is_not_counted_as_kept() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_next");
        let base = std::env::temp_dir().join(format!("coli-kv-store-next-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let model = Model::open_dir(&dir).unwrap();
        let store = KvStore::new(&base, &dir, 4, 1 << 30).unwrap();
        let mut s = model.new_session();
        model.forward(&mut s, &[1, 2, 3, 4, 5, 6], colibri_engine::Logits::Last).unwrap();
        store.save(&s);
        let (whole, kept) = store.find(&model.cfg, &[1, 2, 3, 4, 5, 6, 7], 3).unwrap();
        assert_eq!((kept, whole.cached_len()), (6, 6));
        // Cut after 4 of its 6 ids: the state restarts, 0 positions held.
        assert!(store.find(&model.cfg, &[1, 2, 3, 4, 9], 0).is_none(), "no better than an empty session");
        assert!(store.find(&model.cfg, &[1, 2, 3, 4, 9], 2).is_none(), "no better than 2 held in memory");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_saved_cache_is_found_and_a_bad_one_is_ignored() {
        let base = std::env::temp_dir().join(format!("coli-kv-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let model = Model::open_dir(&fixture()).unwrap();
        let store = KvStore::new(&base, &fixture(), 4, 1 << 30).unwrap();
        let mut s = model.new_session();
        model.forward(&mut s, &[1, 2, 3, 4, 5], colibri_engine::Logits::Last).unwrap();
        store.save(&s);
        let (back, kept) = store.find(&model.cfg, &[1, 2, 3, 4, 5, 6], 0).unwrap();
        assert_eq!((back.tokens.as_slice(), kept), (&[1, 2, 3, 4, 5][..], 5));
        assert_eq!(back.caches[0].k, s.caches[0].k);
        assert!(store.find(&model.cfg, &[1, 2, 3, 4, 5, 6], 5).is_none(), "no better than memory");
        assert!(store.find(&model.cfg, &[9, 9], 0).is_none());
        // A longer conversation replaces the file it extends.
        model.forward(&mut s, &[6, 7], colibri_engine::Logits::Last).unwrap();
        store.save(&s);
        assert_eq!(store.files().len(), 1);
        // A flipped byte, a truncated file, another model: each ignored and removed.
        let path = store.files()[0].0.clone();
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 1;
        for bad in [flipped, good[..good.len() - 100].to_vec()] {
            std::fs::write(&path, &bad).unwrap();
            assert!(store.find(&model.cfg, &[1, 2, 3, 4, 5, 6, 7, 8], 0).is_none());
            assert!(!path.exists(), "a bad file is removed");
        }
        std::fs::write(&path, &good).unwrap();
        let other = KvStore { fingerprint: "0123".into(), ..KvStore::new(&base, &fixture(), 4, 1 << 30).unwrap() };
        assert!(other.find(&model.cfg, &[1, 2, 3, 4, 5, 6, 7, 8], 0).is_none(), "another model's file");
        assert!(!path.exists());
        // Bounded: two files at most.
        let small = KvStore::new(&base, &fixture(), 2, 1 << 30).unwrap();
        for first in [10, 11, 12] {
            let mut s = model.new_session();
            model.forward(&mut s, &[first, 1], colibri_engine::Logits::Last).unwrap();
            small.save(&s);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(small.files().len(), 2);
        assert!(small.find(&model.cfg, &[10, 1, 5], 0).is_none(), "the oldest went");
        assert!(small.find(&model.cfg, &[12, 1, 5], 0).is_some());
        let _ = std::fs::remove_dir_all(&base);
    }
}
