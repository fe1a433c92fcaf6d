// app.js — the chat page at `/`: model picker, loading, conversations, streaming chat,
// settings and the Brain view (live stats: stats_panel.js; browser storage: storage_panel.js;
// DOM helpers: dom.js). Plain DOM, no framework.
// Model text only ever reaches the page as text nodes (see markdown.js).
import { load, requestPersistentStorage } from "./colibri.js";
import { renderMarkdown } from "./markdown.js";
import { BrainView } from "./brain.js";
import * as store from "./store.js";
import { follow, markCut, speedLabel } from "./answers.js";
import { backendChoice, bindBackendPicker } from "./backend_pick.js";
import { UNDO_MS, matches, parseImport } from "./chat_list.js";
import { tokenCounter } from "./token_count.js";
import { keepForOffline, registerOffline } from "./offline.js";
import { $, h, code, formatBytes, formatSeconds } from "./dom.js";
import { bindStorage, clearModelCache, refreshStorage } from "./storage_panel.js";
import { bindStats, renderLegend, renderStats, scheduleStats } from "./stats_panel.js";
import { applyTheme, cycleTheme } from "./theme.js";

const HELPER = location.origin;
// The command that starts a helper where this page expects it (7878 is coli's default port).
const PORT = location.port || (location.protocol === "https:" ? "443" : "80");
const PORT_FLAG = PORT === "7878" ? "" : ` --port ${PORT}`;
const START_HINT = `coli serve${PORT_FLAG}`;

const state = {
  models: [], // /api/models entries
  modelId: null,
  engine: null,
  info: null, // {layers, experts, topK, moeLayers, ...}
  loading: false,
  busy: false,
  controller: null,
  conv: null,
  settings: store.loadSettings(),
  // What the engine samples with where the settings leave temperature or top-p empty (the
  // model's generation_config.json, else the API's fallback: the engine decides, as for
  // the helper's /v1/chat/completions); shown as placeholders, never sent.
  modelDefaults: {},
  retryTimer: 0,
};

function showModelDefaults() {
  const d = state.modelDefaults;
  $("temperature").placeholder = `model default: ${d.temperature ?? "?"}`;
  $("top-p").placeholder = `model default: ${d.topP ?? "?"}`;
}

const brain = new BrainView($("brain"), $("brain-chart"));
bindStorage({ state, notice, dismiss, stop, setComposerEnabled, loadModel });
bindStats({ state });

// ---------------------------------------------------------------- notices

/** Shows (or replaces) the notice `key`; kind: "info" | "warn" | "error". */
function notice(key, kind, body, actions = []) {
  dismiss(key);
  const n = h("div", { class: `notice ${kind}`, "data-notice": key, role: kind === "error" ? "alert" : "status" },
    h("div", { class: "body" }, body, actions.length ? h("div", { class: "actions" }, actions) : null),
    h("button", { class: "link-btn", type: "button", "aria-label": "Dismiss this message", onclick: () => dismiss(key) }, "✕"));
  $("notices").append(n);
}

function dismiss(key) {
  document.querySelector(`[data-notice="${key}"]`)?.remove();
}

function helperDownNotice() {
  notice("helper", "error", [
    h("strong", {}, "The colibri helper is not reachable "), `at ${HELPER}. `,
    "It serves the model files to this page. Start it in a terminal with ", code(START_HINT),
    " (from a source checkout: ", code(`./tools/start.sh${PORT_FLAG}`), "), then retry.",
    state.engine ? " Meanwhile the model kept in this browser still answers (what it has not kept needs the helper)." : "",
  ], [h("button", { class: "btn small-btn", type: "button", onclick: () => start() }, "Retry now")]);
}

async function helperUp() {
  try {
    return (await fetch(`${HELPER}/health`, { cache: "no-store" })).ok;
  } catch (_) {
    return false;
  }
}

