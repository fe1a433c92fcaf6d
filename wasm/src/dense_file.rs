//! The browser's copy of a model's dense weights, so that a reload does not fetch them
//! again: `colibri/<model>-<fingerprint>/dense.bin` in OPFS, beside the expert tier's
//! files. It holds the data file's dense region byte for byte (file offset 0 = the
//! region's first byte), then a 16-byte seal: `SEAL_MAGIC` and the region's length
//! (little-endian). The seal is written only after every dense tensor's bytes were written
//! (downloaded first, or as the load read them: crate::dense::DenseSource) and flushed,
//! during a load whose checksums all passed; a file without it (a load cut
//! short, a full quota) is emptied and written again by the next load. A sealed file is
//! still read through the checksums: one that fails them is emptied and the load reads the
//! network instead (`crate::dense::DenseSource`).
//!
//! The file is open only while a model loads (OPFS sync access handles are exclusive), so
//! it needs no Web Lock: a tab that loads the same model at that very moment reads the
//! network. The expert tier's budget counts it (wasm/src/engine/tiers.rs).

use js_sys::Uint8Array;
use wasm_bindgen_futures::JsFuture;
use web_sys::FileSystemSyncAccessHandle;

use crate::net::js_err;
use crate::opfs::{at, exclusive, file_handle, model_dir};

const NAME: &str = "dense.bin";
const SEAL_MAGIC: &[u8; 8] = b"colidens";
/// Bytes the seal adds to the file.
pub const SEAL_BYTES: u64 = 16;

pub struct DenseFile {
    h: FileSystemSyncAccessHandle,
    len: u64,
    sealed: bool,
}

fn seal(len: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(SEAL_MAGIC);
    s[8..].copy_from_slice(&len.to_le_bytes());
    s
}

impl DenseFile {
    /// Opens (creating) the dense file of the model stored as `name` for a dense region
    /// of `len` bytes: sealed for that length, or emptied to be written.
    pub async fn open(name: &str, len: u64) -> Result<DenseFile, String> {
        let fh = file_handle(&model_dir(name).await?, NAME).await?;
        // Held a moment longer by a page just reloaded, or by a tab loading this model now.
        let h = exclusive(&fh, 10).await?;
        let mut f = DenseFile { h, len, sealed: false };
        let size = f.h.get_size().map_err(js_err)? as u64;
        if size == len + SEAL_BYTES {
            let mut s = [0u8; 16];
            f.sealed = f.read(len, &mut s).is_ok() && s == seal(len);
        }
        if !f.sealed && size > 0 {
            f.empty()?;
        }
        Ok(f)
    }

    /// Removes the model's dense file (it no longer fits the budget); best effort.
    pub async fn remove(name: &str) {
        if let Ok(dir) = model_dir(name).await {
            let _ = JsFuture::from(dir.remove_entry(NAME)).await;
        }
    }

    /// Whether the file holds the whole region (its seal checked at open).
    pub fn sealed(&self) -> bool {
        self.sealed
    }

    /// Reads `buf.len()` bytes at offset `off` of the region.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        match self.h.read_with_u8_array_and_options(buf, &at(off)) {
            Ok(n) if n as usize == buf.len() => Ok(()),
            Ok(n) => Err(format!("short read from OPFS ({n} of {} bytes at {off})", buf.len())),
            Err(e) => Err(js_err(e)),
        }
    }

    /// Writes `bytes` at offset `off` of the region (an unsealed file only).
    pub fn write(&self, off: u64, bytes: &[u8]) -> Result<(), String> {
        if self.sealed || off + bytes.len() as u64 > self.len {
            return Err(format!("dense file: no write of {} bytes at {off} of {}", bytes.len(), self.len));
        }
        match self.h.write_with_u8_array_and_options(bytes, &at(off)) {
            Ok(n) if n as usize == bytes.len() => Ok(()),
            Ok(_) => Err("short write to OPFS (storage full?)".into()),
            Err(e) => Err(js_err(e)),
        }
    }

    /// Writes `bytes` (in JavaScript memory: a response body) at offset `off` of the region.
    pub fn write_js(&self, off: u64, bytes: &Uint8Array) -> Result<(), String> {
        let n = bytes.length() as u64;
        if self.sealed || off + n > self.len {
            return Err(format!("dense file: no write of {n} bytes at {off} of {}", self.len));
        }
        match self.h.write_with_js_u8_array_and_options(bytes, &at(off)) {
            Ok(w) if w as u64 == n => Ok(()),
            Ok(_) => Err("short write to OPFS (storage full?)".into()),
            Err(e) => Err(js_err(e)),
        }
    }

    /// Marks the file complete: flushes what was written, then writes and flushes the seal.
    pub fn seal(&mut self) -> Result<(), String> {
        self.h.flush().map_err(js_err)?;
        let s = seal(self.len);
        match self.h.write_with_u8_array_and_options(&s, &at(self.len)) {
            Ok(n) if n as u64 == SEAL_BYTES => {}
            Ok(_) => return Err("short write to OPFS (storage full?)".into()),
            Err(e) => return Err(js_err(e)),
        }
        self.h.flush().map_err(js_err)?;
        self.sealed = true;
        Ok(())
    }

    /// Empties the file (its bytes are not to be trusted, or it is to be written anew).
    pub fn empty(&mut self) -> Result<(), String> {
        self.sealed = false;
        self.h.truncate_with_f64(0.0).map_err(js_err)?;
        self.h.flush().map_err(js_err)
    }
}

impl Drop for DenseFile {
    fn drop(&mut self) {
        self.h.close();
    }
}
