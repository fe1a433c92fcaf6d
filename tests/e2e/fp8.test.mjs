// Block-scaled FP8 (tests/fixtures/deepseek_v3_fp8, converted with the defaults: FP8 kept)
// in the browser: the wasm CPU backend (SIMD128's FP8 kernel for one position, decode
// then dot for more) and WebGPU (weights.wgsl's e4m3 decoder) give the native CPU path's
// tokens and logits bit for bit. A one-token prompt makes the compared logits come from
// the one-position kernel too.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

const refs = [];

before(async () => {
  for (const prompt of [[5, 17, 3, 42, 7, 99, 120, 250], [250]]) {
    refs.push(await nativeReference({ model: "deepseek_v3_fp8", prompt, n: 10, convertArgs: [] }));
  }
});

after(async () => {
  for (const ref of refs) await ref.stop();
});

test("FP8 in the browser: the native bits on the CPU backend and on WebGPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    for (const [k, ref] of refs.entries()) {
      const cpu = await ref.run(page, { backend: "cpu", logits: true, threads: 1 });
      assert.equal(cpu.stats.backend, "cpu");
      ref.sameBits(cpu, `cpu, prompt ${k}`);
      const gpu = await ref.run(page, { backend: "webgpu", logits: true });
      assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
      ref.sameBits(gpu, `webgpu, prompt ${k}`);
    }
  } finally {
    await browser.close();
  }
});