// The helper can stop while the page stays open: say so within a few seconds, and take
// the message back when it returns.
const WATCH_MS = 4000;
async function watchHelper() {
  if (!document.hidden && document.body.dataset.state !== "offline") {
    const up = await helperUp();
    if (!up && !document.querySelector('[data-notice="helper"]')) helperDownNotice();
    if (up && document.querySelector('[data-notice="helper"]')) dismiss("helper");
    document.body.dataset.helper = up ? "up" : "down";
  }
  setTimeout(watchHelper, WATCH_MS);
}

// ---------------------------------------------------------------- models and loading

async function fetchModels() {
  const r = await fetch(`${HELPER}/api/models`, { cache: "no-store" });
  if (!r.ok) throw new Error(`GET /api/models: HTTP ${r.status}`);
  const body = await r.json();
  const list = Array.isArray(body) ? body : Array.isArray(body.data) ? body.data : [];
  return list.filter((m) => m && typeof m.id === "string");
}

/** Only converted models (colibri.json) run in the browser. */
const browserReady = (m) => !m.format || m.format === "colibri";

function renderModelPicker() {
  const sel = $("model");
  sel.replaceChildren();
  for (const m of state.models) {
    const label = browserReady(m) ? m.id : `${m.id} (convert it to run here)`;
    sel.append(h("option", { value: m.id, disabled: !browserReady(m) }, label));
  }
  if (!state.models.length) sel.append(h("option", { value: "" }, "no models"));
  sel.value = state.modelId || "";
  sel.disabled = !state.models.length || state.loading;
}

async function start() {
  clearTimeout(state.retryTimer);
  try {
    state.models = await fetchModels();
  } catch (_) {
    document.body.dataset.state = "offline";
    helperDownNotice();
    state.retryTimer = setTimeout(start, 5000);
    return;
  }
  dismiss("helper");
  const usable = state.models.filter(browserReady);
  const wanted = new URLSearchParams(location.search).get("model") || state.conv?.model || state.settings.model;
  const pick = usable.find((m) => m.id === wanted) || usable[0];
  renderModelPicker();
  if (!pick) {
    document.body.dataset.state = "no-model";
    notice("models", "warn", state.models.length
      ? ["None of the helper's models is converted for the browser. Convert one with ", code("coli convert SRC -o DST --quant int4"), " into the models directory."]
      : ["The helper serves no models yet. Put a converted model in its models directory, or start it with ", code("coli serve --model DIR"), "."]);
    return;
  }
  dismiss("models");
  if (pick.id !== state.modelId || !state.engine) await loadModel(pick.id);
}

