// The Gated DeltaNet families in the browser, one test body for each: qwen3_next (linear-
// attention layers with a recurrent state between gated full-attention layers, zero-centred
// norms, a gated shared expert) and qwen3_5_moe (Qwen3.5 MoE as published: the image-text
// checkpoint's text tower, separate DeltaNet input projections, every layer MoE with fused
// experts), converted to int4. The wasm CPU backend gives the native CPU path's tokens and
// logits bit for bit, on one thread and on two (the delta rule, the causal conv, softplus
// and the gated norm are the same Rust in a fixed order), and so does WebGPU
// (deltanet_conv.wgsl, l2norm.wgsl, deltanet_gates.wgsl, delta_rule.wgsl, gate_mul.wgsl;
// qwen3_5_moe's projections uploaded as stored); `auto` measures SwiftShader as slower and
// runs on the CPU backend.
import { test } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

// Each fixture: one full-attention layer of four caches K and V (2 kv heads x 24); the
// three linear layers keep `heads` x 12 x 10 delta-rule floats and 3 x `conv` conv inputs
// each. The prompt is long enough for the prefill's delta rule to run its heads as a
// parallel region (heads x 12 x 10 state floats x positions >= 2^15,
// deltanet::for_each_head), with the engine's worker taking part in the two-thread build.
const families = [
  { model: "qwen3_next", positions: 50, step: 37, offset: 5, heads: 6, conv: 108 },
  { model: "qwen3_5_moe", positions: 72, step: 41, offset: 7, heads: 4, conv: 88 },
];

for (const f of families) {
  test(`${f.model} in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU`, async () => {
    const prompt = Array.from({ length: f.positions }, (_, i) => (i * f.step + f.offset) % 251);
    const ref = await nativeReference({ model: f.model, prompt, n: 10, quant: "int4" });
    const browser = await launchBrowser();
    try {
      const page = await browser.context.newPage();
      const run = (opts) => ref.run(page, opts);
      const one = await run({ backend: "cpu", logits: true, threads: 1 });
      assert.equal(one.stats.backend, "cpu");
      assert.equal(one.stats.attention, "gqa+deltanet");
      assert.equal(one.stats.kvCacheBytesPerToken, 2 * 2 * 24 * 4);
      assert.equal(one.stats.recurrentStateBytes, 3 * (f.heads * 12 * 10 + 3 * f.conv) * 4);
      ref.sameBits(one, "cpu, 1 thread");
      const two = await run({ backend: "cpu", logits: true, threads: 2 });
      assert.equal(two.stats.threads, 2, JSON.stringify(two.stats));
      ref.sameBits(two, "cpu, 2 threads");

      const gpu = await run({ backend: "webgpu", logits: true });
      assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
      ref.sameBits(gpu, "webgpu");
      // Speed on SwiftShader (software WebGPU): for the record, not a gate.
      console.log(`${f.model} decode tokens/s:`, JSON.stringify({ webgpu: gpu.stats.tokensPerSecond, cpu1: one.stats.tokensPerSecond, cpu2: two.stats.tokensPerSecond, adapter: gpu.stats.adapter }));

      const auto = await run({ backend: "auto", logits: true });
      assert.equal(auto.stats.backend, "cpu", JSON.stringify(auto.stats));
      ref.sameBits(auto, "auto");
    } finally {
      await browser.close();
      await ref.stop();
    }
  });
}
