//! The conversation's cache file in browser storage: what to write, whether it was
//! written, adopting one read back.

use colibri_engine::generate::keepable;
use colibri_engine::model::kv;
use js_sys::Promise;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::{borrow, err, Engine, JsFail};
use crate::backend::{Backend, Context};
use crate::kv_file;

#[wasm_bindgen]
impl Engine {
    /// A promise of what to write to the conversation's cache file in browser storage
    /// (`colibri_engine::model::kv`: the ids, every layer's cache, the fingerprint,
    /// checksums), which is `stored_len` bytes long now: `{bytes, append}`, the bytes to
    /// append (one record of the positions since the file's, when the conversation extends
    /// what this engine last wrote or read there: `kv_file`) or to write as the whole file;
    /// undefined when there is nothing to write. The worker then calls `cacheStored`. On
    /// WebGPU the caches are read back from the GPU (`GpuModel::session_to_cpu`); its files
    /// carry the adapter's tag ([`super::cache_tag`]), so neither backend reads the other's.
    #[wasm_bindgen(js_name = exportCache)]
    pub fn export_cache(&self, stored_len: f64) -> Promise {
        let (state, backend, fp) = (self.state.clone(), self.backend.clone(), self.cache_fingerprint.clone());
        future_to_promise(async move {
            let mut st = borrow(&state)?;
            let stored = stored_len.max(0.0) as u64;
            let save = match (&st.cx, &backend) {
                (cx, _) if cx.tokens().is_empty() => None,
                (Context::Cpu(s), _) => kv_file::plan(st.kv_held.as_ref(), stored, s, &fp).map_err(err)?,
                (Context::Gpu(s), Backend::Gpu(g)) => {
                    // Only the rows an appended record holds are read back.
                    let from = kv_file::held_prefix(st.kv_held.as_ref(), stored, &s.tokens[..s.cached_len()]);
                    let s = g.session_to_cpu_from(s, from).await.map_err(err)?;
                    kv_file::plan(st.kv_held.as_ref(), stored, &s, &fp).map_err(err)?
                }
                (Context::Gpu(_), Backend::Cpu) => return Err(err("a WebGPU context on the CPU backend").into()),
            };
            let Some(save) = save else { return Ok(JsValue::UNDEFINED) };
            st.kv_pending = Some(save.then);
            let out = js_sys::Object::new();
            js_sys::Reflect::set(&out, &"bytes".into(), &js_sys::Uint8Array::from(&save.bytes[..]))?;
            js_sys::Reflect::set(&out, &"append".into(), &save.append.into())?;
            Ok(out.into())
        })
    }

    /// Whether the write that the last `exportCache` handed out reached the file: after one
    /// that did not (or whose outcome is unknown) the next save rewrites the whole file.
    #[wasm_bindgen(js_name = cacheStored)]
    pub fn cache_stored(&self, ok: bool) -> Result<(), JsFail> {
        let mut st = self.state()?;
        let pending = st.kv_pending.take();
        st.kv_held = if ok { pending } else { None };
        Ok(())
    }

    /// Adopts a KV cache file read back from browser storage when it keeps more of `ids`
    /// (the next prompt) than the cache in memory does; returns how many ids it keeps (0:
    /// not adopted). A file of another model or backend, corrupt or truncated, is an error
    /// and is never used. On WebGPU the session is uploaded (`GpuModel::session_from_cpu`).
    #[wasm_bindgen(js_name = importCache)]
    pub fn import_cache(&self, bytes: &[u8], ids: Vec<u32>) -> Result<u32, JsFail> {
        let mut st = self.state()?;
        let s = kv::decode(bytes, &self.cache_fingerprint, &self.model.cfg).map_err(err)?;
        st.kv_held = Some(kv_file::read_back(&s, bytes));
        let kept = keepable(&s, &ids);
        if kept <= keepable(&st.cx, &ids) {
            return Ok(0);
        }
        st.cx = match &self.backend {
            Backend::Cpu => Context::Cpu(s),
            Backend::Gpu(g) => Context::Gpu(g.session_from_cpu(&s).map_err(err)?),
        };
        // A cache file holds no hidden states: the next MTP generation starts afresh.
        st.mtp = None;
        Ok(kept as u32)
    }

    /// The file name of this model's conversation cache in browser storage.
    #[wasm_bindgen(js_name = cacheName)]
    pub fn cache_name(&self) -> String {
        self.cache_name.clone()
    }
}