async function loadModel(id) {
  if (state.busy) stop();
  if (state.engine) state.engine.terminate();
  state.engine = null;
  state.modelId = id;
  state.loading = true;
  state.settings.model = id;
  store.saveSettings(state.settings);
  document.body.dataset.state = "loading";
  setComposerEnabled(false);
  renderModelPicker();
  dismiss("load");
  state.modelSize = (state.models.find((m) => m.id === id) || {}).size || 0;
  state.examples = [];
  renderExamples();
  const bar = $("progress-bar");
  $("progress").hidden = false;
  bar.removeAttribute("value"); // indeterminate until the first byte counts come
  $("progress-text").textContent = `Starting the engine for ${id}…`;
  $("progress-eta").textContent = "";
  const t0 = performance.now();
  $("progress").dataset.phase = "starting";
  const onProgress = ({ phase, loaded, total }) => {
    if (phase === "ready") return;
    $("progress").dataset.phase = phase;
    if (phase === "gpu") {
      // `auto` times one decode step on each backend; no bytes move meanwhile.
      bar.removeAttribute("value");
      $("progress-text").textContent = backendChoice(state.settings) === "auto"
        ? `${id}: measuring WebGPU vs CPU (one step on each, to keep the faster)…`
        : `${id}: starting WebGPU…`;
      $("progress-eta").textContent = "";
      return;
    }
    const secs = (performance.now() - t0) / 1000;
    const rate = loaded / Math.max(secs, 1e-3);
    bar.max = total || 1;
    bar.value = loaded;
    $("progress-text").textContent = `${id}: fetching weights, ${formatBytes(loaded)} of ${formatBytes(total)}`;
    $("progress-eta").textContent = loaded > 0 && loaded < total ? formatSeconds((total - loaded) / rate) : "";
  };
  try {
    // "auto" measures WebGPU against the CPU backend and keeps the faster; ?backend=webgpu
    // or ?backend=cpu in the page's URL forces one.
    const backend = backendChoice(state.settings);
    // ?hybrid=on|auto: hybrid expert placement on WebGPU; ?gpuPool=BYTES sizes its expert pool.
    const query = new URLSearchParams(location.search);
    const hybrid = ["on", "auto"].includes(query.get("hybrid")) ? query.get("hybrid") : undefined;
    const engine = await load({ model: id, backend, helper: HELPER, onProgress, hybrid, gpuPoolBytes: Number(query.get("gpuPool")) || undefined });
    if (state.modelId !== id) return engine.terminate(); // another model was picked meanwhile
    state.engine = engine;
    state.info = engine.info?.info || {};
    // The engine's sampling defaults for chat (generation_config.json; greedy where
    // do_sample is false: the demo model's arithmetic is exact greedily and slips when sampled).
    state.modelDefaults = state.info.sampling || {};
    showModelDefaults();
    engine.addEventListener("route", (e) => brain.route(e.detail));
    engine.addEventListener("stats", (e) => scheduleStats(e.detail));
    const i = state.info;
    brain.reset(i.layers || 0, i.experts || 0, i.moeLayers || []);
    engine.expertTiers().then((tiers) => brain.route({ counts: [], tiers }), () => {});
    renderLegend();
    renderStats(engine.stats());
    loadExamples(id);
    document.body.dataset.state = "ready";
    recount();
    keepForOffline(id);
    $("backend").textContent = backendLabel(engine.stats().backend);
    $("backend").title = backendTitle(engine.stats());
    refreshStorage();
    const ds = engine.stats();
    if (ds.diskEnabled === false && ds.diskError && ds.diskError !== "disabled") {
      notice("disk", "warn", [`Browser storage is not available (${ds.diskError}), so experts are fetched from the helper again after every reload.`]);
    }
  } catch (e) {
    if (state.modelId !== id) return;
    document.body.dataset.state = "error";
    if (!(await helperUp())) helperDownNotice();
    else notice("load", "error", [h("strong", {}, `Could not load ${id}: `), String(e.message || e)],
      [h("button", { class: "btn small-btn", type: "button", onclick: () => loadModel(id) }, "Try again")]);
  } finally {
    if (state.modelId === id) {
      state.loading = false;
      $("progress").hidden = true;
      renderModelPicker();
      setComposerEnabled(!!state.engine);
    }
  }
}

const backendLabel = (b) => (b === "webgpu" ? "WebGPU" : "CPU · wasm");

function backendTitle(s) {
  const ms = (x) => `${x.toFixed(1)} ms`;
  const measured = s.auto ? ` One decode step took ${ms(s.auto.webgpuMs)} on WebGPU and ${ms(s.auto.cpuMs)} on the CPU backend.` : "";
  if (s.backend === "webgpu") return `The model runs on WebGPU (${s.adapter || "GPU"}).${measured}`;
  const threads = s.threads > 1 ? ` It computes on ${s.threads} threads.` : ` It computes on one thread${s.threadsReason ? ` (${s.threadsReason})` : ""}.`;
  if (!navigator.gpu) return `No WebGPU in this browser: colibri runs the model on its WebAssembly CPU backend.${threads}`;
  return s.auto
    ? `This browser has WebGPU, but the WebAssembly CPU backend is faster for this model here, so the model runs there.${measured}${threads}`
    : `This browser has WebGPU, but no WebGPU device could be opened: the model runs on the WebAssembly CPU backend.${threads}`;
}

function webgpuNotice() {
  if (navigator.gpu) return;
  notice("webgpu", "info", [
    h("strong", {}, "No WebGPU in this browser. "),
    "colibri runs the model on its CPU backend (WebAssembly, in a worker): the answers are the same, large models are slower. ",
    "Chrome, Edge and recent Safari and Firefox have WebGPU.",
  ]);
}

