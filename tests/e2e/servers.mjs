// Small HTTP servers for the app tests: a page of another origin (for the widget), and a
// development front for `coli serve` that serves web/ from disk and passes everything else
// to the helper (for working on the page before the helper embeds it; E2E_WEB_FROM_DISK=1).
import http from "node:http";
import { readFile } from "node:fs/promises";
import { join, extname, normalize } from "node:path";
import { ROOT, freePort } from "./harness.mjs";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".wasm": "application/wasm",
  ".json": "application/json",
  ".png": "image/png",
  ".svg": "image/svg+xml",
};

function listen(server, port) {
  return new Promise((ok, bad) => {
    server.once("error", bad);
    server.listen(port, "127.0.0.1", () => ok());
  });
}

/** Serves `pages` ({"/path": html}; more with setPage, whose optional third argument is
 * the content type) on a free loopback port: pages of another origin. `headers` go on
 * every page (e.g. COOP/COEP to make them cross-origin isolated). */
export async function startPageServer(pages = {}, { host = "localhost", headers = {} } = {}) {
  const port = await freePort();
  const types = {};
  const server = http.createServer((req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    const body = pages[path];
    if (body === undefined) {
      res.writeHead(404, { "Content-Type": "text/plain" }).end("not found\n");
      return;
    }
    const type = types[path] || "text/html; charset=utf-8";
    res.writeHead(200, { "Content-Type": type, "Cache-Control": "no-store", ...headers }).end(body);
  });
  await listen(server, port);
  return {
    url: `http://${host}:${port}`,
    origin: `http://${host}:${port}`,
    port,
    setPage: (path, body, type) => {
      pages[path] = body;
      if (type) types[path] = type;
    },
    stop: () => new Promise((ok) => { server.closeAllConnections(); server.close(() => ok()); }),
  };
}

/** Forwards one request to the helper, with the Origin rewritten from ours to the helper's. */
function forward(req, res, helperUrl, ownOrigin, path = req.url, method = req.method) {
  const target = new URL(path, helperUrl);
  const headers = { ...req.headers, host: target.host };
  if (headers.origin === ownOrigin) headers.origin = target.origin;
  return new Promise((done) => {
    const up = http.request(target, { method, headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
      r.on("end", done);
    });
    up.on("error", (e) => {
      res.writeHead(502, { "Content-Type": "text/plain" }).end(`helper unreachable: ${e.message}\n`);
      done();
    });
    req.pipe(up);
  });
}

/** Asks the helper whether `origin` may read its responses: the CORS headers it would send, or null if refused. */
async function corsFor(helperUrl, origin) {
  const r = await fetch(new URL("/health", helperUrl), { headers: { Origin: origin } }).catch(() => null);
  if (!r || r.status === 403) return null;
  const out = {};
  for (const h of ["access-control-allow-origin", "access-control-expose-headers", "vary"]) if (r.headers.get(h)) out[h] = r.headers.get(h);
  return out;
}

/**
 * A development front for a running helper: web/ from disk (so edits show without a
 * rebuild of `coli`), everything else passed through. The helper's Origin rules are
 * applied to the web files too, by asking the helper.
 */
export async function startWebFront(helperUrl) {
  const port = await freePort();
  const own = `http://127.0.0.1:${port}`;
  const web = join(ROOT, "web");
  const server = http.createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url, own).pathname);
    const rel = path === "/" ? "index.html" : normalize(path).replace(/^\/+/, "");
    const isWeb = !rel.startsWith("..") && !/^(api|models|v1|health)(\/|$)/.test(rel) && TYPES[extname(rel)];
    if (!isWeb || req.method === "OPTIONS") return forward(req, res, helperUrl, own);
    const origin = req.headers.origin;
    let cors = {};
    if (origin && origin !== own) {
      cors = await corsFor(helperUrl, origin);
      if (!cors) return res.writeHead(403, { "Content-Type": "text/plain" }).end("forbidden: this origin may not use the helper (see --allow-origin)\n");
    }
    try {
      const body = await readFile(join(web, rel));
      // The helper's cross-origin isolation headers (helper/src/serve/isolation.rs), so pages keep their threads.
      const isolation = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp", "Cross-Origin-Resource-Policy": "cross-origin" };
      res.writeHead(200, { "Content-Type": TYPES[extname(rel)], "Cache-Control": "no-store", ...isolation, ...cors }).end(req.method === "HEAD" ? undefined : body);
    } catch (_) {
      res.writeHead(404, { "Content-Type": "text/plain", ...cors }).end("not found\n");
    }
  });
  await listen(server, port);
  return { url: own, port, stop: () => new Promise((ok) => { server.closeAllConnections(); server.close(() => ok()); }) };
}
