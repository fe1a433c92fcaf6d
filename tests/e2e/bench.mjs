// Browser benchmark: decode speed of the browser engine (WebGPU and CPU backends) next to
// the native CPU path and native wgpu, on the same model, prompt and tokens, in one run;
// bytes fetched per token cold and warm; OPFS read throughput. Prints one JSON record
// per measurement and a summary. Not a test (timings are reported, never asserted).
//
//   COLI=target/release/coli node tests/e2e/bench.mjs [--model demo] [--tokens 64] [--runs 3]
//     [--threads 1,2] [--backends cpu,webgpu] [--native cpu,wgpu] [--models-dir DIR] [--ids 5,17,3]
//
// --threads: the browser CPU backend once per thread count (load({threads})); the
// helper's pages are cross-origin isolated, so more than one runs the threaded build.
//
// Headless Chromium's WebGPU is SwiftShader and native wgpu here is lavapipe: both
// emulate a GPU on the CPU, so their speeds say nothing about a real GPU.
import { execFileSync } from "node:child_process";
import { cpus, totalmem, loadavg } from "node:os";
import { join } from "node:path";
import { coli, freePort, startHelper, launchBrowser, ROOT, COLI, CHROMIUM } from "./harness.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const MODEL = arg("model", "demo");
const TOKENS = Number(arg("tokens", 64));
const RUNS = Number(arg("runs", 3));
const MODELS_DIR = arg("models-dir", join(ROOT, "models"));
const THREADS = arg("threads", "").split(",").filter(Boolean).map(Number);
const BACKENDS = arg("backends", "cpu,webgpu").split(",");
const NATIVE = arg("native", "cpu,wgpu").split(",").filter(Boolean);
const PROMPT_TEXT = "Tell me a short story about a fox who finds a lantern in the forest.";

const sh = (cmd, args) => {
  try {
    return execFileSync(cmd, args, { encoding: "utf8" }).trim();
  } catch {
    return null;
  }
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const common = {
  commit: sh("git", ["-C", ROOT, "rev-parse", "--short", "HEAD"]),
  model: MODEL,
  new_tokens: TOKENS,
  cores: cpus().length,
  cpu: cpus()[0]?.model,
  ram_bytes: totalmem(),
  chromium: sh(CHROMIUM, ["--version"]),
  coli: COLI,
};
const records = [];
const emit = (r) => {
  const rec = { ...common, ...r, load_average: loadavg()[0] };
  records.push(rec);
  console.log(JSON.stringify(rec));
};

const modelArg = MODEL === "demo" ? "demo" : join(MODELS_DIR, MODEL);
// --ids 5,17,3: a prompt of token ids (a synthetic model's tokenizer has no real words).
const promptIds = arg("ids", null) ? arg("ids").split(",").map(Number) : JSON.parse(coli(["generate", "--model", modelArg, "--prompt", PROMPT_TEXT, "--max-new-tokens", "1", "--json"])).prompt_ids;

// The tokens every run must reproduce: the native CPU path's.
const reference = JSON.parse(coli(["generate", "--model", modelArg, "--ids", promptIds.join(","), "--max-new-tokens", String(TOKENS), "--ignore-eos", "--json"])).ids;

// Native: the median of RUNS processes (the model is in the page cache after the first).
for (const backend of NATIVE) {
  const runs = [];
  for (let i = 0; i < RUNS; i++) {
    const out = coli(["generate", "--model", modelArg, "--backend", backend, "--ids", promptIds.join(","), "--max-new-tokens", String(TOKENS), "--ignore-eos", "--json"], { env: { ...process.env, NODEVICE_SELECT: "1" } });
    runs.push(JSON.parse(out));
  }
  emit({
    where: "native",
    backend,
    decode_tokens_per_second: median(runs.map((r) => r.decode_tokens_per_second)),
    ttft_ms: median(runs.map((r) => r.ttft_ms)),
    same_tokens_as_native_cpu: runs.every((r) => JSON.stringify(r.ids) === JSON.stringify(reference)),
  });
}

const helper = await startHelper({ modelsDir: MODELS_DIR, port: await freePort() });
try {
  const configs = BACKENDS.flatMap((backend) => (backend === "cpu" && THREADS.length ? THREADS.map((threads) => ({ backend, threads })) : [{ backend }]));
  for (const { backend, threads } of configs) {
    // A fresh profile: the first load fetches experts from the helper (cold); a reload
    // in the same profile reads them from OPFS (warm).
    const browser = await launchBrowser();
    try {
      const page = await browser.context.newPage();
      for (const cache of ["cold", "warm"]) {
        await page.goto(`${helper.url}/health`);
        const r = await page.evaluate(
          async ({ model, ids, n, backend, threads }) => {
            const { load } = await import("/colibri.js");
            const t0 = performance.now();
            const engine = await load({ model, backend, threads });
            const loadMs = performance.now() - t0;
            const g = await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
            const s = engine.stats();
            engine.terminate?.();
            return { ids: g.ids, stats: s, loadMs };
          },
          { model: MODEL, ids: promptIds, n: TOKENS, backend, threads },
        );
        const s = r.stats;
        emit({
          where: "browser",
          backend: s.backend,
          adapter: s.adapter,
          threads: s.threads,
          threads_reason: s.threadsReason,
          cache,
          decode_tokens_per_second: s.tokensPerSecond,
          ttft_ms: s.ttftMs,
          load_ms: r.loadMs,
          bytes_fetched: s.bytesFetched,
          bytes_fetched_per_token: s.bytesFetched / (r.ids.length || 1),
          tiers: s.tiers,
          prefetch: s.prefetch,
          opfs_expert_read_mb_per_s: s.diskReadMs > 0 ? s.diskReadBytes / 1e3 / s.diskReadMs : null,
          opfs_expert_reads_bytes: s.diskReadBytes,
          same_tokens_as_native_cpu: JSON.stringify(r.ids) === JSON.stringify(reference),
        });
      }
      if (backend === "cpu") {
        // Raw OPFS throughput through a sync access handle, as the engine's worker reads it.
        const o = await page.evaluate(async () => {
          const src = `
            onmessage = async () => {
              const root = await navigator.storage.getDirectory();
              const f = await root.getFileHandle("colibri-bench.bin", { create: true });
              const h = await f.createSyncAccessHandle();
              const total = 64 << 20, out = {};
              const chunk = new Uint8Array(1 << 20).map((_, i) => i * 7);
              let t = performance.now();
              for (let off = 0; off < total; off += chunk.length) h.write(chunk, { at: off });
              h.flush();
              out.write_mb_per_s = total / 1e3 / (performance.now() - t);
              for (const size of [1 << 20, 64 << 10, 16 << 10]) {
                const buf = new Uint8Array(size);
                t = performance.now();
                for (let off = 0; off < total; off += size) h.read(buf, { at: off });
                out["read_mb_per_s_" + (size >> 10) + "k"] = total / 1e3 / (performance.now() - t);
              }
              h.close();
              await root.removeEntry("colibri-bench.bin");
              postMessage(out);
            };`;
          const w = new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
          const res = await new Promise((ok) => {
            w.onmessage = (e) => ok(e.data);
            w.postMessage(0);
          });
          w.terminate();
          return res;
        });
        emit({ where: "browser", what: "opfs_sync_access_handle_64MiB", ...o });
      }
    } finally {
      await browser.close();
    }
  }
} finally {
  await helper.stop();
}