// ---------------------------------------------------------------- conversations

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren();
  const query = $("search").value;
  const shown = store.listConversations().filter((c) => matches(c, query));
  $("no-match").hidden = !query.trim() || shown.length > 0;
  for (const c of shown) {
    const active = state.conv && c.id === state.conv.id;
    const item = h("li", { class: active ? "active" : "", "data-id": c.id });
    item.append(
      h("button", { class: "open", type: "button", "aria-current": active ? "true" : false, onclick: () => openConversation(c.id) },
        h("span", {}, c.title), h("small", {}, `${c.model || ""} · ${new Date(c.updated).toLocaleString()}`)),
      h("button", { class: "link-btn ren", type: "button", "aria-label": `Rename conversation ${c.title}`, title: "Rename", onclick: () => startRename(item, c) }, "✎"),
      h("button", { class: "link-btn del", type: "button", "aria-label": `Delete conversation ${c.title}`, onclick: () => removeConversation(c.id) }, "✕"));
    list.append(item);
  }
  $("export").hidden = !state.conv?.messages.length;
}

function startRename(item, c) {
  const box = h("input", { class: "rename-box", type: "text", "aria-label": "Conversation name", maxlength: 120 });
  box.value = c.customTitle || c.title;
  let done = false;
  const finish = (save) => {
    if (done) return;
    done = true;
    if (save) {
      const conv = state.conv?.id === c.id ? state.conv : c;
      if (!store.renameConversation(conv, box.value)) notice("save", "warn", ["This browser refused to save the conversation (storage full or disabled)."]);
    }
    renderConversations();
  };
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      finish(true);
    } else if (e.key === "Escape") {
      e.stopPropagation();
      finish(false);
    }
  });
  box.addEventListener("blur", () => finish(true));
  item.replaceChildren(box);
  box.focus();
  box.select();
}

