// deepseek_v3 (MLA attention, sigmoid/group router, shared experts) in the browser: the
// wasm CPU backend gives the native CPU path's tokens and logits bit for bit, on one
// thread and on two, and so does WebGPU (mla_absorb.wgsl and attention.wgsl's MLA
// layout over the compressed cache); `auto` measures SwiftShader as slower and runs on
// the CPU backend.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

let ref;

before(async () => {
  ref = await nativeReference({ model: "deepseek_v3", prompt: [5, 17, 3, 42, 7, 99, 120, 250], n: 10, quant: "int8" });
});

after(async () => {
  if (ref) await ref.stop();
});

test("deepseek_v3 in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => ref.run(page, opts);
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
    // The cache holds the latent (28) and the rotary key (10) per layer (3), in f32.
    assert.equal(one.stats.attention, "mla");
    assert.equal(one.stats.kvCacheBytesPerToken, (28 + 10) * 3 * 4);
    ref.sameBits(one, "cpu, 1 thread");
    const two = await run({ backend: "cpu", logits: true, threads: 2 });
    assert.equal(two.stats.threads, 2, JSON.stringify(two.stats));
    ref.sameBits(two, "cpu, 2 threads");

    const gpu = await run({ backend: "webgpu", logits: true });
    assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
    ref.sameBits(gpu, "webgpu");

    const auto = await run({ backend: "auto", logits: true });
    assert.equal(auto.stats.backend, "cpu", JSON.stringify(auto.stats));
    ref.sameBits(auto, "auto");
  } finally {
    await browser.close();
  }
});
