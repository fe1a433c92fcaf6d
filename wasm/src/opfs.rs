//! The persistent browser tier: experts kept in the Origin Private File System through
//! synchronous access handles (dedicated workers only). Two files per model:
//! `experts.bin`, the expert bytes, and `index.bin`, one little-endian u64 per expert
//! (0 = absent, else 1 + its offset in experts.bin). The ranges of evicted experts are
//! reused ([`Extents`]) and a freed tail is cut off the file. An entry is cleared before
//! its range is reused and written only after the new bytes are flushed, and every read
//! is checksummed by the caller, so a torn write is never trusted: the expert is fetched
//! again.

use js_sys::Promise;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    FileSystemDirectoryHandle, FileSystemFileHandle, FileSystemGetDirectoryOptions, FileSystemGetFileOptions,
    FileSystemReadWriteOptions, FileSystemSyncAccessHandle, WorkerNavigator,
};

use crate::budget::Extents;
use crate::net::{js_err, scope};

pub struct Opfs {
    data: FileSystemSyncAccessHandle,
    index: FileSystemSyncAccessHandle,
    slots: Vec<u64>,
    /// (expert) -> its bytes
    lens: Vec<u64>,
    space: Extents,
}

async fn wait<T: JsCast>(p: Promise) -> Result<T, String> {
    JsFuture::from(p).await.map_err(js_err)?.dyn_into::<T>().map_err(|_| "unexpected OPFS object".to_string())
}

pub(crate) fn at(offset: u64) -> FileSystemReadWriteOptions {
    let o = FileSystemReadWriteOptions::new();
    o.set_at(offset as f64);
    o
}

fn navigator() -> Result<WorkerNavigator, String> {
    Ok(scope()?.navigator())
}

/// Whether the browser has granted persistent storage to this origin (asked for by the
/// page, with the user's consent: `navigator.storage.persist()`).
pub async fn persisted() -> bool {
    let Ok(nav) = navigator() else { return false };
    match nav.storage().persisted() {
        Ok(p) => JsFuture::from(p).await.ok().and_then(|v| v.as_bool()).unwrap_or(false),
        Err(_) => false,
    }
}

/// (usage, quota) in bytes, if the browser says.
pub async fn estimate() -> Option<(f64, f64)> {
    let p = navigator().ok()?.storage().estimate().ok()?;
    let v: JsValue = JsFuture::from(p).await.ok()?;
    let get = |k: &str| js_sys::Reflect::get(&v, &k.into()).ok().and_then(|x| x.as_f64());
    Some((get("usage")?, get("quota")?))
}

/// A sync access handle is exclusive: after a reload the previous page's worker may hold
/// it for a moment longer, so keep asking, `tries` times 100 ms. (Another tab using the
/// same model keeps it; then this tab runs on the RAM tier.)
pub(crate) async fn exclusive(h: &FileSystemFileHandle, tries: u32) -> Result<FileSystemSyncAccessHandle, String> {
    let mut last = String::new();
    for _ in 0..tries {
        match wait::<FileSystemSyncAccessHandle>(h.create_sync_access_handle()).await {
            Ok(x) => return Ok(x),
            Err(e) => last = e,
        }
        crate::net::sleep(100).await;
    }
    Err(format!("{IN_USE} ({last})"))
}

/// Starts the error of an OPFS tier whose files another tab or window holds open (OPFS
/// exists here; falling back to IndexedDB would only store every expert twice).
pub const IN_USE: &str = "another colibri tab or window is using this model's browser storage";

/// Why [`Opfs::open`] failed: another tab or window holds the files (its message starts
/// with [`IN_USE`]), or anything else. Told apart by the variant, never by the text.
pub enum OpenFail {
    InUse(String),
    Other(String),
}

impl From<String> for OpenFail {
    fn from(e: String) -> Self {
        OpenFail::Other(e)
    }
}

impl OpenFail {
    pub fn message(self) -> String {
        match self {
            OpenFail::InUse(m) | OpenFail::Other(m) => m,
        }
    }
}

/// The directory of one model version's files, `colibri/<name>/` (created).
pub(crate) async fn model_dir(name: &str) -> Result<FileSystemDirectoryHandle, String> {
    let root: FileSystemDirectoryHandle = wait(navigator()?.storage().get_directory()).await?;
    let dopts = FileSystemGetDirectoryOptions::new();
    dopts.set_create(true);
    let top: FileSystemDirectoryHandle = wait(root.get_directory_handle_with_options("colibri", &dopts)).await?;
    wait(top.get_directory_handle_with_options(name, &dopts)).await
}

/// The file `name` of `dir` (created).
pub(crate) async fn file_handle(dir: &FileSystemDirectoryHandle, name: &str) -> Result<FileSystemFileHandle, String> {
    let fopts = FileSystemGetFileOptions::new();
    fopts.set_create(true);
    wait(dir.get_file_handle_with_options(name, &fopts)).await
}

