// Hybrid expert placement, measured (not a test: timings are reported, never asserted):
// decode tokens/s with hybrid off and on (and auto), in interleaved runs, on WebGPU in
// headless Chromium (SwiftShader) and natively on wgpu (lavapipe), with a GPU expert
// pool smaller than the model's experts. Every run must give the native CPU's tokens.
//
//   COLI=target/debug/coli node tests/e2e/bench_hybrid.mjs --models-dir DIR --model NAME \
//     [--pool 32000000] [--tokens 16] [--runs 3] [--modes off,on,auto] [--ids 5,17,3,...]
//     [--where browser,native]
//
// Both adapters emulate a GPU on the CPU cores that the CPU experts also use: the numbers
// give a direction only, not what a real GPU would do.
import { join } from "node:path";
import { loadavg } from "node:os";
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
const path = join(MODELS_DIR, MODEL);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const reference = JSON.parse(coli(["generate", "--model", path, "--ids", IDS.join(","), "--max-new-tokens", String(TOKENS), "--ignore-eos", "--json"])).ids;
const results = {};
const emit = (r) => {
  const rec = { ...r, load_average: loadavg().map((x) => x.toFixed(2)).join(" ") };
  (results[`${r.where} ${r.hybrid}`] ||= []).push(rec);
  console.log(JSON.stringify(rec));
};

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
          async ({ model, ids, n, hybrid, pool }) => {
            const { load } = await import("/colibri.js");
            const engine = await load({ model, backend: "webgpu", hybrid, gpuPoolBytes: pool });
            // Once untimed (one token: no decode step is counted), so that the timed run finds
            // the experts in the RAM tier.
            await engine.generate({ ids, maxNewTokens: 1, temperature: 0, ignoreEos: true });
            const g = await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
            const s = engine.stats();
            engine.terminate?.();
            return { ids: g.ids, stats: s };
          },
          { model: MODEL, ids: IDS, n: TOKENS, hybrid, pool: POOL },
        );
        if (i < 0) continue;
        const s = r.stats;
        emit({ where: "browser", hybrid, run: i, adapter: s.adapter, threads: s.threads, decode_tokens_per_second: s.tokensPerSecond, ttft_ms: s.ttftMs,
          placement: s.hybrid, same_tokens: JSON.stringify(r.ids) === JSON.stringify(reference) });
      }
    }
  } finally {
    await browser.close();
    await helper.stop();
  }
}

for (const [k, rs] of Object.entries(results)) {
  const tps = rs.map((r) => r.decode_tokens_per_second);
  console.log(`${k}: median ${median(tps).toFixed(2)} tok/s (${tps.map((x) => x.toFixed(2)).join(", ")}), same tokens: ${rs.every((r) => r.same_tokens)}, load ${rs.map((r) => r.load_average.split(" ")[0]).join("/")}`);
}
