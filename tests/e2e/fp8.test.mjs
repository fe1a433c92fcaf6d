// Block-scaled FP8 (tests/fixtures/deepseek_v3_fp8, converted with the defaults: FP8 kept)
// in the browser: the wasm CPU backend (decode-then-dot on SIMD128's build) and WebGPU
// (weights.wgsl's e4m3 decoder) give the native CPU path's tokens and logits bit for bit.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

let ref;

before(async () => {
  ref = await nativeReference({ model: "deepseek_v3_fp8", prompt: [5, 17, 3, 42, 7, 99, 120, 250], n: 10, convertArgs: [] });
});

after(async () => {
  if (ref) await ref.stop();
});

test("FP8 in the browser: the native bits on the CPU backend and on WebGPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => ref.run(page, opts);
    const cpu = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(cpu.stats.backend, "cpu");
    ref.sameBits(cpu, "cpu");
    const gpu = await run({ backend: "webgpu", logits: true });
    assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
    ref.sameBits(gpu, "webgpu");
  } finally {
    await browser.close();
  }
});
