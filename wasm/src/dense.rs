//! The dense weights' way into the browser engine: from the network (the helper or a
//! static host, HTTP Range requests) or from the browser's own copy in OPFS
//! ([`DenseFile`], downloaded into it first, or written as the network's bytes go by),
//! fetched whole into wasm memory
//! for the CPU backend, or streamed into GPU buffers for the WebGPU backend
//! (colibri_engine::gpu::stream), one bounded chunk at a time.

use std::cell::{Cell, RefCell};

use colibri_engine::format::manifest::Manifest;
use colibri_engine::{Error, Result};
use js_sys::{ArrayBuffer, Function, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use web_sys::{XmlHttpRequest, XmlHttpRequestResponseType};

use crate::budget::Covered;
use crate::dense_file::{DenseFile, SEAL_BYTES};
use crate::net::{fetch, fetch_pipelined, js_err};

/// Largest read of [`DenseSource::whole`].
const CHUNK: u64 = 8 << 20;
/// [`DenseSource::fill`]'s ranges, and how many are under way at once. Chromium moved
/// loopback ranges of 32 MiB two at a time at about 3x the speed of one 8 MiB range at a
/// time (354 against 122 MB/s here; 4 x 16 MiB: 244).
const FILL_CHUNK: u64 = 32 << 20;
const FILL_IN_FLIGHT: usize = 2;

/// Calls the page's progress callback with {phase, loaded, total}.
pub fn report(cb: &Option<Function>, phase: &str, loaded: f64, total: f64) {
    if let Some(f) = cb {
        let o = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&o, &"phase".into(), &phase.into());
        let _ = js_sys::Reflect::set(&o, &"loaded".into(), &loaded.into());
        let _ = js_sys::Reflect::set(&o, &"total".into(), &total.into());
        let _ = f.call1(&JsValue::NULL, &o);
    }
}

/// Where a load's dense weights came from (`stats().dense`).
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DenseStats {
    /// "opfs" (the browser's copy) or "network".
    pub from: &'static str,
    /// Bytes of them fetched from the network by this load.
    pub fetched_bytes: u64,
    /// Bytes the browser's copy takes now (0: none kept).
    pub stored_bytes: u64,
    /// Why no copy is kept (or why the stored one was not used), if so.
    pub error: Option<String>,
}

/// The dense region of a model's data file at `url`: read from the sealed [`DenseFile`]
/// when there is one, else downloaded into the file first ([`DenseSource::fill`]) and read
/// from there, else from the network with every network byte also written to the file
/// (sealed by [`DenseSource::finish`] once the load checked every tensor).
pub struct DenseSource {
    url: String,
    /// The region: its offset in the data file and its length.
    offset: u64,
    len: u64,
    /// Each dense tensor's range, as offsets in the region.
    tensors: Vec<(u64, u64)>,
    file: RefCell<Option<DenseFile>>,
    /// Ranges of the region written to the file so far (sorted, merged).
    written: RefCell<Covered>,
    fetched: Cell<u64>,
    error: RefCell<Option<String>>,
    /// The file came sealed (this load's bytes are the stored copy's).
    came_sealed: Cell<bool>,
    /// This load downloaded the whole region into the (unsealed) file: reads come from it.
    filled: Cell<bool>,
}

impl DenseSource {
    /// `file`: the model's dense file, or why there is none.
    pub fn new(url: String, m: &Manifest, file: std::result::Result<DenseFile, Option<String>>) -> Self {
        let d = &m.dense;
        let (file, error) = match file {
            Ok(f) => (Some(f), None),
            Err(e) => (None, e),
        };
        let came_sealed = file.as_ref().is_some_and(|f| f.sealed());
        DenseSource {
            url,
            offset: d.offset,
            len: d.length,
            tensors: d.tensors.iter().map(|t| (t.offset - d.offset, t.offset - d.offset + t.length)).collect(),
            file: RefCell::new(file),
            written: RefCell::new(Covered::default()),
            fetched: Cell::new(0),
            error: RefCell::new(error),
            came_sealed: Cell::new(came_sealed),
            filled: Cell::new(false),
        }
    }

    /// The data file's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether reads come from the browser's copy (sealed, or filled by this load).
    pub fn reads_stored(&self) -> bool {
        self.file.borrow().as_ref().is_some_and(|f| f.sealed() || self.filled.get())
    }

