//! Talking to the helper from a dedicated worker: async `fetch` (with retries and
//! backoff) for the manifest, tokenizer and dense weights, and synchronous XHR range
//! requests for experts, which the synchronous engine asks for in the middle of a step.

use js_sys::{ArrayBuffer, Promise, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, RequestInit, Response, WorkerGlobalScope, XmlHttpRequest, XmlHttpRequestResponseType};

use colibri_engine::format::byteranges::{boundary, parse_content_range, parse_multipart, range_len, Part};

pub fn scope() -> Result<WorkerGlobalScope, String> {
    js_sys::global()
        .dyn_into::<WorkerGlobalScope>()
        .map_err(|_| "colibri must run in a dedicated Web Worker".to_string())
}

pub fn js_err(v: JsValue) -> String {
    v.as_string()
        .or_else(|| js_sys::Reflect::get(&v, &"message".into()).ok().and_then(|m| m.as_string()))
        .unwrap_or_else(|| format!("{v:?}"))
}

/// Resolves after `ms` milliseconds.
pub async fn sleep(ms: i32) {
    let p = Promise::new(&mut |resolve, _| {
        if let Ok(s) = scope() {
            let _ = s.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        }
    });
    let _ = JsFuture::from(p).await;
}

/// A request that got no answer the page may read: the server is down, or (a model on
/// another origin) it does not send CORS headers; the browser does not say which.
fn unreachable(url: &str, e: JsValue) -> String {
    format!(
        "{url}: no answer ({}): the helper or the model's server is not reachable, or it does not allow this page's origin (CORS, see docs/hosting.md)",
        js_err(e)
    )
}

/// Starts GET `url` (optionally bytes a..=b): the promise of its Response (the request
/// is under way from now on).
fn start(url: &str, range: Option<(u64, u64)>) -> Result<Promise, String> {
    let init = RequestInit::new();
    init.set_method("GET");
    if let Some((a, b)) = range {
        let h = Headers::new().map_err(js_err)?;
        h.set("Range", &format!("bytes={a}-{b}")).map_err(js_err)?;
        init.set_headers(&h);
    }
    Ok(scope()?.fetch_with_str_and_init(url, &init))
}

/// The body of the request `start` began, checked (status, a range's length); it stays in
/// JavaScript memory.
async fn body(url: &str, range: Option<(u64, u64)>, started: Promise) -> Result<Uint8Array, String> {
    let resp: Response = JsFuture::from(started).await.map_err(|e| unreachable(url, e))?.dyn_into().map_err(js_err)?;
    let status = resp.status();
    let ok = match range {
        Some(_) => status == 206,
        None => status == 200,
    };
    if !ok {
        return Err(format!("{url}: HTTP {status}"));
    }
    let buf: ArrayBuffer =
        JsFuture::from(resp.array_buffer().map_err(js_err)?).await.map_err(js_err)?.dyn_into().map_err(js_err)?;
    let bytes = Uint8Array::new(&buf);
    if let Some((a, b)) = range {
        if bytes.length() as u64 != b - a + 1 {
            return Err(format!("{url}: short range response ({} of {} bytes)", bytes.length(), b - a + 1));
        }
    }
    Ok(bytes)
}

/// GET `url` (optionally bytes a..=b) once.
async fn fetch_once(url: &str, range: Option<(u64, u64)>) -> Result<Vec<u8>, String> {
    Ok(body(url, range, start(url, range)?).await?.to_vec())
}

/// GETs the byte ranges `ranges` (inclusive ends) of `url` with up to `in_flight`
/// requests under way at once, handing each body to `each(i, body)` in order (the bodies
/// stay in JavaScript memory). A range that fails is asked again on its own, with
/// `fetch`'s retries.
pub async fn fetch_pipelined(
    url: &str,
    ranges: &[(u64, u64)],
    in_flight: usize,
    each: &mut dyn FnMut(usize, &Uint8Array) -> Result<(), String>,
) -> Result<(), String> {
    let mut started = std::collections::VecDeque::new();
    for (i, &r) in ranges.iter().enumerate() {
        while started.len() < in_flight.max(1) && i + started.len() < ranges.len() {
            let at = ranges[i + started.len()];
            started.push_back(start(url, Some(at)));
        }
        let first = started.pop_front().unwrap_or_else(|| Err("no request".into()));
        let got = match first {
            Ok(p) => body(url, Some(r), p).await,
            Err(e) => Err(e),
        };
        let got = match got {
            Ok(b) => b,
            Err(_) => Uint8Array::from(&fetch(url, Some(r), 4).await?[..]),
        };
        each(i, &got)?;
    }
    Ok(())
}

/// GET with retries and exponential backoff (the helper may be restarting).
pub async fn fetch(url: &str, range: Option<(u64, u64)>, attempts: u32) -> Result<Vec<u8>, String> {
    let mut delay = 200;
    let mut last = String::new();
    for i in 0..attempts.max(1) {
        match fetch_once(url, range).await {
            Ok(b) => return Ok(b),
            Err(e) => last = e,
        }
        if i + 1 < attempts {
            sleep(delay).await;
            delay = (delay * 2).min(4000);
        }
    }
    Err(last)
}

/// One synchronous request for several byte ranges (inclusive ends). The helper answers
/// a single range with 206 + Content-Range and several with multipart/byteranges.
pub fn xhr_ranges(url: &str, ranges: &[(u64, u64)]) -> Result<Vec<Part>, String> {
    let spec = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect::<Vec<_>>().join(",");
    let xhr = XmlHttpRequest::new().map_err(js_err)?;
    xhr.open_with_async("GET", url, false).map_err(js_err)?;
    xhr.set_request_header("Range", &format!("bytes={spec}")).map_err(js_err)?;
    xhr.set_response_type(XmlHttpRequestResponseType::Arraybuffer);
    xhr.send().map_err(|e| unreachable(url, e))?;
    let status = xhr.status().map_err(js_err)?;
    if status != 206 {
        return Err(format!("{url}: HTTP {status} for a range request"));
    }
    let body: ArrayBuffer = xhr.response().map_err(js_err)?.dyn_into().map_err(|_| format!("{url}: no body"))?;
    let body = Uint8Array::new(&body).to_vec();
    let ctype = xhr.get_response_header("Content-Type").ok().flatten().unwrap_or_default();
    if let Some(b) = boundary(&ctype) {
        return parse_multipart(&body, &b).map_err(|e| format!("{url}: {e}"));
    }
    let cr = xhr.get_response_header("Content-Range").ok().flatten().unwrap_or_default();
    let (a, b, complete) =
        parse_content_range(&cr).ok_or_else(|| format!("{url}: 206 without a valid Content-Range"))?;
    if body.len() as u64 != range_len(a, b) {
        return Err(format!("{url}: short range response ({} of {} bytes)", body.len(), range_len(a, b)));
    }
    Ok(vec![Part { offset: a, data: body, complete }])
}

/// Milliseconds from the worker's `performance.now()` (sub-millisecond, monotonic), or
/// `Date.now()` where there is no `performance`.
pub fn now_ms() -> f64 {
    use wasm_bindgen::JsCast;
    let global = js_sys::global();
    let perf = js_sys::Reflect::get(&global, &"performance".into()).ok().filter(|p| p.is_object());
    perf.and_then(|p| {
        let now = js_sys::Reflect::get(&p, &"now".into()).ok()?.dyn_into::<js_sys::Function>().ok()?;
        now.call0(&p).ok()?.as_f64()
    })
    .unwrap_or_else(js_sys::Date::now)
}
