// DeepSeek Sparse Attention in the browser, one test body for each family: deepseek_v32
// (the indexer's rope slice as halves) and glm_moe_dsa (as interleaved pairs, a "shared"
// middle layer that reuses layer 0's selection), converted with the defaults. The prompt
// (30 positions) and the 10 decoded tokens run past the fixtures' index_topk (6), so the
// indexer's choice decides. The wasm CPU backend gives the native CPU path's tokens and
// logits bit for bit (the same Rust), and so does WebGPU (layernorm.wgsl,
// index_scores.wgsl read back for the same top-k choice, attention.wgsl over the kept
// positions).
import { test } from "node:test";
import assert from "node:assert/strict";
import { launchBrowser, nativeReference } from "./harness.mjs";

// Cache floats per token: latent 24 + rotary key 8, and the indexer key 16 on the layers
// that run the indexer (3 of 3, or 2 of 3 with glm_moe_dsa's shared layer).
const families = [
  { model: "deepseek_v32", cacheFloats: 3 * (24 + 8 + 16) },
  { model: "glm_moe_dsa", cacheFloats: 2 * (24 + 8 + 16) + (24 + 8) },
];

for (const f of families) {
  test(`${f.model} in the browser: the native bits on the CPU backend and on WebGPU`, async () => {
    const prompt = Array.from({ length: 30 }, (_, i) => (i * 29 + 3) % 300);
    const ref = await nativeReference({ model: f.model, prompt, n: 10, quant: "int4" });
    const browser = await launchBrowser();
    try {
      const page = await browser.context.newPage();
      const run = (opts) => ref.run(page, opts);
      const cpu = await run({ backend: "cpu", logits: true, threads: 1 });
      assert.equal(cpu.stats.backend, "cpu");
      assert.equal(cpu.stats.attention, "mla");
      assert.equal(cpu.stats.kvCacheBytesPerToken, f.cacheFloats * 4);
      ref.sameBits(cpu, "cpu");

      const gpu = await run({ backend: "webgpu", logits: true });
      assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
      ref.sameBits(gpu, "webgpu");
    } finally {
      await browser.close();
      await ref.stop();
    }
  });
}