/** Downloads the open conversation as `kind` ("json" | "md"). */
function exportConversation(kind) {
  const conv = state.conv;
  if (!conv?.messages.length) return;
  const text = kind === "json" ? store.conversationJson(conv) : store.conversationMarkdown(conv);
  const type = kind === "json" ? "application/json" : "text/markdown";
  const name = `${(conv.title || "chat").replace(/[^\p{L}\p{N}]+/gu, "-").replace(/^-+|-+$/g, "").slice(0, 60) || "chat"}.${kind}`;
  const url = URL.createObjectURL(new Blob([text], { type: `${type};charset=utf-8` }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function openConversation(id) {
  if (state.busy) stop();
  const c = store.getConversation(id);
  if (!c) return;
  state.conv = c;
  store.setActiveId(c.id);
  renderConversations();
  renderMessages();
  closeDrawers();
  $("prompt").focus();
}

function newChat() {
  if (state.busy) stop();
  state.conv = store.newConversation(state.modelId);
  store.setActiveId(null);
  renderConversations();
  renderMessages();
  closeDrawers();
  $("prompt").focus();
}

// Conversations deleted (and not brought back): an answer still streaming into one does not save it again.
const deleted = new WeakSet();

function removeConversation(id) {
  const gone = store.getConversation(id);
  if (gone) deleted.add(gone);
  const wasOpen = state.conv?.id === id;
  store.deleteConversation(id);
  if (wasOpen) newChat();
  else renderConversations();
  if (gone) offerUndo(gone, wasOpen);
}

/** "Deleted …  Undo" for UNDO_MS: Undo stores the conversation again (and reopens it). */
function offerUndo(conv, reopen) {
  const key = "undo-delete";
  notice(key, "info", [`Deleted “${conv.title}”. `], [h("button", { class: "btn small-btn undo", type: "button", onclick: () => {
    dismiss(key);
    deleted.delete(conv);
    if (!store.putConversation(conv)) notice("save", "warn", ["This browser refused to save the conversation (storage full or disabled)."]);
    if (reopen && !state.busy) openConversation(conv.id);
    else renderConversations();
  } }, "Undo")]);
  const shown = document.querySelector(`[data-notice="${key}"]`);
  setTimeout(() => shown.remove(), UNDO_MS);
}

/** Imports chats exported as JSON (files from the Import picker); opens the first. */
async function importChats(files) {
  const added = [];
  for (const f of files) {
    try {
      const convs = parseImport(await f.text(), (id) => !!store.getConversation(id));
      for (const c of convs) if (store.putConversation(c)) added.push(c);
    } catch (e) {
      notice("import", "warn", [`Could not import ${f.name}: ${e.message}.`]);
    }
  }
  if (!added.length) return;
  if (!state.busy) openConversation(added[0].id);
  else renderConversations();
  notice("import", "info", [`Imported ${added.length} chat${added.length === 1 ? "" : "s"}.`]);
}

function persist(conv) {
  if (!store.saveConversation(conv)) notice("save", "warn", ["This browser refused to save the conversation (storage full or disabled)."]);
  if (state.conv === conv) store.setActiveId(conv.id);
  renderConversations();
}

// After an answer, the message box gets the focus back unless the user has moved on.
function refocusPrompt() {
  const a = document.activeElement;
  if (!a || a === document.body || a.id === "prompt" || a.id === "stop" || a.id === "send" || a.closest?.(".msg")) $("prompt").focus();
}

// ---------------------------------------------------------------- example prompts

// A model directory may hold examples.json, {"prompts": ["...", ...]}: questions the model
// answers well, offered on an empty chat (models/demo ships one).
const MAX_EXAMPLES = 8;
async function loadExamples(id) {
  let prompts = [];
  try {
    const r = await fetch(`${HELPER}/models/${encodeURIComponent(id)}/examples.json`, { cache: "no-store" });
    if (r.ok) {
      const body = await r.json();
      const list = Array.isArray(body) ? body : body?.prompts;
      if (Array.isArray(list)) prompts = list.filter((p) => typeof p === "string" && p.trim()).slice(0, MAX_EXAMPLES);
    }
  } catch (_) {}
  if (state.modelId !== id) return;
  state.examples = prompts;
  renderExamples();
}

function renderExamples() {
  const box = $("examples");
  box.replaceChildren(...(state.examples || []).map((p) =>
    h("button", { class: "example", type: "button", onclick: () => useExample(p) }, p)));
  box.hidden = !box.childElementCount;
}

function useExample(text) {
  if (state.busy || !state.engine) return;
  $("prompt").value = text;
  send();
}

// ---------------------------------------------------------------- messages

function renderMessages() {
  const box = $("messages");
  const start = contextStart(state.conv);
  const views = (state.conv?.messages || []).map((m, i) => {
    const v = messageView(m, i);
    if (i < start) v.classList.add("out-of-context");
    return v;
  });
  // Where the context begins: the messages above were dropped to fit it (fit_chat in the engine).
  if (start > 0) views.splice(start, 0, contextNote(start));
  box.replaceChildren(...views);
  $("empty").hidden = !!state.conv?.messages.length;
  box.scrollTop = box.scrollHeight;
  recount();
}

let countTokens = null;
/** Counts, before sending, the tokens the chat with the typed message takes (token_count.js). */
function recount() {
  countTokens ??= tokenCounter($("token-count"), () => state.busy);
  const conv = state.conv;
  const messages = [];
  if (state.settings.system.trim()) messages.push({ role: "system", content: state.settings.system.trim() });
  for (const m of conv?.messages.slice(contextStart(conv)) || []) messages.push({ role: m.role, content: m.content });
  const draft = $("prompt").value.trim();
  if (draft) messages.push({ role: "user", content: draft });
  countTokens({ engine: state.engine, messages, contextLength: state.info?.contextLength, answerTokens: Number(state.settings.maxTokens) || 0 });
}

/** How many of the conversation's first messages no longer fit the model's context. */
function contextStart(conv) {
  return Math.min(conv?.contextStart || 0, conv?.messages.length || 0);
}

function contextNote(n) {
  const ctx = state.info?.contextLength;
  const what = n === 1 ? "The message above no longer fits" : `The ${n} messages above no longer fit`;
  return h("div", { class: "context-note", role: "note" },
    `${what} the model's context${ctx ? ` (${ctx} tokens)` : ""}: they were dropped, and the model no longer sees them. `,
    h("button", { class: "link-btn", type: "button", onclick: () => newChat() }, "Start a new chat"));
}

function fillBubble(bubble, m) {
  if (m.role === "assistant") bubble.replaceChildren(renderMarkdown(m.content));
  else bubble.textContent = m.content;
}

function messageView(m, i) {
  const msgs = state.conv.messages;
  const last = i === msgs.length - 1;
  const bubble = h("div", { class: "bubble" });
  fillBubble(bubble, m);
  const meta = h("div", { class: "meta" });
  const view = h("div", { class: "msg", "data-role": m.role, "data-index": i }, bubble, meta);
  if (m.stopped) meta.append(h("span", { class: "tag" }, "stopped"));
  if (m.cut) meta.append(h("span", { class: "tag cut", title: "The page was reloaded or closed while this answer was being written" }, "cut off"));
  if (m.streaming && !state.busy) meta.append(h("span", { class: "tag cut", title: "Another tab is writing this answer, or it was cut off" }, "unfinished"));
  const speed = m.role === "assistant" ? speedLabel(m) : "";
  if (speed) meta.append(h("span", { class: "speed", title: "Tokens of this answer, and how fast they came after the first" }, speed));
  if (m.finish === "length") meta.append(h("span", { class: "tag", title: "The answer reached Max tokens or the model's context window" }, "length limit"));
  if (m.error) meta.append(h("span", { class: "tag" }, `error: ${m.error}`));
  const idle = !state.busy;
  if (m.role === "user" && idle) {
    meta.append(h("button", { class: "link-btn", type: "button", "aria-label": "Edit this message and resend", onclick: () => editMessage(view, i) }, "Edit"));
  }
  if (m.role === "assistant" && idle) {
    meta.append(copyButton(() => m.content));
    if (last) meta.append(h("button", { class: "link-btn regen", type: "button", "aria-label": "Regenerate this answer", onclick: regenerate }, "Regenerate"));
  }
  return view;
}

/** "Copy" that says what happened: "Copied", or "Copy failed" (no clipboard access). */
function copyButton(text) {
  const btn = h("button", { class: "link-btn copy", type: "button", "aria-label": "Copy this answer" }, "Copy");
  let timer = 0;
  btn.addEventListener("click", async () => {
    let ok = false;
    try {
      await navigator.clipboard.writeText(text());
      ok = true;
    } catch (_) { /* no clipboard permission, or an insecure context */ }
    btn.textContent = ok ? "Copied" : "Copy failed";
    btn.classList.toggle("copied", ok);
    clearTimeout(timer);
    timer = setTimeout(() => {
      btn.textContent = "Copy";
      btn.classList.remove("copied");
    }, 1500);
  });
  return btn;
}

function editMessage(view, i) {
  const m = state.conv.messages[i];
  const box = h("textarea", { class: "edit-box", "aria-label": "Edit message" });
  box.value = m.content;
  const done = () => renderMessages();
  const resend = () => {
    const text = box.value.trim();
    if (!text) return;
    state.conv.messages = state.conv.messages.slice(0, i);
    state.conv.contextStart = Math.min(contextStart(state.conv), i);
    state.conv.messages.push({ role: "user", content: text });
    persist(state.conv);
    renderMessages();
    reply();
  };
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      resend();
    } else if (e.key === "Escape") {
      e.stopPropagation();
      done();
    }
  });
  view.replaceChildren(box, h("div", { class: "edit-actions" },
    h("button", { class: "btn", type: "button", onclick: done }, "Cancel"),
    h("button", { class: "btn primary", type: "button", onclick: resend }, "Send")));
  box.focus();
}

