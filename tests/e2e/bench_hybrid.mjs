// Hybrid expert placement, measured (not a test: timings are reported, never asserted):
// decode tokens/s with hybrid off and on (and auto), in interleaved runs, on WebGPU in
// headless Chromium (SwiftShader) and natively on wgpu (lavapipe), with a GPU expert
// pool smaller than the model's experts. Every run must give the native CPU's tokens.
//
//   COLI=target/debug/coli node tests/e2e/bench_hybrid.mjs --models-dir DIR --model NAME \
//     [--pool 32000000] [--tokens 16] [--runs 3] [--modes off,on,auto] [--ids 5,17,3,...]
//     [--where browser,native] [--ram BYTES]
//
// --ram: the browser's RAM tier (load({ramBytes}); default 512 MiB): a small one has the
// timed runs read the experts from the disk tier (OPFS) instead.
//
// Both adapters emulate a GPU on the CPU cores that the CPU experts also use: the numbers
// give a direction only, not what a real GPU would do.
//
// --cold: cold and warm loads instead (issue #18's measurements). Per run and per browser
// configuration (--backends webgpu,cpu; webgpu once per --modes entry), a fresh browser
// profile: load + generate timed with empty browser storage (cold), then in a new page of
// the same profile (a new worker, storage filled by the first load: warm). Each record has
// load_ms, ttft_ms, prefill and decode tokens/s, the bytes fetched from the helper during
// the load, the prefill and the decode (and per decode token), the expert uses by tier and
// stats().memory (peak wasm memory, GPU dense / expert pool / KV bytes) and stats().dense
// (where the dense weights came from: the network cold, the browser's OPFS copy warm). Natively
// (--native-backends cpu,wgpu): `coli bench --cache cold` and `--cache warm`, CPU, and
// wgpu once per mode. --forget-usage removes MODEL/usage.json before each cold run (the
// helper's learned usage would otherwise pin experts at load).
//
//   COLI=target/debug/coli node tests/e2e/bench_hybrid.mjs --cold --models-dir DIR --model NAME \
//     [--backends webgpu,cpu] [--native-backends cpu,wgpu] [--modes off,on] [--ids 5,17,3,42] \
//     [--tokens 4] [--runs 1] [--pool 128000000] [--forget-usage] [--where browser,native]
import { join } from "node:path";
import { loadavg } from "node:os";
import { rmSync } from "node:fs";
import { coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const MODELS_DIR = arg("models-dir");
const MODEL = arg("model");
const POOL = Number(arg("pool", 32e6));
const TOKENS = Number(arg("tokens", 16));
const RUNS = Number(arg("runs", 3));
const MODES = arg("modes", "off,on").split(",");
const WHERE = arg("where", "browser,native").split(",");
const IDS = arg("ids", "5,17,3,42,7,99,120,250").split(",").map(Number);
const COLD = process.argv.includes("--cold");
const BACKENDS = arg("backends", "webgpu").split(",");
const NATIVE_BACKENDS = arg("native-backends", "wgpu").split(",");
const FORGET_USAGE = process.argv.includes("--forget-usage");
const RAM = arg("ram") === undefined ? undefined : Number(arg("ram"));
const path = join(MODELS_DIR, MODEL);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const reference = JSON.parse(coli(["generate", "--model", path, "--ids", IDS.join(","), "--max-new-tokens", String(TOKENS), "--ignore-eos", "--json"])).ids;
const results = {};
const emit = (r) => {
  const rec = { ...r, load_average: loadavg().map((x) => x.toFixed(2)).join(" ") };
  (results[[r.where, r.backend, r.hybrid, r.phase].filter(Boolean).join(" ")] ||= []).push(rec);
  console.log(JSON.stringify(rec));
};

if (COLD) {
  await coldWarm();
  summary();
  process.exit(0);
}

if (WHERE.includes("native")) {
  for (let i = 0; i < RUNS; i++) {
    for (const hybrid of MODES) {
      const r = JSON.parse(coli(["bench", "--model", path, "--backend", "wgpu", "--hybrid", hybrid, "--gpu-pool", String(POOL), "--ram", "all",
        "--ids", IDS.join(","), "--decode-tokens", String(TOKENS + 1), "--warmup", "--cache", "warm", "--probe-bytes", "0"], { env: { ...process.env, NODEVICE_SELECT: "1" } }));
      emit({ where: "native", hybrid, run: i, decode_tokens_per_second: r.decode_tokens_per_second, ttft_ms: r.ttft_ms,
        placement: r.hybrid.decode, costs: { cpu_ms: r.hybrid.cpu_ms_per_expert, upload_ms: r.hybrid.upload_ms_per_expert, gpu_ms: r.hybrid.gpu_ms_per_expert },
        same_tokens: JSON.stringify(r.generated_ids.slice(0, TOKENS)) === JSON.stringify(reference.slice(0, TOKENS)) });
    }
  }
}

if (WHERE.includes("browser")) {
  const helper = await startHelper({ modelsDir: MODELS_DIR, port: await freePort() });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    // The first load fetches the experts into the browser's storage; the timed runs read them there.
    for (let i = -1; i < RUNS; i++) {
      for (const hybrid of MODES) {
        await page.goto(`${helper.url}/health`);
        const r = await page.evaluate(
          async ({ model, ids, n, hybrid, pool, ram }) => {
            const { load } = await import("/colibri.js");
            const engine = await load({ model, backend: "webgpu", hybrid, gpuPoolBytes: pool, ...(ram === undefined ? {} : { ramBytes: ram }) });
            // Once untimed (one token: no decode step is counted), so that the timed run finds
            // the experts in the RAM tier.
            await engine.generate({ ids, maxNewTokens: 1, temperature: 0, ignoreEos: true });
            const g = await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
            const s = engine.stats();
            engine.terminate?.();
            return { ids: g.ids, stats: s };
          },
          { model: MODEL, ids: IDS, n: TOKENS, hybrid, pool: POOL, ram: RAM },
        );
        if (i < 0) continue;
        const s = r.stats;
        emit({ where: "browser", hybrid, run: i, adapter: s.adapter, threads: s.threads, decode_tokens_per_second: s.tokensPerSecond, ttft_ms: s.ttftMs,
          placement: s.hybrid, tiers: s.tiers, same_tokens: JSON.stringify(r.ids) === JSON.stringify(reference) });
      }
    }
  } finally {
    await browser.close();
    await helper.stop();
  }
}

