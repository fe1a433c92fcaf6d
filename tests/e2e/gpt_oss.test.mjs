// gpt_oss with its experts in MXFP4 (the released layout: e2m1 blocks + e8m0 scales,
// streamed in that format) in the browser: the wasm CPU backend (the MXFP4 kernel's
// SIMD128 path, attention sinks, the alternating sliding window, the clamped SwiGLU)
// gives the native CPU path's tokens and logits bit for bit, on one thread and on two, and
// so does WebGPU (attention sinks in attention.wgsl, the MXFP4 experts in
// mxfp4_matmul.wgsl); `auto` measures SwiftShader as slower and runs on the CPU.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { launchBrowser, nativeReference } from "./harness.mjs";

let ref;

before(async () => {
  // Longer than the fixture's sliding window (7), so the window decides some rows. No
  // --quant: the experts stay MXFP4, the dense weights become int8.
  ref = await nativeReference({ model: "gpt_oss_mxfp4", prompt: [5, 17, 3, 42, 7, 99, 120, 250, 11, 64], n: 10, convertArgs: [] });
  const manifest = JSON.parse(readFileSync(join(ref.path, "colibri.json"), "utf8"));
  assert.equal(manifest.experts.layers[0].parts[0].dtype, "mxfp4");
});

after(async () => {
  if (ref) await ref.stop();
});

test("gpt_oss with MXFP4 experts in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => ref.run(page, opts);
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
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
