// widget.js — <colibri-chat>: a chat box for any page, running colibri in the visitor's tab.
//
//   <script type="module" src="http://127.0.0.1:7878/widget.js"></script>
//   <colibri-chat model="demo" placeholder="Ask me" theme="dark"></colibri-chat>
//
// Attributes: model (default "demo"), helper (the helper's URL; default: where this script
// came from), placeholder, theme ("light" | "dark"; default: the system's), system (a
// system prompt). A page of another origin must be allowed by the helper:
// `coli serve --allow-origin https://your.site` (see docs/widget.md). The helper serves
// this file and markdown.js to every origin, so that on a page it refuses the widget can
// say which flag to add; a copy of both files on the page's own site can also say that
// the helper is not running.
// Events (bubbling, composed): "colibri-ready" {model}, "colibri-error" {message}.
// Nothing of the model's text is parsed as HTML (markdown.js builds text nodes).

const SCRIPT_ORIGIN = new URL(import.meta.url).origin;
const DEFAULT_PORT = "7878";

// Markdown from the file next to this one; plain text if it cannot be loaded.
const markdown = import(new URL("./markdown.js", import.meta.url).href).catch(() => ({
  renderMarkdown: (text) => document.createTextNode(text),
}));

const STYLE = `
:host { display: block; height: 480px; min-height: 240px; --bg: #fff; --fg: #1c1d1f; --muted: #6a6e74; --border: #dcdcd8;
  --accent: #0f8f81; --accent-fg: #fff; --user: #e3f3f0; --code-bg: #1f2428; --err: #c2412d; --err-bg: #fdecea;
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
:host([theme="dark"]) { --bg: #1d2024; --fg: #e8e8e6; --muted: #9aa0a6; --border: #363b41; --accent: #2bb8a6; --accent-fg: #08201d;
  --user: #1f3633; --err: #ef8a76; --err-bg: #3b1f1c; }
@media (prefers-color-scheme: dark) {
  :host(:not([theme])) { --bg: #1d2024; --fg: #e8e8e6; --muted: #9aa0a6; --border: #363b41; --accent: #2bb8a6; --accent-fg: #08201d;
    --user: #1f3633; --err: #ef8a76; --err-bg: #3b1f1c; }
}
* { box-sizing: border-box; }
[hidden] { display: none !important; }
.box { height: 100%; display: flex; flex-direction: column; background: var(--bg); border: 1px solid var(--border); border-radius: 12px; overflow: hidden; }
.head { display: flex; align-items: center; gap: 0.5rem; padding: 0.45rem 0.75rem; border-bottom: 1px solid var(--border); font-weight: 600; }
.dot { width: 10px; height: 10px; border-radius: 50%; background: var(--accent); }
:host([data-state="error"]) .dot { background: var(--err); }
.status { margin-left: auto; font-weight: 400; font-size: 0.78rem; color: var(--muted); }
button.new { font: inherit; font-size: 0.78rem; font-weight: 400; color: var(--fg); background: transparent; border: 1px solid var(--border); border-radius: 6px; padding: 0.1rem 0.5rem; cursor: pointer; }
.error button { font: inherit; font-size: 0.8rem; margin-top: 0.4rem; border: 1px solid var(--err); background: transparent; color: var(--fg); border-radius: 6px; padding: 0.1rem 0.6rem; cursor: pointer; }
progress { width: 100%; height: 4px; display: block; accent-color: var(--accent); border: 0; }
.log { flex: 1; overflow-y: auto; padding: 0.7rem; }
.msg { margin-bottom: 0.6rem; display: flex; flex-direction: column; }
.bubble { padding: 0.45rem 0.7rem; border-radius: 10px; overflow-wrap: anywhere; max-width: 100%; }
.user .bubble { background: var(--user); align-self: flex-end; white-space: pre-wrap; max-width: 88%; }
.assistant .bubble { border: 1px solid var(--border); }
.bubble > :first-child { margin-top: 0; } .bubble > :last-child { margin-bottom: 0; }
.bubble p { margin: 0.35rem 0; }
.bubble code { font: 0.88em ui-monospace, Menlo, Consolas, monospace; background: rgba(127,127,127,0.16); padding: 0 0.25rem; border-radius: 4px; }
.md-table { margin: 0.5rem 0; overflow-x: auto; }
.md-table table { border-collapse: collapse; font-size: 0.9em; }
.md-table th, .md-table td { border: 1px solid var(--border); padding: 0.2rem 0.5rem; }
.md-code { margin: 0.5rem 0; border-radius: 8px; overflow: hidden; background: var(--code-bg); }
.md-code-bar { display: flex; justify-content: space-between; padding: 0.15rem 0.5rem; font-size: 0.72rem; color: #aab; }
.md-copy { background: none; border: 1px solid rgba(255,255,255,0.2); color: #dde; border-radius: 5px; font-size: 0.72rem; cursor: pointer; }
.md-code pre { margin: 0; padding: 0.5rem 0.7rem; overflow-x: auto; }
.md-code code { background: none; color: #e6e6e6; padding: 0; white-space: pre; }
.bubble a { color: var(--accent); }
.tag { font-size: 0.72rem; color: var(--muted); }
.msg.out-of-context { opacity: 0.55; }
.context-note { margin: 0 0 0.6rem; padding: 0.3rem 0; border-top: 1px dashed var(--border); border-bottom: 1px dashed var(--border); font-size: 0.75rem; color: var(--muted); text-align: center; }
.error { margin: 0.7rem; padding: 0.55rem 0.7rem; border-radius: 8px; background: var(--err-bg); color: var(--fg); border: 1px solid var(--err); font-size: 0.86rem; }
.error code { background: rgba(127,127,127,0.18); padding: 0 0.25rem; border-radius: 4px; overflow-wrap: anywhere; }
form { display: flex; gap: 0.4rem; padding: 0.5rem; border-top: 1px solid var(--border); }
textarea { flex: 1; resize: none; font: inherit; color: inherit; background: transparent; border: 1px solid var(--border); border-radius: 8px; padding: 0.4rem 0.6rem; max-height: 8rem; }
textarea:focus { outline: none; border-color: var(--accent); }
button.send { font: inherit; font-weight: 600; border: 0; border-radius: 8px; padding: 0 0.9rem; background: var(--accent); color: var(--accent-fg); cursor: pointer; }
button.send.stop { background: var(--err); color: #fff; }
button:disabled, textarea:disabled { opacity: 0.55; cursor: default; }
:focus-visible { outline: 2px solid var(--accent); outline-offset: 1px; }
.sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
`;