function regenerate() {
  const msgs = state.conv?.messages;
  if (state.busy || !msgs?.length || msgs.at(-1).role !== "assistant") return;
  msgs.pop();
  persist(state.conv);
  renderMessages();
  reply();
}

function setComposerEnabled(on) {
  $("prompt").disabled = !on;
  $("send").disabled = !on;
}

function setBusy(busy) {
  state.busy = busy;
  document.body.dataset.state = busy ? "generating" : state.engine ? "ready" : document.body.dataset.state;
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("messages").setAttribute("aria-busy", busy ? "true" : "false");
  $("clear-cache").disabled = busy || !state.modelId;
}

function send() {
  const text = $("prompt").value.trim();
  if (!text || state.busy || !state.engine) return;
  if (!state.conv) state.conv = store.newConversation(state.modelId);
  state.conv.messages.push({ role: "user", content: text });
  $("prompt").value = "";
  autoGrow();
  persist(state.conv);
  renderMessages();
  reply();
}

function samplingRequest() {
  const s = state.settings;
  const num = (v, d) => (Number.isFinite(Number(v)) && v !== "" ? Number(v) : d);
  // Temperature and top-p only when the settings say: else the engine's turn decides
  // (generation_config.json, else the API's fallback), the same as the helper's server.
  const req = {
    max_tokens: Math.max(1, Math.floor(num(s.maxTokens, 256))),
    seed: s.seed === "" ? Math.floor(Math.random() * 2 ** 31) : Math.max(0, Math.floor(num(s.seed, 0))),
  };
  const t = num(s.temperature, undefined);
  const p = num(s.topP, undefined);
  if (t !== undefined) req.temperature = Math.max(0, t);
  if (p !== undefined) req.top_p = Math.min(1, Math.max(0.01, p));
  return req;
}

