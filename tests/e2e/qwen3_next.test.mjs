// qwen3_next (Gated DeltaNet linear-attention layers with a recurrent state between gated
// full-attention layers, zero-centred norms, a gated shared expert) in the browser: the
// wasm CPU backend gives the native CPU path's tokens and logits bit for bit, on one
// thread and on two (the delta rule, the causal conv, softplus and the gated norm are
// the same Rust in a fixed order), and so does WebGPU (deltanet_conv.wgsl, l2norm.wgsl,
// deltanet_gates.wgsl, delta_rule.wgsl, gate_mul.wgsl); `auto` measures SwiftShader as
// slower and runs on the CPU backend.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

let ref;

before(async () => {
  // 50 prompt positions: the prefill's delta rule then runs its heads as a parallel region
  // (6 heads x 12 x 10 state floats x 50 positions >= 2^15, deltanet::for_each_head), with
  // the engine's worker taking part in the two-thread build.
  const prompt = Array.from({ length: 50 }, (_, i) => (i * 37 + 5) % 251);
  ref = await nativeReference({ model: "qwen3_next", prompt, n: 10, quant: "int4" });
});

after(async () => {
  if (ref) await ref.stop();
});

test("qwen3_next in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => ref.run(page, opts);
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
    // One full-attention layer of four caches K and V (2 kv heads x 24); the three linear
    // layers keep 6 x 12 x 10 delta-rule floats and 3 x 108 conv inputs each.
    assert.equal(one.stats.attention, "gqa+deltanet");
    assert.equal(one.stats.kvCacheBytesPerToken, 2 * 2 * 24 * 4);
    assert.equal(one.stats.recurrentStateBytes, 3 * (6 * 12 * 10 + 3 * 108) * 4);
    ref.sameBits(one, "cpu, 1 thread");
    const two = await run({ backend: "cpu", logits: true, threads: 2 });
    assert.equal(two.stats.threads, 2, JSON.stringify(two.stats));
    ref.sameBits(two, "cpu, 2 threads");

    const gpu = await run({ backend: "webgpu", logits: true });
    assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
    ref.sameBits(gpu, "webgpu");
    // Speed on SwiftShader (software WebGPU): for the record, not a gate.
    console.log("qwen3_next decode tokens/s:", JSON.stringify({ webgpu: gpu.stats.tokensPerSecond, cpu1: one.stats.tokensPerSecond, cpu2: two.stats.tokensPerSecond, adapter: gpu.stats.adapter }));

    const auto = await run({ backend: "auto", logits: true });
    assert.equal(auto.stats.backend, "cpu", JSON.stringify(auto.stats));
    ref.sameBits(auto, "auto");
  } finally {
    await browser.close();
  }
});
