//! The persistent browser tier where OPFS is missing: experts in IndexedDB, one record
//! per expert (key: the expert's index in manifest order, value: its bytes). IndexedDB
//! has no synchronous reads, so a step that needs a stored expert stops, the worker
//! awaits the read ([`Idb::load`]), and the step is rolled back and run again with the
//! bytes at hand (see `backend::Backend::forward_tiered`). Writes are queued without
//! waiting; a failed write (quota) marks the tier failed and the caller turns it off.
//! Every read is checksummed by the caller, as with OPFS.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use js_sys::{Function, Promise, Uint8Array};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{IdbDatabase, IdbObjectStore, IdbRequest, IdbTransactionMode};

use crate::net::{js_err, scope};

const STORE: &str = "experts";

pub struct Idb {
    db: IdbDatabase,
    /// Experts stored (or queued to be) in the database.
    stored: HashSet<u32>,
    /// Bytes read by `load`, waiting for the step that asked for them.
    loaded: HashMap<u32, Vec<u8>>,
    /// Experts a step asked for that are stored but not loaded yet.
    pending: Vec<u32>,
    /// Set by a failed write transaction (quota exceeded, database closed).
    failed: Rc<RefCell<Option<String>>>,
    on_fail: Closure<dyn FnMut(web_sys::Event)>,
}

/// The outcome of a synchronous read.
pub enum Read {
    Hit,
    Miss,
    /// Stored, but must be read asynchronously first ([`Idb::load`]).
    Pending,
}

/// A request's result as a promise.
fn done(req: &IdbRequest) -> Promise {
    let req = req.clone();
    Promise::new(&mut |resolve: Function, reject: Function| {
        let r = req.clone();
        let ok = Closure::once_into_js(move |_: web_sys::Event| {
            let _ = resolve.call1(&JsValue::NULL, &r.result().unwrap_or(JsValue::UNDEFINED));
        });
        let r = req.clone();
        let bad = Closure::once_into_js(move |_: web_sys::Event| {
            let msg =
                r.error().ok().flatten().map(|e| e.message()).unwrap_or_else(|| "IndexedDB request failed".into());
            let _ = reject.call1(&JsValue::NULL, &JsValue::from_str(&msg));
        });
        req.set_onsuccess(Some(ok.unchecked_ref()));
        req.set_onerror(Some(bad.unchecked_ref()));
    })
}

impl Idb {
    /// Opens (creating if needed) the database `colibri-{name}` and reads its keys.
    pub async fn open(name: &str) -> Result<Idb, String> {
        let factory = scope()?.indexed_db().map_err(js_err)?.ok_or("IndexedDB is not available")?;
        let req = factory.open_with_u32(&format!("colibri-{name}"), 1).map_err(js_err)?;
        let r = req.clone();
        let upgrade = Closure::once_into_js(move |_: web_sys::Event| {
            if let Ok(db) = r.result().and_then(|d| d.dyn_into::<IdbDatabase>()) {
                let _ = db.create_object_store(STORE);
            }
        });
        req.set_onupgradeneeded(Some(upgrade.unchecked_ref()));
        let db: IdbDatabase =
            JsFuture::from(done(&req)).await.map_err(js_err)?.dyn_into().map_err(|_| "not a database")?;
        let store = db.transaction_with_str(STORE).and_then(|t| t.object_store(STORE)).map_err(js_err)?;
        let keys = JsFuture::from(done(&store.get_all_keys().map_err(js_err)?)).await.map_err(js_err)?;
        let stored = js_sys::Array::from(&keys).iter().filter_map(|k| k.as_f64()).map(|k| k as u32).collect();
        let failed: Rc<RefCell<Option<String>>> = Rc::default();
        let sink = failed.clone();
        let on_fail = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            sink.borrow_mut().get_or_insert_with(|| "an IndexedDB write failed (storage full?)".into());
        });
        Ok(Idb { db, stored, loaded: HashMap::new(), pending: Vec::new(), failed, on_fail })
    }

    fn store(&self, mode: IdbTransactionMode) -> Result<IdbObjectStore, String> {
        let tx = self.db.transaction_with_str_and_mode(STORE, mode).map_err(js_err)?;
        if mode == IdbTransactionMode::Readwrite {
            tx.set_onabort(Some(self.on_fail.as_ref().unchecked_ref()));
        }
        tx.object_store(STORE).map_err(js_err)
    }

    pub fn count(&self) -> usize {
        self.stored.len()
    }

    /// Whether expert `expert` is stored (read synchronously once loaded).
    pub fn holds(&self, expert: usize) -> bool {
        self.stored.contains(&(expert as u32))
    }

    pub fn mask(&self, n: usize) -> Vec<bool> {
        (0..n).map(|e| self.stored.contains(&(e as u32))).collect()
    }

    pub fn read(&mut self, expert: usize, buf: &mut [u8]) -> Read {
        let key = expert as u32;
        match self.loaded.remove(&key) {
            Some(bytes) if bytes.len() == buf.len() => {
                buf.copy_from_slice(&bytes);
                Read::Hit
            }
            Some(_) => Read::Miss,
            None if self.stored.contains(&key) => {
                if !self.pending.contains(&key) {
                    self.pending.push(key);
                }
                Read::Pending
            }
            None => Read::Miss,
        }
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// What a later [`Idb::load`] must read (taken from the pending list), and the store
    /// to read it from.
    pub fn take_pending(&mut self) -> Result<(Vec<u32>, IdbObjectStore), String> {
        let keys = std::mem::take(&mut self.pending);
        Ok((keys, self.store(IdbTransactionMode::Readonly)?))
    }

    /// Reads `keys` in one transaction. Missing records come back as None.
    pub async fn load(keys: &[u32], store: &IdbObjectStore) -> Result<Vec<(u32, Option<Vec<u8>>)>, String> {
        let mut reqs = Vec::with_capacity(keys.len());
        for &k in keys {
            reqs.push((k, done(&store.get(&JsValue::from(k)).map_err(js_err)?)));
        }
        let mut out = Vec::with_capacity(keys.len());
        for (k, p) in reqs {
            let v = JsFuture::from(p).await.map_err(js_err)?;
            out.push((k, v.dyn_into::<Uint8Array>().ok().map(|a| a.to_vec())));
        }
        Ok(out)
    }

    /// Files what [`Idb::load`] read; a record that has vanished is forgotten.
    pub fn loaded(&mut self, records: Vec<(u32, Option<Vec<u8>>)>) {
        for (k, v) in records {
            match v {
                Some(bytes) => {
                    self.loaded.insert(k, bytes);
                }
                None => {
                    self.stored.remove(&k);
                }
            }
        }
    }

    /// Queues the (verified) bytes of `expert` for storage.
    pub fn write(&mut self, expert: usize, bytes: &[u8]) -> Result<(), String> {
        if let Some(e) = self.failed.borrow().clone() {
            return Err(e);
        }
        let store = self.store(IdbTransactionMode::Readwrite)?;
        store.put_with_key(&Uint8Array::from(bytes), &JsValue::from(expert as u32)).map_err(js_err)?;
        self.stored.insert(expert as u32);
        Ok(())
    }

    pub fn forget(&mut self, expert: usize) -> Result<(), String> {
        self.stored.remove(&(expert as u32));
        self.loaded.remove(&(expert as u32));
        let store = self.store(IdbTransactionMode::Readwrite)?;
        store.delete(&JsValue::from(expert as u32)).map_err(js_err)?;
        Ok(())
    }

    pub fn close(&self) {
        self.db.close();
    }
}