summary();

function summary() {
  for (const [k, rs] of Object.entries(results)) {
    const tps = rs.map((r) => r.decode_tokens_per_second);
    console.log(`${k}: median ${median(tps).toFixed(2)} tok/s (${tps.map((x) => x.toFixed(2)).join(", ")}), same tokens: ${rs.every((r) => r.same_tokens)}, load ${rs.map((r) => r.load_average.split(" ")[0]).join("/")}`);
  }
}

// One load and one generation in a new page of `browser`: timings, bytes fetched per
// phase (from the stats event after each token), tiers, memory.
async function loadAndGenerate(browser, url, { backend, hybrid }) {
  const page = await browser.context.newPage();
  try {
    await page.goto(`${url}/health`);
    return await page.evaluate(
      async ({ model, ids, n, backend, hybrid, pool }) => {
        const { load } = await import("/colibri.js");
        const t0 = performance.now();
        const opts = { model, backend };
        if (backend === "webgpu") Object.assign(opts, { hybrid, gpuPoolBytes: pool });
        const engine = await load(opts);
        const loadMs = performance.now() - t0;
        const atLoad = engine.stats();
        const fetched = [];
        engine.addEventListener("stats", (e) => fetched.push(e.detail.bytesFetched));
        const t1 = performance.now();
        const g = await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
        const genMs = performance.now() - t1;
        const s = engine.stats();
        engine.terminate?.();
        return { ids: g.ids, loadMs, genMs, atLoad, fetched, stats: s };
      },
      { model: MODEL, ids: IDS, n: TOKENS, backend, hybrid, pool: POOL },
    );
  } finally {
    await page.close();
  }
}

async function coldWarm() {
  if (WHERE.includes("native")) {
    for (let i = 0; i < RUNS; i++) {
      for (const backend of NATIVE_BACKENDS) {
        for (const hybrid of backend === "wgpu" ? MODES : ["-"]) {
          for (const cache of ["cold", "warm"]) {
            const extra = backend === "wgpu" ? ["--backend", "wgpu", "--hybrid", hybrid, "--gpu-pool", String(POOL)] : [];
            const r = JSON.parse(coli(["bench", "--model", path, ...extra, "--ram", "all", "--ids", IDS.join(","), "--decode-tokens", String(TOKENS),
              "--cache", cache, "--probe-bytes", "0"], { env: { ...process.env, NODEVICE_SELECT: "1" } }));
            emit({ where: "native", backend, hybrid, phase: cache, run: i, load_ms: Math.round(r.load_seconds * 1000), ttft_ms: Math.round(r.ttft_ms),
              prefill_tokens_per_second: r.prefill_tokens_per_second, decode_tokens_per_second: r.decode_tokens_per_second,
              bytes_read_prefill: r.prefill?.bytes_read ?? null, bytes_read_per_decode_token: r.bytes_read_per_decode_token ?? null, peak_rss_bytes: r.peak_rss_bytes,
              placement: r.hybrid?.decode ?? null, gpu_pool: r.gpu_pool ?? null, same_tokens: JSON.stringify(r.generated_ids.slice(0, TOKENS)) === JSON.stringify(reference.slice(0, TOKENS)) });
          }
        }
      }
    }
  }
  if (!WHERE.includes("browser")) return;
  const helper = await startHelper({ modelsDir: MODELS_DIR, port: await freePort() });
  try {
    for (let i = 0; i < RUNS; i++) {
      for (const backend of BACKENDS) {
        for (const hybrid of backend === "webgpu" ? MODES : ["-"]) {
          if (FORGET_USAGE) rmSync(join(path, "usage.json"), { force: true });
          const browser = await launchBrowser();
          try {
            for (const phase of ["cold", "warm"]) {
              const r = await loadAndGenerate(browser, helper.url, { backend, hybrid });
              const s = r.stats;
              const [first, last] = [r.fetched[0] ?? s.bytesFetched, r.fetched.at(-1) ?? s.bytesFetched];
              emit({ where: "browser", backend: s.backend, hybrid, phase, run: i, adapter: s.adapter, threads: s.threads,
                load_ms: Math.round(r.loadMs), ttft_ms: Math.round(s.ttftMs), prefill_tokens_per_second: IDS.length / (s.ttftMs / 1000),
                decode_tokens_per_second: s.tokensPerSecond, bytes_fetched_load: r.atLoad.bytesFetched,
                bytes_fetched_prefill: first - r.atLoad.bytesFetched, bytes_fetched_per_decode_token: (last - first) / Math.max(1, TOKENS - 1),
                tiers: s.tiers, memory: s.memory, dense: s.dense, placement: s.hybrid && { cpu: s.hybrid.cpuExperts, gpu: s.hybrid.gpuExperts },
                same_tokens: JSON.stringify(r.ids) === JSON.stringify(reference) });
            }
          } finally {
            await browser.close();
          }
        }
      }
    }
  } finally {
    await helper.stop();
  }
}
