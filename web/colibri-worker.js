// colibri's engine worker: runs the wasm engine (colibri-wasm) off the page's main
// thread. Messages in: {id, op, args}; out: {id, ok, result|error}, plus events
// {id, event: "token"|"progress"|"route", ...} and a fresh {event: "stats"} after each
// operation and each generated token. Operations run one at a time, in arrival order;
// "cancel" and "storage" are answered at once.
//
// Two builds of the engine (tools/build-web.sh): pkg-threads/ runs the CPU kernels on a
// pool of Web Workers sharing the wasm memory, which needs a SharedArrayBuffer, which the
// browser grants only where the page is cross-origin isolated (the helper's own pages
// are), and WebAssembly relaxed SIMD (Chromium-based browsers; checked before loading);
// pkg/ runs on this worker alone, anywhere. Both give the same bits.

let wasm = null; // the loaded build's module: {Engine, initThreadPool?}
let engine = null;
// How many CPU threads the engine runs on, and why that many (stats().threadsReason).
let threadsReason = null;
let helper = null;
let modelId = null;
const cancelled = new Set();
// Expert use not yet reported to the helper: "layer,expert" -> routed positions.
const unreported = new Map();

const post = (m, transfer) => self.postMessage(m, transfer || []);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const stats = () => (engine ? { ...JSON.parse(engine.stats()), threadsReason } : null);

/** Most threads a default pool gets: decode reads every weight once per token, so past a
 * few cores memory bandwidth, not compute, sets the speed, and each worker costs memory. */
const MAX_DEFAULT_THREADS = 8;

/** {threads, reason}: what `load({threads})` asked for (default: the logical cores,
 * capped), and what this page allows. */
function planThreads(asked) {
  const cores = Math.max(1, Math.floor(self.navigator?.hardwareConcurrency || 1));
  let n;
  let reason;
  if (asked !== undefined && asked !== null) {
    if (!Number.isInteger(asked) || asked < 1) throw new Error(`threads must be a whole number >= 1, got ${asked}`);
    n = asked;
    reason = `load({threads: ${asked}})`;
  } else {
    n = Math.min(cores, MAX_DEFAULT_THREADS);
    reason = `default: navigator.hardwareConcurrency ${cores}` + (cores > MAX_DEFAULT_THREADS ? `, capped at ${MAX_DEFAULT_THREADS}` : "");
  }
  if (n > 1 && !self.crossOriginIsolated) return { threads: 1, reason: "page not cross-origin isolated (no shared memory for worker threads)" };
  return { threads: n, reason };
}

/** A module whose one function uses `i32x4.relaxed_dot_i8x16_i7x16_add_s`: it validates
 * where the browser has WebAssembly relaxed SIMD, which the threaded build is compiled with. */
function hasRelaxedSimd() {
  const v128 = [0xfd, 0x0c, ...new Array(16).fill(0)];
  const body = [0, ...v128, ...v128, ...v128, 0xfd, 0x93, 0x02, 0x0b];
  const code = [1, body.length, ...body];
  const bytes = [0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 5, 1, 0x60, 0, 1, 0x7b, 3, 2, 1, 0, 10, code.length, ...code];
  try {
    return WebAssembly.validate(new Uint8Array(bytes));
  } catch {
    return false;
  }
}

/** Loads the engine build for `plan`: the threaded one (wasm threads and relaxed SIMD,
 * whose int4 kernel is the faster one) wherever the page and the browser allow it, even
 * for one thread; else the one-thread build. A threaded build that fails to start falls
 * back to the one-thread build. */
async function loadWasm(plan) {
  let threaded = self.crossOriginIsolated === true;
  if (threaded && !hasRelaxedSimd()) {
    threaded = false;
    if (plan.threads > 1) plan = { threads: 1, reason: "this browser lacks WebAssembly relaxed SIMD, which the threaded engine uses" };
  }
  if (threaded) {
    try {
      const m = await import("./pkg-threads/colibri_wasm.js");
      await m.default();
      await m.initThreadPool(plan.threads);
      return { m, reason: plan.reason };
    } catch (e) {
      plan = { threads: 1, reason: `threaded engine unavailable: ${e && e.message ? e.message : e}` };
    }
  }
  const m = await import("./pkg/colibri_wasm.js");
  await m.default();
  return { m, reason: plan.reason };
}

