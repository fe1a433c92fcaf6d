// offline.js — the page's side of sw.js: registers the service worker, and once a model
// is loaded keeps what a later visit needs with no helper (the app shell, the model list,
// the model's small files) in the same cache, since the very first visit's requests came
// before the service worker controlled the page.

const CACHE = "colibri-app-v1";
// Relative to this module: the page's folder. Every module the page imports must be here
// (tests/e2e/offline_shell.test.mjs checks it), or the page cannot open offline.
const SHELL = [
  "./", "index.html", "/app.css", "/app.js", "/answers.js", "/backend_pick.js", "/brain.js", "/chat_list.js",
  "/colibri.js", "/colibri-worker.js", "/dom.js", "/markdown.js", "/offline.js", "/stats_panel.js",
  "/storage_panel.js", "/store.js", "/theme.js", "/token_count.js",
  "/pkg/colibri_wasm.js", "/pkg/colibri_wasm_bg.wasm",
  "/pkg-threads/colibri_wasm.js", "/pkg-threads/colibri_wasm_bg.wasm",
];
const MODEL_FILES = ["colibri.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "examples.json"];

/** Registers sw.js (where the browser has service workers); never throws. */
export async function registerOffline() {
  try {
    if ("serviceWorker" in navigator) await navigator.serviceWorker.register(new URL("sw.js", import.meta.url), { scope: new URL("./", import.meta.url).pathname });
  } catch (_) {
    // No service worker (a private window, an insecure origin): the page needs the helper.
  }
}

/** Keeps the shell and model `id`'s small files for visits without the helper; never throws. */
export async function keepForOffline(id) {
  if (!("caches" in self)) return;
  try {
    const cache = await caches.open(CACHE);
    const base = `/models/${encodeURIComponent(id)}/`;
    const urls = [...SHELL.map((f) => new URL(f, import.meta.url).href), "/api/models", ...MODEL_FILES.map((f) => base + f)];
    // One at a time, in the background: a missing file (no threaded build, no examples) is skipped.
    for (const u of urls) {
      const r = await fetch(u).catch(() => null);
      if (r && r.status === 200) await cache.put(u, r);
    }
  } catch (_) {
    // A full quota: the page still works with the helper.
  }
}
