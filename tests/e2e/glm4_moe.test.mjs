// glm4_moe in the browser (partial RoPE, qkv bias, per-head q/k norm, the sigmoid router
// with its correction bias and routed scaling, an ungated shared expert, a dense first
// layer): WebGPU (route.wgsl's sigmoid path) and the wasm CPU backend both give the
// native CPU path's tokens and logits bit for bit.
import { test, before, after } from "node:test";
import { readFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import assert from "node:assert/strict";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, generateInPage, ARTIFACTS, assertSameBits } from "./harness.mjs";

const MODEL = "glm4_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 10;
let fx, helper, nativeIds, nativeLogits;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int8");
  const g = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const out = join(tmpdir(), `colibri-e2e-glm4-logits-${process.pid}.f32`);
  coli(["logits", "--model", fx.path, "--ids", PROMPT.join(","), "--out", out]);
  nativeLogits = new Float32Array(readFileSync(out).buffer.slice(0));
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

test("glm4_moe in the browser: the native bits on WebGPU and on the CPU backend", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => generateInPage(page, helper.url, { model: MODEL, prompt: PROMPT, n: NEW, ...opts });
    const gpu = await run({ backend: "webgpu", logits: true });
    assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
    assertSameBits(gpu, nativeIds, nativeLogits, "webgpu");
    const cpu = await run({ backend: "cpu", logits: true });
    assert.equal(cpu.stats.backend, "cpu");
    assertSameBits(cpu, nativeIds, nativeLogits, "cpu");
  } finally {
    await browser.close();
  }
});
