// deepseek_v3 (MLA attention, sigmoid/group router, shared experts) in the browser: the
// wasm CPU backend gives the native CPU path's tokens and logits bit for bit, on one
// thread and on two, and so does WebGPU (mla_absorb.wgsl and attention.wgsl's MLA
// layout over the compressed cache); `auto` measures SwiftShader as slower and runs on
// the CPU backend.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, generateInPage, ARTIFACTS, assertSameBits } from "./harness.mjs";

const MODEL = "deepseek_v3";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 10;
let fx, helper, nativeIds, nativeLogits;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int8");
  const g = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const out = join(tmpdir(), `colibri-e2e-deepseek-logits-${process.pid}.f32`);
  coli(["logits", "--model", fx.path, "--ids", PROMPT.join(","), "--out", out]);
  nativeLogits = new Float32Array(readFileSync(out).buffer.slice(0));
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

const sameBits = (r, what) => assertSameBits(r, nativeIds, nativeLogits, what);

test("deepseek_v3 in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => generateInPage(page, helper.url, { model: MODEL, prompt: PROMPT, n: NEW, ...opts });
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
    // The cache holds the latent (28) and the rotary key (10) per layer (3), in f32.
    assert.equal(one.stats.attention, "mla");
    assert.equal(one.stats.kvCacheBytesPerToken, (28 + 10) * 3 * 4);
    sameBits(one, "cpu, 1 thread");
    const two = await run({ backend: "cpu", logits: true, threads: 2 });
    assert.equal(two.stats.threads, 2, JSON.stringify(two.stats));
    sameBits(two, "cpu, 2 threads");

    const gpu = await run({ backend: "webgpu", logits: true });
    assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
    sameBits(gpu, "webgpu");

    const auto = await run({ backend: "auto", logits: true });
    assert.equal(auto.stats.backend, "cpu", JSON.stringify(auto.stats));
    sameBits(auto, "auto");
  } finally {
    await browser.close();
  }
});
