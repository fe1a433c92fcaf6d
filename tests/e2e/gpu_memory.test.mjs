// Where a model's dense weights live in the browser. On WebGPU they stream from the helper
// into GPU buffers a bounded chunk at a time (engine/src/gpu/stream.rs), so the worker's
// wasm memory (which only grows) stays far below their size; the CPU backend computes
// from wasm memory and holds all of them. Both give `coli generate`'s tokens. The model is
// a `coli synth` one whose dense part (attention of hidden 2048, int8) is large next to
// the engine's own working memory; its experts are small.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, freePort, startHelper, launchBrowser, synthModel, ARTIFACTS } from "./harness.mjs";

const PROMPT = [5, 17, 3, 42];
const NEW = 3;
let dir, helper, nativeIds, dense;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "colibri-e2e-gpumem-"));
  const { path: model, manifest } = synthModel(dir, ["--layers", "4", "--experts", "4", "--top-k", "2", "--hidden", "2048", "--intermediate", "256", "--heads", "16"], "int4");
  dense = manifest.dense.length;
  nativeIds = JSON.parse(coli(["generate", "--model", model, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--ignore-eos", "--json"])).ids;
  helper = await startHelper({ modelsDir: join(dir, "models"), port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** Loads the model on `backend` in a fresh document (a fresh worker and wasm memory) and
 * generates; returns the ids, the stats and the load's progress phases. */
async function run(page, backend) {
  await page.goto(`${helper.url}/health`);
  return page.evaluate(
    async ({ backend, ids, n }) => {
      const { load } = await import("/colibri.js");
      const phases = [];
      const engine = await load({ model: "synth", backend, ramBytes: 64 << 20, onProgress: (p) => phases.push(p) });
      const g = await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
      const stats = engine.stats();
      engine.terminate?.();
      return { ids: g.ids, stats, phases };
    },
    { backend, ids: PROMPT, n: NEW },
  );
}

test("WebGPU: the dense weights go to GPU buffers, not wasm memory; the CPU backend holds them; same tokens", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const gpu = await run(page, "webgpu");
    const cpu = await run(page, "cpu");
    const report = {
      denseBytes: dense,
      webgpu: gpu.stats.memory,
      cpu: cpu.stats.memory,
    };
    mkdirSync(ARTIFACTS, { recursive: true });
    writeFileSync(join(ARTIFACTS, "gpu-memory.json"), JSON.stringify(report, null, 2));
    console.log("memory by backend:", JSON.stringify(report));

    assert.equal(gpu.stats.backend, "webgpu");
    assert.deepEqual(gpu.ids, nativeIds, "WebGPU tokens differ from coli generate");
    assert.deepEqual(cpu.ids, nativeIds, "CPU backend tokens differ from coli generate");
    assert.ok(dense > 64 << 20, `the model's dense part is ${dense} bytes: too small to tell`);

    const m = gpu.stats.memory;
    assert.equal(m.denseInWasm, false);
    // All of the dense weights are on the GPU, none of them in wasm memory: the whole wasm
    // memory (engine, tokenizer, activations, KV, RAM tier, one 8 MiB chunk) is less than
    // half of them. Loading them into wasm first, as before, made it larger than all.
    assert.ok(m.gpuDenseBytes >= dense * 0.95, `GPU dense bytes ${m.gpuDenseBytes} of ${dense}`);
    assert.ok(m.wasmBytes < dense / 2, `wasm memory ${m.wasmBytes} bytes with ${dense} bytes of dense weights`);
    assert.ok(m.gpuKvBytes > 0 && m.gpuExpertBytes > 0, JSON.stringify(m));
    // The load reported the streamed bytes as its "dense" progress, up to all of them.
    const last = gpu.phases.filter((p) => p.phase === "dense").at(-1);
    assert.ok(last && last.loaded === dense && last.total === dense, JSON.stringify(gpu.phases.slice(-3)));

    const c = cpu.stats.memory;
    assert.equal(c.denseInWasm, true);
    assert.equal(c.gpuDenseBytes, null);
    assert.ok(c.wasmBytes > dense, `CPU backend: wasm memory ${c.wasmBytes} bytes, dense ${dense}`);
  } finally {
    await browser.close();
  }
});
