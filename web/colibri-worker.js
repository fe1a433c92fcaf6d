// colibri's engine worker: runs the wasm engine (colibri-wasm) off the page's main
// thread. Messages in: {id, op, args}; out: {id, ok, result|error}, plus events
// {id, event: "token"|"progress", ...} and a fresh {event: "stats"} after each operation.
import init, { Engine } from "./pkg/colibri_wasm.js";

let engine = null;
let helper = null;
let modelId = null;
const cancelled = new Set();

const post = (m, transfer) => self.postMessage(m, transfer || []);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const stats = () => (engine ? JSON.parse(engine.stats()) : null);

async function reportUsage() {
  if (!engine) return;
  const counts = JSON.parse(engine.takeUsage());
  if (!counts.length) return;
  try {
    await fetch(`${helper}/api/usage`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: modelId, counts }),
    });
  } catch (_) {
    // The helper may be gone; usage is best effort.
  }
}

// One step at a time so tokens stream out and a "cancel" message can get in between.
// A failed step (helper restarting) is rolled back by the engine and retried with backoff.
async function generate(id, ids, opts) {
  engine.begin(Uint32Array.from(ids), JSON.stringify(opts || {}));
  let failures = 0;
  for (;;) {
    if (cancelled.has(id)) break;
    let t;
    try {
      t = engine.step();
      failures = 0;
    } catch (e) {
      if (++failures > 8) throw e;
      post({ event: "stats", stats: stats() });
      await sleep(Math.min(250 * 2 ** failures, 4000));
      continue;
    }
    if (t < 0) break;
    post({ id, event: "token", token: t, text: engine.takeText() });
    await sleep(0);
  }
  cancelled.delete(id);
  const out = Array.from(engine.produced());
  return { ids: out, text: engine.decode(Uint32Array.from(out)) };
}

const ops = {
  async load({ helperUrl, model, options }) {
    await init();
    helper = helperUrl.replace(/\/$/, "");
    modelId = model;
    const onProgress = (p) => post({ event: "progress", progress: p });
    engine = await Engine.load(`${helper}/models/${encodeURIComponent(model)}/`, options || {}, onProgress);
    return { info: JSON.parse(engine.modelInfo()), vocabSize: engine.vocabSize() };
  },
  async logits({ ids }) {
    const out = engine.logits(Uint32Array.from(ids));
    await reportUsage();
    return out;
  },
  async generate({ ids, options }, id) {
    const r = await generate(id, ids, options);
    await reportUsage();
    return r;
  },
  async chatPrompt({ messages }) {
    return Array.from(engine.chatPrompt(JSON.stringify(messages)));
  },
  async encode({ text, addSpecialTokens }) {
    return Array.from(engine.encode(text, !!addSpecialTokens));
  },
  async decode({ ids }) {
    return engine.decode(Uint32Array.from(ids));
  },
  async storage() {
    return JSON.parse(await Engine.storageEstimate());
  },
};

self.onmessage = async (ev) => {
  const { id, op, args } = ev.data || {};
  if (op === "cancel") {
    cancelled.add(args.target);
    return;
  }
  const fn = ops[op];
  if (!fn) return post({ id, ok: false, error: `unknown operation ${op}` });
  if (op !== "load" && !engine) return post({ id, ok: false, error: "no model loaded" });
  try {
    const result = await fn(args || {}, id);
    post({ id, ok: true, result }, result instanceof Float32Array ? [result.buffer] : []);
  } catch (e) {
    post({ id, ok: false, error: String(e && e.message ? e.message : e) });
  }
  post({ event: "stats", stats: stats() });
};
