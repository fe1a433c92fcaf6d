// glm4_moe in the browser (partial RoPE, qkv bias, per-head q/k norm, the sigmoid router
// with its correction bias and routed scaling, an ungated shared expert, a dense first
// layer): WebGPU (route.wgsl's sigmoid path) and the wasm CPU backend both give the
// native CPU path's tokens and logits bit for bit.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

let ref;

before(async () => {
  ref = await nativeReference({ model: "glm4_moe", prompt: [5, 17, 3, 42, 7, 99, 120, 250], n: 10, quant: "int8" });
});

after(async () => {
  if (ref) await ref.stop();
});

test("glm4_moe in the browser: the native bits on WebGPU and on the CPU backend", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const gpu = await ref.run(page, { backend: "webgpu", logits: true });
    assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
    ref.sameBits(gpu, "webgpu");
    const cpu = await ref.run(page, { backend: "cpu", logits: true });
    assert.equal(cpu.stats.backend, "cpu");
    ref.sameBits(cpu, "cpu");
  } finally {
    await browser.close();
  }
});