function h(tag, props = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, String(v));
  }
  for (const kid of kids.flat(Infinity)) if (kid != null) e.append(kid instanceof Node ? kid : String(kid));
  return e;
}

export class ColibriChat extends HTMLElement {
  static observedAttributes = ["model", "helper", "placeholder", "theme"];

  #ui = null;
  #engine = null;
  #markdown = null;
  #messages = [];
  #controller = null;
  #generation = 0; // bumps on every (re)load, so a stale load is dropped

  get helper() {
    return (this.getAttribute("helper") || SCRIPT_ORIGIN).replace(/\/+$/, "");
  }

  get model() {
    return this.getAttribute("model") || "demo";
  }

  /** "loading" | "ready" | "generating" | "error" */
  get state() {
    return this.dataset.state || "loading";
  }

  connectedCallback() {
    if (!this.#ui) this.#build();
    if (!this.#engine) this.#start();
  }

  disconnectedCallback() {
    this.#generation++;
    this.#controller?.abort();
    this.#engine?.terminate();
    this.#engine = null;
  }

  attributeChangedCallback(name, old, value) {
    if (!this.#ui || old === value) return;
    if (name === "placeholder") this.#ui.input.placeholder = value || "Message…";
    if ((name === "model" || name === "helper") && this.isConnected) {
      this.#engine?.terminate();
      this.#engine = null;
      this.#messages = [];
      this.#ui.log.replaceChildren();
      this.#start();
    }
  }

  #build() {
    const root = this.attachShadow({ mode: "open" });
    const input = h("textarea", { rows: "1", "aria-label": "Message", placeholder: this.getAttribute("placeholder") || "Message…" });
    input.disabled = true;
    const button = h("button", { class: "send", type: "submit", "aria-label": "Send message" }, "Send");
    button.disabled = true;
    const form = h("form", {}, input, button);
    const status = h("span", { class: "status", role: "status" }, "");
    const title = h("span", {}, "colibri");
    const fresh = h("button", { class: "new", type: "button", part: "new-chat", "aria-label": "Start a new chat", title: "Start a new chat (the model forgets this conversation)" }, "New chat");
    fresh.disabled = true;
    fresh.addEventListener("click", () => this.newChat());
    const progress = h("progress", { max: "1", "aria-label": "Model loading progress" });
    const log = h("div", { class: "log", role: "log", "aria-live": "polite", "aria-label": "Messages" });
    const errors = h("div", {});
    root.append(h("style", {}, STYLE), h("div", { class: "box", part: "box" },
      h("div", { class: "head", part: "header" }, h("span", { class: "dot", "aria-hidden": "true" }), title, status, fresh), progress, errors, log, form));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (this.#controller) this.#controller.abort();
      else this.#send();
    });
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        if (!this.#controller) this.#send();
      } else if (e.key === "Escape" && this.#controller) {
        this.#controller.abort();
      }
    });
    input.addEventListener("input", () => {
      input.style.height = "auto";
      input.style.height = `${input.scrollHeight + 2}px`;
    });
    this.#ui = { input, button, fresh, status, title, progress, log, errors };
  }

  /** Forgets the conversation (stopping an answer in progress) and empties the box. */
  newChat() {
    this.#controller?.abort();
    this.#messages = [];
    this.#ui?.log.replaceChildren();
    this.#ui?.input.focus();
  }

  #setState(s, text) {
    this.dataset.state = s;
    this.#ui.status.textContent = text ?? "";
    const ready = s === "ready" || s === "generating";
    this.#ui.input.disabled = !ready;
    this.#ui.button.disabled = !ready;
    this.#ui.button.textContent = s === "generating" ? "Stop" : "Send";
    this.#ui.button.classList.toggle("stop", s === "generating");
    this.#ui.button.setAttribute("aria-label", s === "generating" ? "Stop generating" : "Send message");
    this.#ui.progress.hidden = s !== "loading";
    this.#ui.fresh.disabled = !ready;
  }

  #fail(parts, retry = false) {
    this.#setState("error", "unavailable");
    const box = h("div", { class: "error", role: "alert" }, h("div", {}, parts));
    const message = box.textContent;
    if (retry) box.append(h("button", { type: "button", onclick: () => this.#start() }, "Try again"));
    this.#ui.errors.replaceChildren(box);
    this.dispatchEvent(new CustomEvent("colibri-error", { bubbles: true, composed: true, detail: { message } }));
  }

  async #start() {
    const gen = ++this.#generation;
    const helper = this.helper;
    const model = this.model;
    this.#ui.errors.replaceChildren();
    this.#ui.title.textContent = `colibri · ${model}`;
    this.#ui.progress.removeAttribute("value");
    this.#setState("loading", "connecting…");
    // The model list is behind the helper's origin allowlist: reading it proves that the
    // helper runs and allows this page, before anything heavier is fetched.
    let models;
    try {
      const r = await fetch(`${helper}/api/models`, { cache: "no-store" });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      const body = await r.json();
      models = (Array.isArray(body?.data) ? body.data : []).map((m) => m.id);
    } catch (_) {
      if (gen === this.#generation) await this.#explainUnreachable(helper);
      return;
    }
    if (gen !== this.#generation) return;
    if (!models.includes(model)) {
      this.#fail([`The colibri helper at ${helper} has no model "${model}". `,
        models.length ? ["It serves: ", models.join(", "), "."] : "It serves no models yet."]);
      return;
    }
    try {
      const [api, md] = await Promise.all([import(`${helper}/colibri.js`), markdown]);
      this.#markdown = md;
      const onProgress = ({ phase, loaded, total }) => {
        if (gen !== this.#generation) return;
        if (phase === "gpu") {
          this.#ui.progress.removeAttribute("value");
          this.#setState("loading", "measuring WebGPU vs CPU…");
        } else if (total) {
          this.#ui.progress.max = total;
          this.#ui.progress.value = loaded;
          this.#setState("loading", `fetching weights ${Math.round((100 * loaded) / total)}%`);
        }
      };
      const engine = await api.load({ model, helper, onProgress });
      if (gen !== this.#generation) return engine.terminate();
      this.#engine = engine;
      this.#setState("ready", "");
      this.dispatchEvent(new CustomEvent("colibri-ready", { bubbles: true, composed: true, detail: { model } }));
    } catch (e) {
      if (gen !== this.#generation) return;
      this.#fail([`Could not load the model "${model}" from ${helper}: ${e.message || e}`], true);
    }
  }

  // The model list could not be read: either nothing answers at `helper`, or the helper
  // refused this page's origin. A no-cors request tells them apart (it carries no Origin,
  // so a running helper answers it, opaquely).
  async #explainUnreachable(helper) {
    const origin = location.origin;
    const running = await fetch(`${helper}/health`, { mode: "no-cors", cache: "no-store" }).then(() => true, () => false);
    const url = new URL(helper);
    const port = url.port && url.port !== DEFAULT_PORT ? ` --port ${url.port}` : "";
    const cmd = h("code", {}, `coli serve${port} --allow-origin ${origin}`);
    this.#fail(running
      ? ["This site is not allowed: start coli with ", h("code", {}, `--allow-origin ${origin}`), ". The colibri helper at ", helper,
        " refuses pages of ", origin, "; stop it and start it again with ", cmd, "."]
      : ["The colibri helper is not running at ", helper, ". Start it with ", cmd,
        " (from a source checkout: ", h("code", {}, `./tools/start.sh${port} --allow-origin ${origin}`), "), then try again."], true);
  }

  async #send() {
    const text = this.#ui.input.value.trim();
    if (!text || !this.#engine || this.#controller) return;
    this.#ui.input.value = "";
    this.#ui.input.style.height = "auto";
    const conversation = this.#messages; // "New chat" replaces it; this answer stays with it
    conversation.push({ role: "user", content: text });
    this.#append("user", text);
    const reply = { role: "assistant", content: "" };
    const view = this.#append("assistant", "");
    const controller = new AbortController();
    this.#controller = controller;
    this.#setState("generating", "answering…");
    const messages = [];
    const system = this.getAttribute("system");
    if (system) messages.push({ role: "system", content: system });
    messages.push(...conversation);
    let frame = 0;
    const paint = () => {
      frame = 0;
      view.bubble.replaceChildren(this.#markdown.renderMarkdown(reply.content));
      this.#ui.log.scrollTop = this.#ui.log.scrollHeight;
    };
    try {
      const stream = this.#engine.chat.completions.create({ messages, stream: true, signal: controller.signal, max_tokens: 256 });
      for await (const chunk of stream) {
        if (chunk.dropped_messages) this.#dropOldest(conversation, chunk.dropped_messages);
        const d = chunk.choices[0].delta?.content;
        if (d) {
          reply.content += d;
          if (!frame) frame = requestAnimationFrame(paint);
        }
      }
    } catch (e) {
      view.meta.textContent = `error: ${e.message || e}`;
    }
    if (controller.signal.aborted) view.meta.textContent = "stopped";
    conversation.push(reply);
    paint();
    this.#controller = null;
    if (this.#engine) this.#setState("ready", "");
    this.#ui.input.focus();
  }

  // The engine dropped the `n` oldest messages to fit the model's context (fit_chat): they
  // leave the conversation the widget sends, stay on screen dimmed, under a note.
  #dropOldest(conversation, n) {
    conversation.splice(0, n);
    const log = this.#ui.log;
    const msgs = [...log.querySelectorAll(".msg:not(.out-of-context)")];
    for (const m of msgs.slice(0, n)) m.classList.add("out-of-context");
    log.querySelector(".context-note")?.remove();
    const first = log.querySelector(".msg:not(.out-of-context)");
    const dropped = log.querySelectorAll(".msg.out-of-context").length;
    const note = h("div", { class: "context-note", role: "note", part: "context-note" },
      `${dropped === 1 ? "The message above no longer fits" : `The ${dropped} messages above no longer fit`} the model's context: the model no longer sees ${dropped === 1 ? "it" : "them"}. "New chat" starts afresh.`);
    log.insertBefore(note, first);
  }

  #append(role, text) {
    const bubble = h("div", { class: "bubble" });
    if (role === "user") bubble.textContent = text;
    const meta = h("span", { class: "tag" });
    this.#ui.log.append(h("div", { class: `msg ${role}`, "data-role": role }, bubble, meta));
    this.#ui.log.scrollTop = this.#ui.log.scrollHeight;
    return { bubble, meta };
  }
}

if (!customElements.get("colibri-chat")) customElements.define("colibri-chat", ColibriChat);