    /// Drops the file (emptied: it takes no space), saying why.
    fn give_up(&self, why: String) {
        if let Some(mut f) = self.file.borrow_mut().take() {
            let _ = f.empty();
        }
        self.came_sealed.set(false);
        self.filled.set(false);
        *self.error.borrow_mut() = Some(why);
    }

    /// Downloads the whole region into the unsealed file before the load reads it (ranges
    /// of [`FILL_CHUNK`], [`FILL_IN_FLIGHT`] under way at once, each body written from
    /// JavaScript memory straight to the file), with progress (phase "dense"); the load
    /// then reads the file. If that fails the file is emptied and the load fetches as it
    /// reads, writing the file on the way. Nothing to do for a sealed file or none.
    pub async fn fill(&self, on_progress: &Option<Function>) {
        if self.file.borrow().as_ref().is_none_or(|f| f.sealed()) {
            return;
        }
        let (total, base) = (self.len, self.offset);
        let ranges: Vec<(u64, u64)> = (0..total.div_ceil(FILL_CHUNK))
            .map(|i| (base + i * FILL_CHUNK, base + ((i + 1) * FILL_CHUNK).min(total) - 1))
            .collect();
        report(on_progress, "dense", 0.0, total as f64);
        let mut each = |i: usize, body: &js_sys::Uint8Array| -> std::result::Result<(), String> {
            let off = ranges[i].0 - base;
            match self.file.borrow().as_ref() {
                Some(f) => f.write_js(off, body)?,
                None => return Err("the dense file was closed".into()),
            }
            let n = body.length() as u64;
            self.fetched.set(self.fetched.get() + n);
            self.written.borrow_mut().add(off, off + n);
            report(on_progress, "dense", (off + n) as f64, total as f64);
            Ok(())
        };
        match fetch_pipelined(&self.url, &ranges, FILL_IN_FLIGHT, &mut each).await {
            Ok(()) => self.filled.set(true),
            Err(e) => {
                if let Some(f) = self.file.borrow_mut().as_mut() {
                    let _ = f.empty();
                }
                *self.written.borrow_mut() = Covered::default();
                *self.error.borrow_mut() =
                    Some(format!("downloading the dense weights failed ({e}); fetched as they were read"));
            }
        }
    }

    /// Reads `buf.len()` bytes at offset `at` of the data file (inside the dense region).
    pub fn read(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        let inside = at >= self.offset && at + buf.len() as u64 <= self.offset + self.len;
        if inside && self.reads_stored() {
            let got = self.file.borrow().as_ref().map(|f| f.read(at - self.offset, buf));
            match got {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => self.give_up(format!("could not read the stored dense weights: {e}")),
                None => {}
            }
        }
        read_range(&self.url, at, buf)?;
        self.fetched.set(self.fetched.get() + buf.len() as u64);
        if inside {
            self.keep(at - self.offset, buf);
        }
        Ok(())
    }

    /// The whole region in memory, in chunks, with progress (phase "dense").
    pub async fn whole(&self, on_progress: &Option<Function>) -> Result<Vec<u8>> {
        let total = self.len;
        let len =
            usize::try_from(total).map_err(|_| Error::Invalid(format!("{}: dense region too large", self.url)))?;
        let mut dense = Vec::new();
        dense.try_reserve_exact(len).map_err(|_| {
            Error::Invalid(format!("cannot allocate {total} bytes of wasm memory for the dense weights"))
        })?;
        let mut off = 0;
        report(on_progress, "dense", 0.0, total as f64);
        while off < total {
            let end = (off + CHUNK).min(total);
            let n = (end - off) as usize;
            let start = dense.len();
            let mut done = false;
            if self.reads_stored() {
                dense.resize(start + n, 0);
                let got = self.file.borrow().as_ref().map(|f| f.read(off, &mut dense[start..]));
                match got {
                    Some(Ok(())) => done = true,
                    Some(Err(e)) => self.give_up(format!("could not read the stored dense weights: {e}")),
                    None => {}
                }
                if !done {
                    dense.truncate(start);
                }
            }
            if !done {
                let part = fetch(&self.url, Some((self.offset + off, self.offset + end - 1)), 6)
                    .await
                    .map_err(Error::Invalid)?;
                if part.len() != n {
                    return Err(Error::Invalid(format!(
                        "{}: short dense range ({} of {n} bytes)",
                        self.url,
                        part.len()
                    )));
                }
                self.fetched.set(self.fetched.get() + n as u64);
                self.keep(off, &part);
                dense.extend_from_slice(&part);
            }
            off = end;
            report(on_progress, "dense", off as f64, total as f64);
        }
        Ok(dense)
    }