/** Streams the assistant's answer to the conversation as it stands. */
async function reply() {
  const conv = state.conv;
  const engine = state.engine;
  if (!conv || !engine || state.busy) return;
  const messages = [];
  if (state.settings.system.trim()) messages.push({ role: "system", content: state.settings.system.trim() });
  for (const m of conv.messages.slice(contextStart(conv))) messages.push({ role: m.role, content: m.content });
  const msg = { role: "assistant", content: "" };
  conv.messages.push(msg);
  conv.model = state.modelId;
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  renderMessages();
  let view = $("messages").lastElementChild;
  view.classList.add("streaming");
  // The partial answer is saved as it grows: a reload keeps it (answers.js).
  const progress = follow(msg, () => deleted.has(conv) || persist(conv));
  let frame = 0;
  const paint = () => {
    frame = 0;
    if (state.conv !== conv) return;
    fillBubble(view.querySelector(".bubble"), msg);
    const box = $("messages");
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 160) box.scrollTop = box.scrollHeight;
  };
  try {
    const stream = engine.chat.completions.create({ messages, stream: true, stream_options: { include_usage: true }, signal: controller.signal, ...samplingRequest() });
    for await (const chunk of stream) {
      if (chunk.usage) progress.usage(chunk.usage);
      if (!chunk.choices?.length) continue;
      // The engine dropped the oldest turns to fit the context: they stay on screen, marked.
      if (chunk.dropped_messages) conv.contextStart = contextStart(conv) + chunk.dropped_messages;
      const c = chunk.choices[0];
      if (c.delta?.content) {
        msg.content += c.delta.content;
        progress.piece();
        if (!frame) frame = requestAnimationFrame(paint);
      }
      if (c.finish_reason) msg.finish = c.finish_reason;
    }
  } catch (e) {
    if (state.engine === engine) {
      msg.error = String(e.message || e);
      if (!(await helperUp())) helperDownNotice();
    } else msg.stopped = true; // the engine was replaced or terminated mid-answer
  }
  if (controller.signal.aborted) {
    msg.stopped = true;
    delete msg.finish;
  }
  progress.end();
  if (state.controller === controller) {
    state.controller = null;
    setBusy(false);
  }
  if (!deleted.has(conv)) persist(conv);
  if (state.conv === conv) {
    const hadFocus = document.activeElement;
    renderMessages();
    if (hadFocus && !hadFocus.isConnected) $("prompt").focus();
    else refocusPrompt();
  }
  refreshStorage();
}

function stop() {
  if (state.controller) state.controller.abort();
}

// ---------------------------------------------------------------- settings and layout

