// sw.js — the chat page's service worker: it keeps the app shell (the page, its modules,
// the engine's wasm) and the small files of the models it loaded (colibri.json, the
// tokenizer, generation_config.json, examples.json) and the model list, so that the page
// opens and chats with no helper running when the model's weights are in browser storage
// (OPFS: the dense copy and the experts the engine kept there).
//
// Network first, always: while the helper runs, every answer comes from it (and refreshes
// the kept copy); the kept copy answers only when the network fails. Range requests (the
// weights), anything but GET, /health and the rest of the API pass through untouched.

const CACHE = "colibri-app-v1";

const MODEL_FILES = /^\/models\/[^/]+\/(colibri\.json|tokenizer\.json|tokenizer_config\.json|generation_config\.json|examples\.json)$/;
const SHELL = /^\/([\w-]+\.(html|js|css|svg|png|ico)|pkg(-threads)?\/.+\.(js|wasm))?$/;

/** Whether a GET of `path` is kept for offline use: the API's at the origin's root, the
 * shell's under this worker's scope (the page may be served from a folder). */
function kept(path) {
  const scope = new URL(self.registration.scope).pathname;
  const shell = path.startsWith(scope) && SHELL.test(`/${path.slice(scope.length)}`);
  return path === "/api/models" || MODEL_FILES.test(path) || shell;
}

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));

self.addEventListener("fetch", (e) => {
  const r = e.request;
  if (r.method !== "GET" || r.headers.has("range")) return;
  const url = new URL(r.url);
  if (url.origin !== self.location.origin || !kept(url.pathname)) return;
  e.respondWith((async () => {
    try {
      const res = await fetch(r);
      if (res.status === 200) {
        const copy = res.clone();
        e.waitUntil(caches.open(CACHE).then((c) => c.put(r, copy)).catch(() => {}));
      }
      return res;
    } catch (err) {
      const hit = await caches.match(r, { ignoreSearch: true, cacheName: CACHE });
      if (hit) return hit;
      throw err;
    }
  })());
});