// Moves the engine's usage counts since the last call into `unreported` and returns
// them as [[layer, expert, n], ...] (what the Brain view draws).
function takeRoute() {
  const counts = JSON.parse(engine.takeUsage());
  for (const [l, e, n] of counts) {
    const k = `${l},${e}`;
    unreported.set(k, (unreported.get(k) || 0) + n);
  }
  return counts;
}

// One "route" event per forward pass; `tiers` (one byte per expert, layer-major) only
// when the engine can tell where each expert lives; `placement` ([[layer, expert, CPU
// uses, GPU uses], ...]: where the routed experts were computed since the last event)
// only on WebGPU.
function postRoute(id, counts) {
  const m = { id, event: "route", counts };
  if (typeof engine.expertTiers === "function") m.tiers = engine.expertTiers();
  if (typeof engine.takePlacement === "function") {
    const placement = JSON.parse(engine.takePlacement());
    if (placement) m.placement = placement;
  }
  post(m);
}

// The end of a turn (a generation, a scoring, a logits call): the use is reported (to the
// helper, or kept in this browser's storage for a model without one), and the engine
// re-pins its RAM and disk tiers by the learned counts (the native rule and hysteresis).
async function endTurn() {
  await reportUsage();
  try {
    engine.endTurn();
  } catch (e) {
    // Best effort: an expert to pin that could not be read now is pinned at a later turn.
  }
  if (modelId === null) await saveLocalUsage();
}

async function reportUsage() {
  if (!engine) return;
  takeRoute();
  if (modelId === null) return unreported.clear();
  if (!unreported.size) return;
  const counts = [...unreported].map(([k, n]) => [...k.split(",").map(Number), n]);
  unreported.clear();
  try {
    const r = await fetch(`${helper}/api/usage`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: modelId, counts }),
    });
    if (!r.ok && r.status >= 500) throw new Error(String(r.status));
  } catch (_) {
    // The helper may be gone: keep the counts for the next report (usage is best effort).
    for (const [l, e, n] of counts) unreported.set(`${l},${e}`, (unreported.get(`${l},${e}`) || 0) + n);
  }
}

// Whether the server of the model at `base` answers a request for two ranges with
// multipart/byteranges (nginx, Apache, Caddy, the helper) or with the whole file or only
// one range (S3, GCS, many CDNs): asked with a request for two bytes of colibri.json
// (aborted before the body if it is the whole file), once per page origin and model
// base; the answer is kept in the Cache API so that a reload asks nothing.
async function probeMultiRange(base) {
  const key = `${base}colibri.json?colibri-multirange-probe`;
  const cache = self.caches ? await self.caches.open("colibri-hosts").catch(() => null) : null;
  const known = cache ? await cache.match(key).catch(() => null) : null;
  if (known) return (await known.text()) === "multipart";
  const abort = new AbortController();
  let answer = "single";
  try {
    const r = await fetch(`${base}colibri.json`, { headers: { Range: "bytes=0-0,2-2" }, cache: "no-store", signal: abort.signal });
    if (r.status === 206 && /^multipart\/byteranges/i.test(r.headers.get("Content-Type") || "")) answer = "multipart";
  } catch (_) {
    return false; // unreachable now: the load itself will say why; ask again next time
  } finally {
    abort.abort();
  }
  if (cache) await cache.put(key, new Response(answer)).catch(() => {});
  return answer === "multipart";
}

