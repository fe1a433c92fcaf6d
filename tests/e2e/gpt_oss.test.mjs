// gpt_oss with its experts in MXFP4 (the released layout: e2m1 blocks + e8m0 scales,
// streamed in that format) in the browser: the wasm CPU backend (the MXFP4 kernel's
// SIMD128 path, attention sinks, the alternating sliding window, the clamped SwiGLU)
// gives the native CPU path's tokens and logits bit for bit, on one thread and on two, and
// so does WebGPU (attention sinks in attention.wgsl, the MXFP4 experts in
// mxfp4_matmul.wgsl); `auto` measures SwiftShader as slower and runs on the CPU.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, ROOT, freePort, startHelper, launchBrowser, generateInPage, ARTIFACTS, assertSameBits } from "./harness.mjs";

const MODEL = "gpt_oss_mxfp4";
// Longer than the fixture's sliding window (7), so the window decides some rows.
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250, 11, 64];
const NEW = 10;
let dir, helper, nativeIds, nativeLogits;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  dir = mkdtempSync(join(tmpdir(), "colibri-e2e-"));
  const path = join(dir, MODEL);
  // No --quant: the experts stay MXFP4, the dense weights become int8.
  coli(["convert", join(ROOT, "tests/fixtures", MODEL), "-o", path]);
  const manifest = JSON.parse(readFileSync(join(path, "colibri.json"), "utf8"));
  assert.equal(manifest.experts.layers[0].parts[0].dtype, "mxfp4");
  const g = JSON.parse(coli(["generate", "--model", path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const out = join(tmpdir(), `colibri-e2e-gpt-oss-logits-${process.pid}.f32`);
  coli(["logits", "--model", path, "--ids", PROMPT.join(","), "--out", out]);
  nativeLogits = new Float32Array(readFileSync(out).buffer.slice(0));
  helper = await startHelper({ modelsDir: dir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const sameBits = (r, what) => assertSameBits(r, nativeIds, nativeLogits, what);

test("gpt_oss with MXFP4 experts in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU; auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => generateInPage(page, helper.url, { model: MODEL, prompt: PROMPT, n: NEW, ...opts });
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
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
