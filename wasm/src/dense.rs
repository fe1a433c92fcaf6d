//! The dense weights' way into the browser engine: fetched whole into wasm memory for the
//! CPU backend, or streamed from the model's data file straight into GPU buffers for the
//! WebGPU backend (colibri_engine::gpu::stream), one bounded chunk at a time.

use colibri_engine::format::manifest::DenseRegion;
use colibri_engine::{Error, Result};
use js_sys::{ArrayBuffer, Function, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use web_sys::{XmlHttpRequest, XmlHttpRequestResponseType};

use crate::net::{fetch, js_err};

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

/// The dense region of the data file at `url`, in memory: fetched in ranges, each
/// retried on failure, with progress (phase "dense").
pub async fn fetch_dense(url: &str, d: &DenseRegion, on_progress: &Option<Function>) -> Result<Vec<u8>> {
    const CHUNK: u64 = 8 << 20;
    let total = d.length;
    let len = usize::try_from(total).map_err(|_| Error::Invalid(format!("{url}: dense region too large")))?;
    let mut dense = Vec::new();
    dense
        .try_reserve_exact(len)
        .map_err(|_| Error::Invalid(format!("cannot allocate {total} bytes of wasm memory for the dense weights")))?;
    let mut off = 0;
    report(on_progress, "dense", 0.0, total as f64);
    while off < total {
        let end = (off + CHUNK).min(total);
        let part = fetch(url, Some((d.offset + off, d.offset + end - 1)), 6).await.map_err(Error::Invalid)?;
        dense.extend_from_slice(&part);
        off = end;
        report(on_progress, "dense", off as f64, total as f64);
    }
    Ok(dense)
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
