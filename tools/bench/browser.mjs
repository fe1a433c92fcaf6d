// Browser CPU engines in headless Chromium (Debian's /usr/bin/chromium, never a downloaded
// one), for tools/bench_peers.sh. One run = one fresh browser profile, one engine, one
// thread count; prints one JSON line with prefill and decode timings.
//
//   node tools/bench/browser.mjs --engine wllama --gguf FILE --threads N [--prompt-tokens 128] [--decode-tokens 64]
//   node tools/bench/browser.mjs --engine colibri --coli target/release/coli --models-dir DIR --model NAME
//        [--prompt-tokens 128] [--decode-tokens 64] [--web-dir DIR]
//
// --web-dir DIR: serve the page, colibri.js and the engine builds from DIR (a web/ folder
// after tools/build-web.sh, e.g. another checkout's: COLIBRI_WEB_DIR) instead of the copy
// built into this coli, to compare two engine builds with one helper.
//
// wllama (llama.cpp in wasm, the @wllama/wllama npm package) runs on a page this script
// serves on a loopback port with COOP/COEP (cross-origin isolated, so its wasm threads get
// SharedArrayBuffer), n_gpu_layers 0 (CPU only); its numbers are llama.cpp's own timings
// (prompt_ms, predicted_ms). Its API takes text prompts only (token-id arrays fail in
// 3.13), so it gets P words that make_gguf.py's vocabulary makes exactly P tokens.
// colibri's browser engine is loaded from a `coli serve` of the converted model with
// backend "cpu", a RAM budget above the model's size and no OPFS copy; untimed generations
// over other prompts of the same length bring every expert into RAM (warm.mjs: native runs
// with --ram all --cache warm), then one generation is measured (stats(): ttftMs,
// tokensPerSecond; its tiers show no helper fetches).
// Both use the prompt ids of `coli bench`: ((i * 0x9E3779B97F4A7C15) >> 17) % vocab.
import { createServer } from "node:http";
import { createReadStream, statSync, mkdtempSync, rmSync, readFileSync, existsSync } from "node:fs";
import { spawn } from "node:child_process";
import { tmpdir } from "node:os";
import { join, resolve, dirname, extname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { warmAll } from "./warm.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const ENGINE = arg("engine");
const THREADS = Number(arg("threads", 1));
const PROMPT = Number(arg("prompt-tokens", 128));
const DECODE = Number(arg("decode-tokens", 64));
const VOCAB = BigInt(arg("vocab", 50304));
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const TIMEOUT_MS = Number(arg("timeout-s", 900)) * 1e3;
const fail = (msg) => {
  console.error(`browser.mjs: ${msg}`);
  process.exit(1);
};
if (!["wllama", "colibri"].includes(ENGINE)) fail("--engine wllama|colibri is required");
if (!existsSync(CHROMIUM)) fail(`no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`);
const ids = Array.from({ length: PROMPT }, (_, i) => Number((((BigInt(i) * 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn) >> 17n) % VOCAB));

// wllama takes text prompts only: P words " xy" (letters from the same ids), each one token
// of make_gguf.py's vocabulary.
const L = "abcdefghijklmnopqrstuvwxyz";
const wllamaPrompt = ids.map((id) => " " + L[id % 26] + L[Math.floor(id / 26) % 26]).join("");

// The flags of /work/shared/design.md; WebGPU stays available but neither engine uses it here.
const ARGS = [
  "--no-sandbox",
  "--enable-unsafe-webgpu",
  "--enable-features=Vulkan",
  "--use-vulkan=swiftshader",
  "--use-webgpu-adapter=swiftshader",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];

async function withBrowser(fn) {
  const profile = mkdtempSync(join(tmpdir(), "colibri-bench-chromium-"));
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: ARGS });
  try {
    const page = await context.newPage();
    page.setDefaultTimeout(TIMEOUT_MS);
    const logs = [];
    page.on("console", (m) => logs.push(m.text()));
    page.on("pageerror", (e) => logs.push(`pageerror: ${e.message}`));
    try {
      return await fn(page);
    } catch (e) {
      throw new Error(`${e.message}\nlast page console lines:\n${logs.slice(-15).join("\n")}`);
    }
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

const TYPES = { ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".html": "text/html", ".json": "application/json" };

/** A loopback server, cross-origin isolated: the wllama package at /wllama/, the GGUF at /model.gguf. */
function serveIsolated(gguf) {
  const pkg = resolve(HERE, "node_modules/@wllama/wllama");
  if (!existsSync(join(pkg, "esm/index.js"))) fail(`${pkg} is missing: run (cd tools/bench && npm install --omit=optional --ignore-scripts)`);
  const server = createServer((req, res) => {
    const headers = {
      "Cross-Origin-Opener-Policy": "same-origin",
      "Cross-Origin-Embedder-Policy": "require-corp",
      "Cross-Origin-Resource-Policy": "same-origin",
      "Cache-Control": "no-store",
    };
    const path = new URL(req.url, "http://x").pathname;
    let file = null;
    if (path === "/") {
      res.writeHead(200, { ...headers, "Content-Type": "text/html" });
      return res.end("<!doctype html><title>wllama bench</title>");
    } else if (path === "/model.gguf") file = gguf;
    else if (path.startsWith("/wllama/")) {
      file = resolve(pkg, "." + path.slice("/wllama".length));
      if (!file.startsWith(pkg + "/")) file = null;
    }
    if (!file || !existsSync(file) || !statSync(file).isFile()) {
      res.writeHead(404, headers);
      return res.end("not found");
    }
    res.writeHead(200, { ...headers, "Content-Type": TYPES[extname(file)] || "application/octet-stream", "Content-Length": statSync(file).size });
    createReadStream(file).pipe(res);
  });
  return new Promise((ok) => server.listen(0, "127.0.0.1", () => ok({ server, url: `http://127.0.0.1:${server.address().port}` })));
}

async function runWllama() {
  const gguf = arg("gguf");
  if (!gguf || !existsSync(gguf)) fail(`--gguf ${gguf}: no such file`);
  const { server, url } = await serveIsolated(resolve(gguf));
  try {
    return await withBrowser(async (page) => {
      await page.goto(url + "/");
      const r = await page.evaluate(
        async ({ text, prompt, threads, decode }) => {
          if (!crossOriginIsolated && threads > 1) throw new Error("the page is not cross-origin isolated: no wasm threads");
          const { Wllama } = await import("/wllama/esm/index.js");
          const w = new Wllama({ default: "/wllama/esm/wasm/wllama.wasm" }, { suppressNativeLog: true });
          const t0 = performance.now();
          const blob = await (await fetch("/model.gguf")).blob();
          await w.loadModel([new File([blob], "model.gguf")], {
            n_threads: threads,
            n_gpu_layers: 0,
            n_ctx: prompt + decode + 64,
            n_batch: prompt,
            n_ubatch: prompt,
            n_parallel: 1,
            warmup: true,
          });
          const loadMs = performance.now() - t0;
          const run = (prompt, n) =>
            w.createCompletion({ prompt, max_tokens: n, temperature: 0, ignore_eos: true, cache_prompt: false });
          await run(text.slice(0, 24), 2); // warm-up
          const res = await run(text, decode);
          const out = { timings: res.timings, usage: res.usage, loadMs, multithread: w.isMultithread(), nThreads: w.getNumThreads(), isolated: crossOriginIsolated };
          await w.exit?.();
          return out;
        },
        { text: wllamaPrompt, prompt: PROMPT, threads: THREADS, decode: DECODE },
      );
      const t = r.timings || {};
      if (!t.predicted_n) throw new Error(`wllama returned no timings: ${JSON.stringify(r)}`);
      if (t.prompt_n !== PROMPT) throw new Error(`wllama's prompt was ${t.prompt_n} tokens, not ${PROMPT} (a GGUF from an older make_gguf.py?)`);
      return {
        engine: "wllama",
        where: "browser",
        build: "@wllama/wllama " + JSON.parse(readFileSync(resolve(HERE, "node_modules/@wllama/wllama/package.json"), "utf8")).version,
        threads: THREADS,
        wasm_threads: r.nThreads,
        multithread: r.multithread,
        cross_origin_isolated: r.isolated,
        prefill_tokens: t.prompt_n,
        prefill_seconds: t.prompt_ms / 1e3,
        decode_tokens: t.predicted_n,
        decode_seconds: t.predicted_ms / 1e3,
        load_ms: r.loadMs,
      };
    });
  } finally {
    server.close();
  }
}

async function runColibri() {
  const coli = arg("coli");
  const modelsDir = arg("models-dir");
  const model = arg("model");
  if (!coli || !existsSync(coli)) fail(`--coli ${coli}: no such binary`);
  if (!modelsDir || !model || !existsSync(join(modelsDir, model, "colibri.json"))) fail(`--models-dir/--model: no ${modelsDir}/${model}/colibri.json`);
  const srv = await new Promise((ok, bad) => {
    const webDir = arg("web-dir");
    const env = webDir ? { ...process.env, COLIBRI_WEB_DIR: webDir } : process.env;
    const child = spawn(coli, ["serve", "--port", "0", "--models-dir", modelsDir], { stdio: ["ignore", "pipe", "pipe"], env });
    let log = "";
    const onData = (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) ok({ child, url: `http://127.0.0.1:${m[1]}`, log: () => log });
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (c) => bad(new Error(`coli serve exited (${c}): ${log}`)));
  });
  try {
    for (let i = 0; i < 100; i++) {
      try {
        if ((await fetch(`${srv.url}/health`)).ok) break;
      } catch {}
      await new Promise((r) => setTimeout(r, 100));
    }
    return await withBrowser(async (page) => {
      await page.goto(`${srv.url}/health`);
      const loadMs = await page.evaluate(
        async ({ model, threads }) => {
          const { load } = await import("/colibri.js");
          const t0 = performance.now();
          // disk: false: experts come from the helper straight into RAM (no OPFS copy); threads
          // above 1 loads the wasm-threads build (the helper's pages are cross-origin isolated).
          window.engine = await load({ model, backend: "cpu", ramBytes: 3 * 2 ** 30, disk: false, threads });
          return performance.now() - t0;
        },
        { model, threads: THREADS },
      );
      const warm = await page.evaluate(warmAll, { ids, vocab: Number(VOCAB) });
      const r = await page.evaluate(
        async ({ ids, decode }) => {
          const engine = window.engine;
          const before = (await engine.stats()).tiers;
          const g = await engine.generate({ ids, maxNewTokens: decode + 1, temperature: 0, ignoreEos: true });
          const s = await engine.stats();
          engine.terminate?.();
          // stats().tiers counts since the load: the timed generation's own uses.
          for (const k of Object.keys(s.tiers)) s.tiers[k] -= before[k] ?? 0;
          return { n: g.ids.length, stats: s };
        },
        { ids, decode: DECODE },
      );
      const s = r.stats;
      if (s.backend !== "cpu") throw new Error(`colibri ran on backend ${s.backend}, not cpu`);
      return {
        engine: "colibri",
        where: "browser",
        build: arg("web-dir") ? `coli serve, web from ${arg("web-dir")}` : "coli serve (web/pkg built into this coli)",
        threads: THREADS,
        threads_used: s.threads ?? 1,
        threads_reason: s.threadsReason ?? null,
        simd_form: s.simdForm ?? null,
        prefill_tokens: ids.length,
        // TTFT = the prompt's forward pass + sampling its first token.
        prefill_seconds: s.ttftMs / 1e3,
        decode_tokens: r.n - 1,
        decode_seconds: (r.n - 1) / s.tokensPerSecond,
        load_ms: loadMs,
        tiers: s.tiers,
        // The warm-up (warm.mjs): generations until every expert was in RAM, and how many
        // were not after the last one (0: the timed run fetched nothing, tiers.helper 0).
        warmup_passes: warm.passes,
        warmup_not_resident: warm.notResident,
      };
    });
  } finally {
    srv.child.kill("SIGTERM");
  }
}

const timer = setTimeout(() => fail(`no result after ${TIMEOUT_MS / 1e3} s`), TIMEOUT_MS + 60e3);
try {
  const rec = ENGINE === "wllama" ? await runWllama() : await runColibri();
  console.log(JSON.stringify(rec));
} catch (e) {
  fail(e.stack || String(e));
} finally {
  clearTimeout(timer);
}