impl Opfs {
    /// Opens (creating) `colibri/<name>/` for experts of `lens` bytes each.
    pub async fn open(name: &str, lens: &[u64]) -> Result<Opfs, OpenFail> {
        let n_experts = lens.len();
        let dir = model_dir(name).await?;
        let data_h = file_handle(&dir, "experts.bin").await?;
        let index_h = file_handle(&dir, "index.bin").await?;
        let data: FileSystemSyncAccessHandle = exclusive(&data_h, 30).await.map_err(OpenFail::InUse)?;
        let index: FileSystemSyncAccessHandle = match exclusive(&index_h, 30).await {
            Ok(h) => h,
            Err(e) => {
                data.close();
                return Err(OpenFail::InUse(e));
            }
        };
        let mut raw = vec![0u8; n_experts * 8];
        let got = index.read_with_u8_array_and_options(&mut raw, &at(0)).map_err(js_err)? as usize;
        let n = raw.len();
        raw[got.min(n)..].iter_mut().for_each(|b| *b = 0);
        let mut slots: Vec<u64> =
            raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        // An entry past the end of the file (a torn write) is dropped here; one that
        // overlaps another is caught by the checksum of the read.
        let size = data.get_size().map_err(js_err)? as u64;
        for (s, &len) in slots.iter_mut().zip(lens) {
            if *s != 0 && *s - 1 + len > size {
                *s = 0;
            }
        }
        let used: Vec<(u64, u64)> =
            slots.iter().zip(lens).filter(|(s, _)| **s != 0).map(|(s, &l)| (s - 1, l)).collect();
        let space = Extents::from_used(&used);
        Ok(Opfs { data, index, slots, lens: lens.to_vec(), space })
    }

    /// One flag per expert: stored on disk.
    pub fn mask(&self) -> Vec<bool> {
        self.slots.iter().map(|&s| s != 0).collect()
    }

    /// Whether expert `expert` is stored.
    pub fn holds(&self, expert: usize) -> bool {
        self.slots.get(expert).is_some_and(|&s| s != 0)
    }

    /// Number of experts stored.
    pub fn count(&self) -> usize {
        self.slots.iter().filter(|&&s| s != 0).count()
    }

    /// Reads expert `expert` into `buf`; false if absent or short.
    pub fn read(&self, expert: usize, buf: &mut [u8]) -> bool {
        let Some(&slot) = self.slots.get(expert).filter(|&&s| s != 0) else { return false };
        matches!(self.data.read_with_u8_array_and_options(buf, &at(slot - 1)), Ok(n) if n as usize == buf.len())
    }

    /// Bytes of the expert file (stored experts and the free ranges between them).
    pub fn file_bytes(&self) -> u64 {
        self.space.end()
    }

    /// Writes the (verified) bytes of `expert` into free space and records them in the index.
    pub fn write(&mut self, expert: usize, bytes: &[u8]) -> Result<(), String> {
        if self.lens.get(expert) != Some(&(bytes.len() as u64)) {
            return Err(format!("expert slot {expert} out of range or of another size"));
        }
        if self.slots[expert] != 0 {
            return Ok(());
        }
        let off = self.space.alloc(bytes.len() as u64);
        let n = match self.data.write_with_u8_array_and_options(bytes, &at(off)) {
            Ok(n) => n as usize,
            Err(e) => {
                self.space.release(off, bytes.len() as u64);
                return Err(js_err(e));
            }
        };
        if n != bytes.len() {
            self.space.release(off, bytes.len() as u64);
            return Err("short write to OPFS (storage full?)".into());
        }
        self.data.flush().map_err(js_err)?;
        self.set_slot(expert, off + 1)
    }

    /// Drops an entry (evicted, or its bytes failed their checksum); its range is free.
    pub fn forget(&mut self, expert: usize) -> Result<(), String> {
        let Some(&slot) = self.slots.get(expert).filter(|&&s| s != 0) else { return Ok(()) };
        self.set_slot(expert, 0)?;
        let end = self.space.end();
        self.space.release(slot - 1, self.lens[expert]);
        if self.space.end() < end {
            self.data.truncate_with_f64(self.space.end() as f64).map_err(js_err)?;
        }
        Ok(())
    }

    fn set_slot(&mut self, expert: usize, v: u64) -> Result<(), String> {
        self.index.write_with_u8_array_and_options(&v.to_le_bytes(), &at(expert as u64 * 8)).map_err(js_err)?;
        self.index.flush().map_err(js_err)?;
        self.slots[expert] = v;
        Ok(())
    }

    pub fn close(&self) {
        self.data.close();
        self.index.close();
    }
}
