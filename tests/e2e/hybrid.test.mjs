// Hybrid expert placement on WebGPU (SwiftShader in headless Chromium): with a GPU expert
// pool too small for a layer's experts and load({hybrid: "on"}), experts missing from the
// pool run on the wasm CPU threads while the GPU computes the others; the tokens and logit
// bits are still coli's, and stats().hybrid counts the experts computed on each side.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 10;
// An int4 olmoe fixture expert is about 5 KB: two fit, the rest of each layer's misses
// are candidates for the CPU.
const POOL = 12000;
let ref;

before(async () => {
  ref = await nativeReference({ model: "olmoe", prompt: PROMPT, n: NEW, quant: "int4" });
});

after(async () => {
  if (ref) await ref.stop();
});

test("hybrid on: coli's tokens and logit bits with experts computed on the CPU and the GPU; off: none on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const on = await ref.run(page, { backend: "webgpu", logits: true, loadOptions: { hybrid: "on", gpuPoolBytes: POOL } });
    assert.equal(on.stats.backend, "webgpu");
    ref.sameBits(on, "hybrid on");
    const h = on.stats.hybrid;
    assert.ok(h && h.mode === "on", JSON.stringify(on.stats));
    assert.ok(h.cpuExperts > 0, `no expert ran on the CPU: ${JSON.stringify(h)}`);
    assert.ok(h.gpuExperts > 0, `no expert ran on the GPU: ${JSON.stringify(h)}`);
    assert.ok(h.cpuMs > 0, `the CPU's time per expert was not measured: ${JSON.stringify(h)}`);
    console.log("hybrid on:", JSON.stringify(h), "threads", on.stats.threads);

    const off = await ref.run(page, { backend: "webgpu", logits: true, loadOptions: { hybrid: "off", gpuPoolBytes: POOL } });
    ref.sameBits(off, "hybrid off");
    assert.equal(off.stats.hybrid.cpuExperts, 0, JSON.stringify(off.stats.hybrid));

    const auto = await ref.run(page, { backend: "webgpu", loadOptions: { hybrid: "auto", gpuPoolBytes: POOL } });
    assert.deepEqual(auto.ids, ref.ids, "hybrid auto: tokens differ");
    assert.ok(auto.stats.hybrid.cpuExperts > 0, JSON.stringify(auto.stats.hybrid));

    // A bad value is refused before anything loads.
    const err = await page.evaluate(async () => {
      const { load } = await import("/colibri.js");
      return load({ model: "olmoe", backend: "webgpu", hybrid: "maybe" }).then(() => null, (e) => String(e));
    });
    assert.match(err, /unknown hybrid/);
  } finally {
    await browser.close();
  }
});