    /// Writes network bytes at region offset `off` into the (unsealed) file.
    fn keep(&self, off: u64, bytes: &[u8]) {
        let r = match self.file.borrow().as_ref() {
            Some(f) if !f.sealed() && !self.filled.get() => f.write(off, bytes),
            _ => return,
        };
        match r {
            Ok(()) => self.written.borrow_mut().add(off, off + bytes.len() as u64),
            Err(e) => self.give_up(format!("the dense weights are not kept in browser storage: {e}")),
        }
    }

    /// The stored copy failed the load's checks (`why`): it is emptied and the next reads
    /// come from the network (and are written again).
    pub fn refetch(&self, why: &str) {
        let emptied = self.file.borrow_mut().as_mut().map(|f| f.empty());
        if let Some(Err(e)) = emptied {
            return self.give_up(format!("the stored dense weights failed ({why}) and could not be emptied: {e}"));
        }
        *self.written.borrow_mut() = Covered::default();
        self.came_sealed.set(false);
        self.filled.set(false);
        *self.error.borrow_mut() = Some(format!("the stored dense weights failed ({why}); fetched them again"));
    }

    /// Ends a load that checked every dense tensor: a file written by it gets the tensors'
    /// bytes it did not read (fetched now) and its seal, then is closed.
    pub fn finish(&self) -> DenseStats {
        let from = if self.came_sealed.get() { "opfs" } else { "network" };
        if self.file.borrow().as_ref().is_some_and(|f| !f.sealed()) {
            if let Err(e) = self.complete() {
                self.give_up(format!("the dense weights are not kept in browser storage: {e}"));
            }
        }
        let stored = match self.file.borrow_mut().take() {
            Some(f) if f.sealed() => self.len + SEAL_BYTES,
            _ => 0,
        };
        DenseStats { from, fetched_bytes: self.fetched.get(), stored_bytes: stored, error: self.error.borrow().clone() }
    }

    fn complete(&self) -> std::result::Result<(), String> {
        let gaps = self.written.borrow().missing(&self.tensors);
        for (s, e) in gaps {
            let mut buf = vec![0u8; (e - s) as usize];
            read_range(&self.url, self.offset + s, &mut buf).map_err(|e| e.to_string())?;
            self.fetched.set(self.fetched.get() + buf.len() as u64);
            self.file.borrow().as_ref().map_or(Ok(()), |f| f.write(s, &buf))?;
        }
        self.file.borrow_mut().as_mut().map_or(Ok(()), |f| f.seal())
    }
}

/// Reads `buf.len()` bytes at `at` of the file at `url` into `buf` with one synchronous
/// range request (the engine's worker may block), straight from the response into
/// `buf`; tried three times.
pub fn read_range(url: &str, at: u64, buf: &mut [u8]) -> Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let mut last = String::new();
    for _ in 0..3 {
        match read_once(url, at, buf) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(Error::Invalid(format!("{url}: could not read the dense weights: {last}")))
}

fn read_once(url: &str, at: u64, buf: &mut [u8]) -> std::result::Result<(), String> {
    let end = at + buf.len() as u64 - 1;
    let xhr = XmlHttpRequest::new().map_err(js_err)?;
    xhr.open_with_async("GET", url, false).map_err(js_err)?;
    xhr.set_request_header("Range", &format!("bytes={at}-{end}")).map_err(js_err)?;
    xhr.set_response_type(XmlHttpRequestResponseType::Arraybuffer);
    xhr.send().map_err(|e| format!("no answer ({})", js_err(e)))?;
    let status = xhr.status().map_err(js_err)?;
    if status != 206 {
        return Err(format!("HTTP {status} for a range request"));
    }
    let cr = xhr.get_response_header("Content-Range").ok().flatten().unwrap_or_default();
    if !cr.starts_with(&format!("bytes {at}-{end}/")) {
        return Err(format!("asked for bytes {at}-{end}, got Content-Range {cr:?}"));
    }
    let body: ArrayBuffer = xhr.response().map_err(js_err)?.dyn_into().map_err(|_| "no body".to_string())?;
    let body = Uint8Array::new(&body);
    if body.length() as usize != buf.len() {
        return Err(format!("short range response ({} of {} bytes)", body.length(), buf.len()));
    }
    body.copy_to(buf);
    Ok(())
}
