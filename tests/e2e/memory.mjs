// Browser memory by backend: loads a model in headless Chromium (a fresh page, so a fresh
// worker and wasm memory, per backend), generates a few tokens and prints one JSON record
// per backend with stats().memory: the wasm memory's size (which only grows: its peak),
// whether the dense weights are in it, and the GPU's buffer bytes. Not a test.
//
//   COLI=target/debug/coli node tests/e2e/memory.mjs --models-dir DIR --model NAME \
//     [--backends webgpu,auto,cpu] [--ids 5,17,3,42] [--tokens 2] [--ram-bytes 67108864]
//
// `auto` loads the dense weights into wasm memory and uploads them from there when the
// CPU backend could hold them: the path `webgpu` took before it streamed them.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const DIR = arg("models-dir");
const MODEL = arg("model");
if (!DIR || !MODEL) throw new Error("give --models-dir DIR --model NAME");
const BACKENDS = arg("backends", "webgpu,auto,cpu").split(",");
const IDS = arg("ids", "5,17,3,42").split(",").map(Number);
const TOKENS = Number(arg("tokens", 2));
const RAM = Number(arg("ram-bytes", 64 << 20));

const manifest = JSON.parse(readFileSync(join(DIR, MODEL, "colibri.json"), "utf8"));
const expertBytes = manifest.experts.layers.flatMap((l) => l.experts).reduce((a, e) => a + e.length, 0);
const native = JSON.parse(coli(["generate", "--model", join(DIR, MODEL), "--ids", IDS.join(","), "--max-new-tokens", String(TOKENS), "--ignore-eos", "--json"])).ids;
const helper = await startHelper({ modelsDir: DIR, port: await freePort() });
try {
  for (const backend of BACKENDS) {
    const browser = await launchBrowser();
    try {
      const page = await browser.context.newPage();
      await page.goto(`${helper.url}/health`);
      const r = await page.evaluate(
        async ({ model, backend, ids, n, ram }) => {
          const { load } = await import("/colibri.js");
          const t0 = performance.now();
          const engine = await load({ model, backend, ramBytes: ram });
          const loadMs = performance.now() - t0;
          const g = await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
          const s = engine.stats();
          engine.terminate?.();
          return { ids: g.ids, stats: s, loadMs };
        },
        { model: MODEL, backend, ids: IDS, n: TOKENS, ram: RAM },
      );
      console.log(JSON.stringify({
        model: MODEL,
        asked: backend,
        backend: r.stats.backend,
        adapter: r.stats.adapter,
        dense_bytes: manifest.dense.length,
        expert_bytes: expertBytes,
        ram_bytes: RAM,
        ...r.stats.memory,
        load_ms: Math.round(r.loadMs),
        same_tokens_as_native: JSON.stringify(r.ids) === JSON.stringify(native),
      }));
    } finally {
      await browser.close();
    }
  }
} finally {
  await helper.stop();
}
