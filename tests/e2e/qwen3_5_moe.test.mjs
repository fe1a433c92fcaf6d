// qwen3_5_moe (Qwen3.5 MoE as published: the image-text checkpoint's text tower, separate
// Gated DeltaNet input projections, every layer MoE with fused experts) in the browser,
// converted to int4: the wasm CPU backend gives the native CPU path's tokens and logits bit
// for bit, on one thread and on two, and so does WebGPU (the same DeltaNet kernels as
// qwen3_next, its projections uploaded as stored); `auto` measures SwiftShader as slower
// and runs on the CPU backend.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

let ref;

before(async () => {
  // 72 prompt positions: the prefill's delta rule runs its heads as a parallel region
  // (4 heads x 12 x 10 state floats x 72 positions >= 2^15, deltanet::for_each_head).
  const prompt = Array.from({ length: 72 }, (_, i) => (i * 41 + 7) % 251);
  ref = await nativeReference({ model: "qwen3_5_moe", prompt, n: 10, quant: "int4" });
});

after(async () => {
  if (ref) await ref.stop();
});

test("qwen3_5_moe in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => ref.run(page, opts);
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
    // One full-attention layer of four caches K and V (2 kv heads x 24); the three linear
    // layers keep 4 x 12 x 10 delta-rule floats and 3 x 88 conv inputs each.
    assert.equal(one.stats.attention, "gqa+deltanet");
    assert.equal(one.stats.kvCacheBytesPerToken, 2 * 2 * 24 * 4);
    assert.equal(one.stats.recurrentStateBytes, 3 * (4 * 12 * 10 + 3 * 88) * 4);
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
