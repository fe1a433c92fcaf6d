// colibri.js — the browser API of colibri (an ES module served by the helper).
//
//   import { load } from "http://127.0.0.1:7878/colibri.js";
//   const engine = await load({ model: "demo", backend: "auto", onProgress });
//   await engine.generate({ ids: [5, 17, 3], maxNewTokens: 16, temperature: 0 }); // {ids, text}
//   await engine.logits({ ids: [5, 17, 3] });                                        // Float32Array
//   await engine.choose({ prompt: "Merge it?", options: ["yes", "no"] });             // {probabilities, entropy, choice, ...}
//   await engine.loadDraft("tiny"); await engine.generate({ ids, draft: "model" });  // speculative: the same tokens
//   for await (const chunk of engine.chat.completions.create({ messages, stream: true })) { ... }
//   await engine.countChatTokens(messages);  // the chat as the model reads it, in tokens
//   engine.stats(); // {backend, threads, threadsReason, tokensPerSecond, ttftMs, tiers: {gpu, ram, disk, helper} (expert uses by the tier that served them), bytesFetched, ...}
//   engine.addEventListener("route", (e) => e.detail.counts);  // [[layer, expert, n], ...] per forward pass
//   // ... and e.detail.placement (WebGPU, else null): [[layer, expert, cpuUses, gpuUses], ...] where they were computed
//   engine.addEventListener("stats", (e) => e.detail);         // fresh stats after every token
//   await engine.expertTiers();  // Uint8Array [layers * experts]: 0 helper, 1 disk, 2 RAM, 3 GPU
//   await load({ model: "https://static.host/models/x/" });  // a converted model on any Range + CORS server
//
// The engine runs in a dedicated worker; experts stream from the helper into the
// browser's persistent storage (OPFS), so a reload fetches them from disk, not the helper.

const HERE = new URL(".", import.meta.url);

function makeWorker() {
  const url = new URL("colibri-worker.js", HERE);
  if (url.origin === self.location.origin) return new Worker(url, { type: "module" });
  // A page of another origin cannot start a worker from the helper's origin directly;
  // a same-origin module that imports it can (the helper answers CORS for allowed origins).
  const src = `import ${JSON.stringify(url.href)};`;
  return new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })), { type: "module" });
}

class Engine extends EventTarget {
  #worker;
  #next = 1;
  #pending = new Map();
  #stats = null;
  #onProgress;
  info = null;