function bindSettings() {
  const s = state.settings;
  const fields = [["system", "system"], ["temperature", "temperature"], ["top-p", "topP"], ["max-tokens", "maxTokens"], ["seed", "seed"]];
  for (const [id, key] of fields) {
    const input = $(id);
    input.value = s[key];
    input.addEventListener("change", () => {
      s[key] = input.type === "number" && input.value !== "" ? Number(input.value) : input.value;
      if (key === "seed" && input.value === "") s.seed = "";
      store.saveSettings(s);
    });
  }
}

function autoGrow() {
  const t = $("prompt");
  t.style.height = "auto";
  t.style.height = `${Math.min(t.scrollHeight + 2, window.innerHeight * 0.4)}px`;
}

const narrow = () => window.matchMedia("(max-width: 1100px)").matches;

function toggleDrawer(which) {
  const cls = `${which}-open`;
  const btn = $(`toggle-${which}`);
  if (which === "panel" && !narrow()) {
    const closed = document.body.classList.toggle("panel-closed");
    btn.setAttribute("aria-expanded", String(!closed));
    return;
  }
  const open = !document.body.classList.contains(cls);
  closeDrawers();
  document.body.classList.toggle(cls, open);
  btn.setAttribute("aria-expanded", String(open));
  $("scrim").hidden = !open;
  if (open) $(which === "panel" ? "panel" : "sidebar").querySelector("button, input, textarea, summary")?.focus();
}

function closeDrawers() {
  for (const w of ["sidebar", "panel"]) {
    if (document.body.classList.contains(`${w}-open`)) {
      document.body.classList.remove(`${w}-open`);
      const toggle = $(`toggle-${w}`);
      toggle.setAttribute("aria-expanded", "false");
      if ($(w).contains(document.activeElement)) toggle.focus();
    }
  }
  $("scrim").hidden = true;
}

function bindUi() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("prompt").addEventListener("input", autoGrow);
  $("prompt").addEventListener("input", recount);
  $("stop").addEventListener("click", () => {
    stop();
    $("prompt").focus();
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if (state.busy) {
      e.preventDefault();
      stop();
      $("prompt").focus();
    } else closeDrawers();
  });
  $("new-chat").addEventListener("click", newChat);
  $("search").addEventListener("input", renderConversations);
  $("import").addEventListener("change", (e) => {
    importChats([...e.target.files]);
    e.target.value = "";
  });
  $("export-json").addEventListener("click", () => exportConversation("json"));
  $("export-md").addEventListener("click", () => exportConversation("md"));
  $("theme").addEventListener("click", () => cycleTheme(state.settings));
  $("model").addEventListener("change", (e) => loadModel(e.target.value));
  $("clear-cache").addEventListener("click", clearModelCache);
  $("persist").addEventListener("click", async () => {
    const r = await requestPersistentStorage();
    if (!r.persisted) notice("persist", "info", "The browser did not grant persistent storage (it decides, for example by how much this site is used); cached experts may be evicted when space runs low.");
    refreshStorage();
  });
  $("toggle-sidebar").addEventListener("click", () => toggleDrawer("sidebar"));
  $("toggle-panel").addEventListener("click", () => toggleDrawer("panel"));
  $("scrim").addEventListener("click", closeDrawers);
  for (const b of document.querySelectorAll(".close-drawer")) b.addEventListener("click", closeDrawers);
  $("toggle-panel").setAttribute("aria-expanded", String(!narrow()));
  window.addEventListener("resize", () => brain.draw());
}

// ---------------------------------------------------------------- start

registerOffline();
bindSettings();
bindBackendPicker($("backend-pick"), state.settings, (s) => store.saveSettings(s), () => state.modelId && loadModel(state.modelId));
bindUi();
applyTheme(state.settings);
webgpuNotice();
await store.open({ onError: (e) => notice("save", "warn", [`This browser refused to save the conversation (${e?.name || "storage full or disabled"}).`]) });
// Answers left streaming by a page that went away (a reload mid-answer) are kept, marked as cut.
for (const c of markCut(store.listConversations())) persist(c);
state.conv = store.getConversation(store.activeId()) || store.newConversation(null);
renderConversations();
renderMessages();
renderStats({ tiers: {} });
renderLegend();
brain.draw();
start();
setTimeout(watchHelper, WATCH_MS);