// Learned usage of a model without a helper (a static host): kept in OPFS as a usage file
// (the helper's format, docs/api.md), `colibri-usage/<storage name>.json`.
const usageDir = async () => (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-usage", { create: true });

async function readLocalUsage(name) {
  try {
    return await (await (await (await usageDir()).getFileHandle(`${name}.json`)).getFile()).text();
  } catch (_) {
    return null; // nothing learned yet, or no storage
  }
}

async function saveLocalUsage() {
  if (!kvStore) return;
  try {
    const w = await (await (await usageDir()).getFileHandle(`${engine.storageName()}.json`, { create: true })).createWritable();
    await w.write(engine.usageFile());
    await w.close();
  } catch (_) {
    // Best effort: the counts in memory still pin this tab's experts.
  }
}

// The model's browser storage is one tab's at a time (OPFS sync access handles are
// exclusive): the worker that uses it holds the Web Lock "colibri-storage:<storage name>".
// A tab that finds it held runs on RAM and waits for it (storageHandoff "wait", the
// default: it takes the storage when the other tab closes), or takes it over ("takeover":
// the other tab closes its files, runs on RAM and waits to get it back).
let lockGen = 0;
let heldLock = null; // releases the lock this worker holds

function postStats() {
  try {
    post({ event: "stats", stats: stats() });
  } catch (_) {
    // The engine is mid-step; the step's own stats follow.
  }
}

/** Requests `name` with `opts`; resolves with a release function once held, or null if
 * not granted (ifAvailable). `onLost` runs if another tab steals it. */
function requestLock(name, opts, onLost) {
  return new Promise((granted) => {
    let release;
    const held = new Promise((r) => (release = r));
    navigator.locks
      .request(name, opts, (lock) => {
        if (!lock) return granted(null);
        granted(release);
        return held;
      })
      .catch((e) => {
        if (e && e.name === "AbortError") onLost();
      });
  });
}

async function attachUnderLock(gen, name, how) {
  const onLost = () => {
    if (gen !== lockGen) return;
    engine.detachDisk("another colibri tab took this model's browser storage over; this tab runs on RAM and takes it back when that tab closes");
    postStats();
    attachUnderLock(gen, name, "wait");
  };
  const opts = how === "takeover" ? { steal: true } : how === "try" ? { ifAvailable: true } : {};
  const release = await requestLock(name, opts, onLost);
  if (gen !== lockGen) return release && release();
  if (!release) {
    engine.detachDisk("another colibri tab or window is using this model's browser storage: this tab runs on RAM and takes the storage when that tab closes");
    postStats();
    return void attachUnderLock(gen, name, "wait");
  }
  const why = await engine.attachDisk();
  if (why) release();
  else heldLock = release;
  postStats();
}

async function attachStorage({ disk, storage, storageHandoff }) {
  const gen = ++lockGen;
  if (heldLock) heldLock();
  heldLock = null;
  if (disk === false) return;
  if (storage === "indexeddb" || !self.navigator.locks) return void (await engine.attachDisk());
  const how = storageHandoff === "takeover" ? "takeover" : "try";
  if (storageHandoff !== undefined && !["wait", "takeover"].includes(storageHandoff)) throw new Error(`storageHandoff must be "wait" or "takeover", got ${storageHandoff}`);
  await attachUnderLock(gen, `colibri-storage:${engine.storageName()}`, how);
}

// The conversation's cache in OPFS (with the disk tier on; on WebGPU read back from the GPU,
// in a file of its own per adapter): written after every generation (a turn that extends
// the stored conversation appends one record: `saveCache`), read back by the first generation after a load (a reload, a new tab)
// so that a conversation continues without prefilling it again. The engine checks the
// file (checksum, fingerprint, shapes); one it refuses is removed with one warning.
let kvStore = false;
let kvChecked = false;
const kvDir = async () => (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-kv", { create: true });

async function restoreCache(ids) {
  if (!kvStore || kvChecked) return;
  kvChecked = true;
  let dir, file;
  try {
    dir = await kvDir();
    file = await (await dir.getFileHandle(engine.cacheName())).getFile();
  } catch (_) {
    return; // no storage, or nothing stored yet
  }
  try {
    engine.importCache(new Uint8Array(await file.arrayBuffer()), Uint32Array.from(ids));
  } catch (e) {
    console.warn(`colibri: ignoring the stored conversation cache: ${e && e.message}`);
    await dir.removeEntry(engine.cacheName()).catch(() => {});
  }
}

// A turn that extends what the file holds appends one record of its new positions (through
// a sync access handle: written in place, not through a copy of the file); anything else
// rewrites the file whole (through a writable stream: the file is replaced when it closes).
// A failed append is cut back off; after any failure the next save rewrites the file.
async function saveCache() {
  if (!kvStore) return;
  let access, size;
  try {
    const handle = await (await kvDir()).getFileHandle(engine.cacheName(), { create: true });
    size = (await handle.getFile()).size;
    const out = await engine.exportCache(size);
    if (!out) return;
    if (out.append) {
      access = await handle.createSyncAccessHandle();
      if (access.getSize() !== size) throw new Error("the stored cache changed");
      if (access.write(out.bytes, { at: size }) !== out.bytes.length) throw new Error("short write");
      access.flush();
    } else {
      const w = await handle.createWritable();
      await w.write(out.bytes);
      await w.close();
    }
    engine.cacheStored(true);
  } catch (_) {
    // Best effort: the cache in memory still serves this tab.
    try {
      if (access && access.getSize() > size) access.truncate(size);
    } catch (_) {}
    try {
      engine.cacheStored(false);
    } catch (_) {}
  } finally {
    access?.close();
  }
}

// Other versions of the loaded model (its storage name with another fingerprint: the model
// was converted again) cannot be loaded from where this one came, but their browser
// storage (expert tier, dense copy, conversation cache, learned usage, IndexedDB tier)
// would stay until the page's "clear" button. Each is removed at load, unless a tab still
// uses it (its Web Lock is held, or its files are open). Best effort.
async function pruneOldVersions(name) {
  const m = /^(.*)-([0-9a-f]{16})$/.exec(name);
  if (!m || !self.navigator.locks) return [];
  const old = (n) => {
    const x = /^(.*)-([0-9a-f]{16})$/.exec(n);
    return x && x[1] === m[1] && x[2] !== m[2];
  };
  const names = new Set();
  const root = await navigator.storage.getDirectory().catch(() => null);
  const dir = (d) => (root ? root.getDirectoryHandle(d).catch(() => null) : null);
  const top = await dir("colibri");
  if (top) for await (const [n] of top.entries()) if (old(n)) names.add(n);
  for (const db of (await indexedDB.databases?.().catch(() => [])) || []) {
    if (db.name?.startsWith("colibri-") && old(db.name.slice(8))) names.add(db.name.slice(8));
  }
  const removed = [];
  for (const n of names) {
    const release = await requestLock(`colibri-storage:${n}`, { ifAvailable: true }, () => {});
    if (!release) continue; // a tab uses it
    try {
      if (top) await top.removeEntry(n, { recursive: true }).catch((e) => { if (e.name !== "NotFoundError") throw e; });
      for (const [d, f] of [["colibri-kv", `${n}.kv`], ["colibri-usage", `${n}.json`]]) await (await dir(d))?.removeEntry(f).catch(() => {});
      // Its WebGPU conversation caches too (`<name>.webgpu-<adapter>.kv`, one per adapter).
      const kv = await dir("colibri-kv");
      if (kv) for await (const [f] of kv.entries()) if (f.startsWith(`${n}.webgpu-`) && f.endsWith(".kv")) await kv.removeEntry(f).catch(() => {});
      await new Promise((ok) => {
        const r = indexedDB.deleteDatabase(`colibri-${n}`);
        r.onsuccess = r.onerror = r.onblocked = ok;
      });
      removed.push(n);
    } catch (_) {
      // Its files are open (a tab is loading it): left for a later load.
    } finally {
      release();
    }
  }
  return removed;
}

// One step at a time so tokens stream out and a "cancel" message can get in between.
// A failed step (helper restarting) is rolled back by the engine and retried with backoff.
async function generate(id, ids, opts) {
  // The options come as JSON text (colibri.js), which the engine parses itself.
  const optionsText = typeof opts === "string" ? opts : JSON.stringify(opts || {});
  if (typeof opts === "string") opts = JSON.parse(opts);
  await restoreCache(ids);
  engine.begin(Uint32Array.from(ids), optionsText);
  // Prompt tokens whose cache the previous generation left (not fed again).
  const cachedTokens = JSON.parse(engine.stats()).cachedTokens;
  let failures = 0;
  let finishReason = "stop";
  // An OpenAI request (chat.completions) is the engine's to read; these two only shape
  // what is posted back.
  const req = opts?.openai || null;
  const logprobs = (req ? req.logprobs === true : opts && opts.logprobs) ? [] : null;
  // With stop strings the text is what the engine let through (it ends before the stop
  // string), not the decoded ids.
  const stopOpt = req ? req.stop : opts?.stop;
  const stops = typeof stopOpt === "string" || (Array.isArray(stopOpt) && stopOpt.length > 0);
  let text = "";
  for (;;) {
    if (cancelled.has(id)) {
      finishReason = "cancelled";
      break;
    }
    let t;
    try {
      t = await engine.step();
      failures = 0;
    } catch (e) {
      // A full context window ends the answer; it is not worth retrying.
      if (e && e.code === "context_length_exceeded") {
        finishReason = "length";
        break;
      }
      if (++failures > 8) throw e;
      post({ event: "stats", stats: stats() });
      await sleep(Math.min(250 * 2 ** failures, 4000));
      continue;
    }
    // -2: a chunk of a long prompt was read (the next step reads on); a cancel gets in here.
    if (t === -2) {
      await sleep(0);
      continue;
    }
    if (t < 0) break;
    postRoute(id, takeRoute());
    const lp = logprobs ? JSON.parse(engine.takeLogprobs()) : undefined;
    if (lp) logprobs.push(...lp);
    const piece = engine.takeText();
    text += piece;
    post({ id, event: "token", token: t, text: piece, logprobs: lp });
    post({ event: "stats", stats: stats() });
    await sleep(0);
  }
  cancelled.delete(id);
  const out = Array.from(engine.produced());
  // The engine says why it ended (a stop token, a complete grammar, the token budget).
  if (finishReason === "stop") finishReason = engine.finishReason() || finishReason;
  const r = { ids: out, text: stops ? text : engine.decode(Uint32Array.from(out)), finishReason, cachedTokens };
  await saveCache();
  if (logprobs) r.logprobs = logprobs;
  return r;
}

const ops = {
  async load({ helperUrl, model, options }) {
    const { threads, modelUrl, multiRange, storageHandoff, ...engineOptions } = options || {};
    // One build per worker: a second load reuses it (a thread pool starts only once).
    if (!wasm) {
      const got = await loadWasm(planThreads(threads));
      wasm = got.m;
      threadsReason = got.reason;
    }
    const { Engine } = wasm;
    helper = helperUrl.replace(/\/$/, "");
    // A model on a static host has no helper to learn its usage: nothing is reported.
    modelId = modelUrl ? null : model;
    const base = modelUrl || `${helper}/models/${encodeURIComponent(model)}/`;
    // The helper answers several ranges in one request; another server is asked once.
    engineOptions.multiRange = modelUrl ? (typeof multiRange === "boolean" ? multiRange : await probeMultiRange(base)) : true;
    const onProgress = (p) => post({ event: "progress", progress: p });
    // Learned usage: the helper's (GET /api/usage/{id}), else this browser's own.
    const usageFor = async (name) => {
      if (modelId === null) return readLocalUsage(name);
      try {
        const r = await fetch(`${helper}/api/usage/${encodeURIComponent(model)}`);
        return r.ok ? await r.text() : null;
      } catch (_) {
        return null; // usage is best effort: no pins this time
      }
    };
    // A second load in this worker: the first engine's storage is closed and its lock freed.
    if (engine) {
      engine.detachDisk("replaced by another load");
      engine.free();
      engine = null;
      lockGen++;
      if (heldLock) heldLock();
      heldLock = null;
    }
    engine = await Engine.load(base, engineOptions, onProgress, usageFor);
    kvStore = engineOptions.disk !== false;
    kvChecked = false;
    await attachStorage({ ...engineOptions, storageHandoff });
    // The learned pins, now that the disk tier is open (or waited for): read once, kept.
    try {
      engine.endTurn();
    } catch (_) {
      // An expert that could not be read now is pinned at a later turn.
    }
    const prunedVersions = await pruneOldVersions(engine.storageName()).catch(() => []);
    return { info: JSON.parse(engine.modelInfo()), vocabSize: engine.vocabSize(), prunedVersions };
  },
  // A draft model for generate({draft: "model"}), in this worker's engine (its own tiers).
  async loadDraft({ model, modelUrl, options }) {
    const { multiRange, ...draftOptions } = options || {};
    const base = modelUrl || `${helper}/models/${encodeURIComponent(model)}/`;
    draftOptions.multiRange = modelUrl ? (typeof multiRange === "boolean" ? multiRange : await probeMultiRange(base)) : true;
    const onProgress = (p) => post({ event: "progress", progress: p });
    return JSON.parse(await engine.loadDraft(base, String(model), JSON.stringify(draftOptions), onProgress));
  },
  async logits({ ids }) {
    const out = await engine.logits(Uint32Array.from(ids));
    postRoute(0, takeRoute());
    await endTurn();
    return out;
  },
  async generate({ ids, options }, id) {
    const r = await generate(id, ids, options);
    await endTurn();
    return r;
  },
  async choose({ prompt, options, raw }) {
    const r = JSON.parse(await engine.choose(String(prompt), JSON.stringify(options), !!raw));
    postRoute(0, takeRoute());
    await endTurn();
    return r;
  },
  // {ids, dropped}: the oldest turns that do not fit the context are dropped (fit_chat).
  // With `request` (an OpenAI chat request as the page gave it, JSON): checked and
  // rendered by the engine, which reads messages, max tokens and truncation from it.
  async chatPrompt({ messages, maxTokens, truncate = true, request }) {
    if (typeof request === "string") return JSON.parse(engine.chatRequest(request));
    return JSON.parse(engine.chatPrompt(JSON.stringify(messages), maxTokens ?? undefined, !!truncate));
  },
  async encode({ text, addSpecialTokens }) {
    return Array.from(engine.encode(text, !!addSpecialTokens));
  },
  async decode({ ids }) {
    return engine.decode(Uint32Array.from(ids));
  },
  async expertTiers() {
    return typeof engine.expertTiers === "function" ? engine.expertTiers() : null;
  },
  async storage() {
    return JSON.parse(await wasm.Engine.storageEstimate());
  },
};

async function run(id, op, args) {
  const fn = ops[op];
  if (!fn) return post({ id, ok: false, error: `unknown operation ${op}` });
  if (op !== "load" && !engine) return post({ id, ok: false, error: "no model loaded" });
  // Stats go out before the answer, so engine.stats() is fresh when the call resolves.
  try {
    const result = await fn(args || {}, id);
    post({ event: "stats", stats: stats() });
    post({ id, ok: true, result }, result instanceof Float32Array ? [result.buffer] : []);
  } catch (e) {
    post({ event: "stats", stats: stats() });
    // The engine's errors carry a stable code (and a request parameter's its name).
    post({ id, ok: false, error: String(e && e.message ? e.message : e), code: e?.code ?? null, param: e?.param ?? null });
  }
}

// The engine does one thing at a time: a generation that yields between tokens must not
// let a second one begin() under it.
let queue = Promise.resolve();

self.onmessage = (ev) => {
  const { id, op, args } = ev.data || {};
  if (op === "cancel") {
    cancelled.add(args.target);
    return;
  }
  if (op === "storage") return void run(id, op, args);
  queue = queue.then(() => run(id, op, args));
};