  constructor(worker, onProgress) {
    super();
    this.#worker = worker;
    this.#onProgress = onProgress;
    worker.onmessage = (ev) => this.#receive(ev.data);
    worker.onerror = (ev) => {
      const err = new Error(`colibri worker failed: ${ev.message || "could not start"}`);
      for (const p of this.#pending.values()) p.reject(err);
      this.#pending.clear();
    };
    this.chat = { completions: { create: (req) => this.#chatCreate(req || {}) } };
  }

  #receive(m) {
    if (m.event === "stats") {
      this.#stats = m.stats;
      if (m.stats) this.dispatchEvent(new CustomEvent("stats", { detail: m.stats }));
      return;
    }
    if (m.event === "route") {
      this.dispatchEvent(new CustomEvent("route", { detail: { counts: m.counts, tiers: m.tiers || null, placement: m.placement || null } }));
      return;
    }
    if (m.event === "progress") {
      if (this.#onProgress) this.#onProgress(m.progress);
      return;
    }
    if (m.stats) this.#stats = m.stats;
    const p = this.#pending.get(m.id);
    if (!p) return;
    if (m.event === "token") {
      if (p.onToken) p.onToken(m);
      return;
    }
    this.#pending.delete(m.id);
    if (m.ok) p.resolve(m.result);
    else p.reject(engineError(m));
  }

  #call(op, args, onToken, signal) {
    const id = this.#next++;
    // An aborted generation stops at its next token and resolves with what it produced.
    if (signal) {
      const cancel = () => this.#worker.postMessage({ op: "cancel", args: { target: id } });
      if (signal.aborted) queueMicrotask(cancel);
      else signal.addEventListener("abort", cancel, { once: true });
    }
    return {
      id,
      promise: new Promise((resolve, reject) => {
        // A generation's options go as JSON text: the structured clone of a deeply nested
        // jsonSchema fails in the worker's deserializer, which drops the message without
        // a word (the call would never settle).
        let sent = args;
        if (op === "generate") {
          try {
            sent = { ...args, options: JSON.stringify(args.options ?? {}) };
          } catch (e) {
            reject(new Error(`options: ${e.message}: nested too deep to send (a jsonSchema nests at most 64 levels)`));
            return;
          }
        }
        this.#pending.set(id, { resolve, reject, onToken });
        this.#worker.postMessage({ id, op, args: sent });
      }),
    };
  }

  async _load(helperUrl, model, options) {
    this.info = await this.#call("load", { helperUrl, model, options }).promise;
    return this;
  }

  /** Greedy or sampled continuation of `ids`: resolves to {ids, text}. `signal` (an
   * AbortSignal) stops it early; it then resolves with the tokens made so far.
   * `logprobs: true` adds `logprobs`: per token (stop tokens excepted)
   * {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]} with `topLogprobs`
   * (0 to 20) alternatives, as OpenAI's chat `logprobs.content` (the same numbers as the
   * helper's API); onToken then sees each token's entries as `logprobs`.
   * Structured output (one of): `jsonSchema` (an object: the text is JSON valid under it),
   * `grammar` (GBNF as llama.cpp takes it, or llguidance's Lark), `regex`. The result's
   * `finishReason` is "stop" once the output is complete, "length" when maxNewTokens ran
   * out first (the text is then a cut-off prefix). A grammar the library cannot compile
   * rejects the call with its message. `speculate: N` drafts up to N tokens per step
   * from the context (prompt lookup) and checks them in one forward pass: the same tokens,
   * fewer passes; stats().speculation reports {forwards, drafted, accepted, produced,
   * acceptanceRate, tokensPerForward}. `draft: "mtp"` takes the drafts from the model's
   * own multi-token-prediction layer instead (DeepSeek-V3 / GLM-4.5 checkpoints that have
   * one; the cpu backend; `speculate` per step, 1 if 0; the conversation's cache is
   * reused from one MTP generation to the next, not after a generation without). `draft: "model"` takes them from the draft model (`load({draft})` or
   * `loadDraft`; `speculate` per step, 4 if 0), on either backend: the same tokens as
   * `coli generate --draft DIR`. Sampling as the helper's API samples (the same engine code):
   * `frequencyPenalty` and `presencePenalty` (-2 to 2, over the tokens this call produces),
   * `logitBias` ({tokenId: -100 to 100}; 100 forces a token, -100 bans it), `stop` (a string
   * or up to 16; the text ends before the first). The tab keeps the conversation's cache between calls:
   * ids that start with the previous call's prompt and answer feed only the rest (the
   * same tokens as a fresh run); the result's `cachedTokens` and stats().cachedTokens say
   * how many prompt tokens were not fed again. Unset sampling settings are the model's
   * (generation_config.json), else greedy, as `coli generate` takes them. A rejected call's
   * error has `code`, the engine's stable code (the helper's `error.code` for the same
   * failure), and for a bad setting `param`, its name. */
  async generate({ ids, onToken, signal, ...options } = {}) {
    // The options go to the engine as they are: it decides what is unset (the model's
    // generation_config.json, else greedy; 32 new tokens) and refuses what is out of range.
    return this.#call("generate", { ids, options }, onToken, signal).promise;
  }

  /** Loads a draft model for `generate({draft: "model"})`: a smaller model of the same
   * tokenizer (an id of the helper's models or a URL, as load()'s `model`), given as its
   * name or as {model, ramBytes (its RAM tier for experts, default 256 MiB), multiRange}.
   * It gets weights and expert tiers of its own (RAM, then the helper or host; no disk
   * tier) and runs on the cpu backend whatever the model's backend. A draft with another
   * tokenizer is refused with `coli generate --draft`'s message. Replaces an earlier one;
   * resolves to what stats().draft reports: {model, backend, modelType, layers, experts,
   * vocab, contextLength, bytesFetched, helperFetches, ramHits}. */
  async loadDraft(draft) {
    const { model, ...options } = typeof draft === "string" ? { model: draft } : draft || {};
    if (typeof model !== "string" || !model) throw new Error("loadDraft needs a model: an id or a URL, or {model, ramBytes}");
    return this.#call("loadDraft", { model, modelUrl: hostedModelUrl(model), options }).promise;
  }

  /** Option scoring: the probability of each of `options` as the answer to `prompt` (one
   * user message through the chat template; `raw: true` scores right after the text as it
   * is), generating nothing. Resolves to {options, probabilities, logprobs, entropy,
   * index, choice, optionTokens, promptTokens, tokensRead}: the same numbers as
   * `coli choose` and POST /v1/choose. */
  async choose({ prompt, options, raw = false } = {}) {
    if (typeof prompt !== "string" || !Array.isArray(options)) throw new Error("choose needs {prompt: string, options: [strings]}");
    const r = await this.#call("choose", { prompt, options, raw }).promise;
    return {
      options: r.options, probabilities: r.probabilities, logprobs: r.logprobs, entropy: r.entropy, index: r.index, choice: r.choice,
      optionTokens: r.option_tokens, promptTokens: r.prompt_tokens, tokensRead: r.tokens_read,
    };
  }

  /** Teacher-forced logits for every position: Float32Array [ids.length * vocab]. */
  async logits({ ids }) {
    return this.#call("logits", { ids }).promise;
  }

  /** How many tokens `messages` ([{role, content}]) take as the model reads them (the
   * chat template applied, nothing dropped): for a count against `info.contextLength`. */
  async countChatTokens(messages) {
    return (await this.#call("chatPrompt", { messages, truncate: false }).promise).ids.length;
  }

  async encode(text, { addSpecialTokens = false } = {}) {
    return this.#call("encode", { text, addSpecialTokens }).promise;
  }

  async decode(ids) {
    return this.#call("decode", { ids }).promise;
  }

  /** Where each expert lives now: Uint8Array [layers * experts] (0 helper, 1 browser
   * disk, 2 RAM, 3 GPU), or null when the engine cannot tell. */
  async expertTiers() {
    return this.#call("expertTiers", {}).promise;
  }

  /** Browser storage use: {usage, quota} in bytes, or null. */
  async storage() {
    return this.#call("storage", {}).promise;
  }

  /** The latest statistics reported by the engine (updated after every operation). */
  stats() {
    return this.#stats ? structuredClone(this.#stats) : { backend: "cpu", tokensPerSecond: 0, ttftMs: null, tiers: {}, bytesFetched: 0 };
  }

  /** Stops the worker (and releases its browser storage handles); pending calls fail. */
  terminate() {
    this.#worker.terminate();
    const err = new Error("colibri engine terminated");
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
  }

  #chatCreate(req) {
    // The request goes to the engine as it is: the engine checks it as the helper's
    // /v1/chat/completions does (the same code), so both accept and refuse the same
    // parameters, by name (error.param) and code (error.code).
    const { signal, ...request } = req;
    const created = Math.floor(Date.now() / 1000);
    const cid = `chatcmpl-${Math.random().toString(36).slice(2)}`;
    const model = req.model || this.model;
    const run = async (onToken) => {
      let sent;
      try {
        sent = JSON.stringify(request);
      } catch (e) {
        throw Object.assign(new Error(`the request: ${e.message}`), { status: 400, type: "invalid_request_error", code: "invalid_json", param: null });
      }
      // The oldest turns that do not fit the context are dropped (as the helper's API does,
      // with the same engine function); truncation: "disabled" refuses instead.
      const { ids, dropped, shared } = await this.#call("chatPrompt", { messages: req.messages, request: sent }).promise;
      // `shared`: the ids another conversation with these system messages starts with; a
      // model whose state goes back only to snapshots ends a prompt pass there.
      const gen = this.#call("generate", { ids, options: { openai: request, sharedPrefix: shared } }, onToken, signal);
      return { gen, promptTokens: ids.length, dropped };
    };
    if (!req.stream) {
      return run(null).then(async ({ gen, promptTokens, dropped }) => {
        const r = await gen.promise;
        return withDropped({
          id: cid, object: "chat.completion", created, model,
          choices: [{ index: 0, message: { role: "assistant", content: r.text }, logprobs: r.logprobs ? { content: r.logprobs, refusal: null } : null, finish_reason: finishReason(r, req) }],
          usage: usage(promptTokens, r),
        }, dropped);
      });
    }
    const self = this;
    const stream = {
      async *[Symbol.asyncIterator]() {
        const queue = [];
        let wake = null;
        let finished = false;
        let failure = null;
        const push = (x) => { queue.push(x); if (wake) { wake(); wake = null; } };
        const { gen, dropped, promptTokens } = await run((m) => push({ text: m.text, logprobs: m.logprobs }));
        gen.promise.then((r) => { finished = r; push(null); }, (e) => { failure = e; push(null); });
        const chunk = (delta, finish_reason = null, logprobs = null) => ({ id: cid, object: "chat.completion.chunk", created, model, choices: [{ index: 0, delta, logprobs, finish_reason }] });
        let first = true;
        try {
          for (;;) {
            while (!queue.length) await new Promise((r) => (wake = r));
            const item = queue.shift();
            if (item === null) break;
            const lp = item.logprobs ? { content: item.logprobs, refusal: null } : null;
            if (!item.text && !lp) continue;
            yield first ? withDropped(chunk({ role: "assistant", content: item.text }, null, lp), dropped) : chunk({ content: item.text }, null, lp);
            first = false;
          }
          if (failure) throw failure;
          if (first && dropped > 0) yield withDropped(chunk({ role: "assistant", content: "" }), dropped);
          yield chunk({}, finishReason(finished, req));
          if (req.stream_options?.include_usage) yield { ...chunk({}), choices: [], usage: usage(promptTokens, finished) };
        } finally {
          if (!finished && !failure) self.#worker.postMessage({ op: "cancel", args: { target: gen.id } });
        }
      },
    };
    return { [Symbol.asyncIterator]: () => stream[Symbol.asyncIterator](), then: (ok) => ok(stream) };
  }
}

// OpenAI's usage object of generation result `r`: cached_tokens are the prompt tokens
// whose cache the previous generation in this tab left (not fed again).
function usage(promptTokens, r) {
  return {
    prompt_tokens: promptTokens, completion_tokens: r.ids.length, total_tokens: promptTokens + r.ids.length,
    prompt_tokens_details: { cached_tokens: r.cachedTokens ?? 0 },
  };
}

// colibri's extension, as the helper's API has it: how many of the oldest messages were
// left out to fit the context (absent when none were).
function withDropped(obj, dropped) {
  if (dropped > 0) obj.dropped_messages = dropped;
  return obj;
}

// OpenAI's finish_reason: "length" when max_tokens or the context window ended the answer.
function finishReason(r, req) {
  if (r.finishReason === "stop" || r.finishReason === "length") return r.finishReason;
  return r.ids.length >= (req.max_completion_tokens ?? req.max_tokens ?? 256) ? "length" : "stop";
}

// An error of the worker's answer `m`: the engine's stable `code` and, for a request
// parameter, its name in `param`, with the status and type of the helper's 400 for it.
function engineError(m) {
  const e = new Error(m.error);
  if (m.code) e.code = m.code;
  if (m.param) Object.assign(e, { param: m.param, status: 400, type: "invalid_request_error" });
  return e;
}

/**
 * Loads a model served by a colibri helper.
 * options: {model = "demo", backend = "auto" | "webgpu" | "cpu", helper (default: this
 * module's origin), onProgress({phase, loaded, total}), ramBytes, disk = true,
 * storage = "auto" | "opfs" | "indexeddb" (auto: OPFS where the browser has it),
 * threads (CPU threads of the wasm backend; default navigator.hardwareConcurrency, at most
 * 8), pinBytes (of ramBytes, kept for the experts pinned by learned usage; default a
 * quarter when the model has usage), diskBytes (the most this model may take in browser
 * storage: a copy of its dense weights, if it fits, then experts; default half the
 * origin's quota, navigator.storage.estimate(); the least recently used unpinned experts
 * are evicted to stay under it), storageHandoff =
 * "wait" | "takeover" (when another tab uses this model's browser storage: run on RAM and
 * take the storage when that tab closes, or take it over now)}
 * Learned placement: the helper's usage counts of the model (GET /api/usage/{id}; for a
 * model on a static host, this browser's own, kept in OPFS) pin the hottest experts in RAM
 * and in browser storage at load, and they are re-pinned at each turn's end with the
 * native engine's rule and hysteresis; stats().hitRates and stats().pins report them.
 * threads: more than one needs a cross-origin isolated page (the helper's own pages are;
 * another site needs COOP same-origin + COEP require-corp); elsewhere the engine runs on
 * one thread. stats().threads says how many it got, stats().threadsReason why.
 * model: the id of one of the helper's models, or the URL of a converted model directory
 * on any static HTTP server with Range support and CORS (docs/hosting.md), e.g.
 * "https://static.host/models/x/"; such a model needs no helper at all (no usage is
 * reported). multiRange (hosted models): whether the server answers a request for
 * several ranges with multipart/byteranges; unset, it is asked once per page origin and
 * the answer is remembered (Cache API); false fetches one range per request.
 * backend: "webgpu" fails if the browser has no usable WebGPU; "auto" uses WebGPU when
 * the browser has it and one decode step measures faster on it than on the CPU backend
 * (stats().auto holds the two timings); both backends produce the same tokens.
 * hybrid (WebGPU): "off" (default: every routed expert on the GPU), "on" (experts missing
 * from the GPU pool run on the CPU threads, from the RAM tier, while the GPU computes the
 * others; the layer's sum keeps the fixed expert order, so the tokens are the same) or
 * "auto" (as on, how many by the costs measured as it runs); stats().hybrid counts the
 * expert uses computed on each (null on the CPU backend). gpuPoolBytes (WebGPU): GPU
 * memory for routed experts (default four times the adapter's largest buffer, at most 2 GiB).
 * draft: a draft model for generate({draft: "model"}) (engine.loadDraft's argument: an id,
 * a URL or {model, ramBytes}), loaded after the model; load fails if it cannot be used.
 */
export async function load({ model = "demo", backend = "auto", hybrid, gpuPoolBytes, helper, onProgress, ramBytes, pinBytes, disk, diskBytes, storage, storageHandoff, threads, multiRange, draft } = {}) {
  if (!["auto", "webgpu", "cpu"].includes(backend)) throw new Error(`unknown backend ${backend}`);
  if (hybrid !== undefined && !["off", "on", "auto"].includes(hybrid)) throw new Error(`unknown hybrid ${hybrid}`);
  const helperUrl = helper || HERE.origin;
  const engine = new Engine(makeWorker(), onProgress);
  engine.model = model;
  await engine._load(helperUrl, model, { ramBytes, pinBytes, disk, diskBytes, storage, storageHandoff, backend, hybrid, gpuPoolBytes, threads, multiRange, modelUrl: hostedModelUrl(model) });
  if (draft !== undefined && draft !== null) {
    try {
      await engine.loadDraft(draft);
    } catch (e) {
      engine.terminate();
      throw e;
    }
  }
  return engine;
}

/**
 * Asks the browser to keep this origin's storage (the cached experts) from being evicted
 * when space runs low: navigator.storage.persist(). Call it from the page on the user's
 * request (a button): browsers grant it more readily after a user gesture, and the user
 * should decide. Resolves to {persisted, usage, quota} (persisted: whether it is granted
 * now); the engine's stats().persisted follows at its next update.
 */
export async function requestPersistentStorage() {
  const s = navigator.storage;
  const persisted = s?.persist ? await s.persist().catch(() => false) : false;
  const est = s?.estimate ? await s.estimate().catch(() => null) : null;
  return { persisted, usage: est?.usage ?? null, quota: est?.quota ?? null };
}

/** The base URL (ending in "/") of a model directory on any HTTP server, when `model` is
 * a URL ("https://host/models/x/") or a path ("/models/x/", "./x/", "../x/"; relative to
 * the page); null for the id of a helper's model ("demo", "acme/tiny-moe"). */
export function hostedModelUrl(model) {
  if (typeof model !== "string") return null;
  if (!/^(https?:\/\/|\/|\.\.?\/)/i.test(model)) return null;
  const u = new URL(model, self.location.href);
  if (!u.pathname.endsWith("/")) u.pathname += "/";
  return u.href;
}
