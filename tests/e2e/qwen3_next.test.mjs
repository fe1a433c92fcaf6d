// qwen3_next (Gated DeltaNet linear-attention layers with a recurrent state between gated
// full-attention layers, zero-centred norms, a gated shared expert) in the browser: the
// wasm CPU backend gives the native CPU path's tokens and logits bit for bit, on one
// thread and on two (the delta rule, the causal conv, softplus and the gated norm are
// the same Rust in a fixed order). WebGPU has no DeltaNet kernels yet, so `webgpu` is
// refused with a clear error and `auto` runs on the CPU backend.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, generateInPage, ARTIFACTS, assertSameBits } from "./harness.mjs";

const MODEL = "qwen3_next";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250, 11, 64];
const NEW = 10;
let fx, helper, nativeIds, nativeLogits;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int4");
  const g = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const out = join(tmpdir(), `colibri-e2e-qwen3-next-logits-${process.pid}.f32`);
  coli(["logits", "--model", fx.path, "--ids", PROMPT.join(","), "--out", out]);
  nativeLogits = new Float32Array(readFileSync(out).buffer.slice(0));
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

const sameBits = (r, what) => assertSameBits(r, nativeIds, nativeLogits, what);

test("qwen3_next on the browser's CPU backend: the native bits on 1 and 2 threads; webgpu refused, auto on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = (opts) => generateInPage(page, helper.url, { model: MODEL, prompt: PROMPT, n: NEW, ...opts });
    const one = await run({ backend: "cpu", logits: true, threads: 1 });
    assert.equal(one.stats.backend, "cpu");
    // One full-attention layer of four caches K and V (2 kv heads x 24); the three linear
    // layers keep 6 x 12 x 10 delta-rule floats and 3 x 108 conv inputs each.
    assert.equal(one.stats.attention, "gqa+deltanet");
    assert.equal(one.stats.kvCacheBytesPerToken, 2 * 2 * 24 * 4);
    assert.equal(one.stats.recurrentStateBytes, 3 * (6 * 12 * 10 + 3 * 108) * 4);
    sameBits(one, "cpu, 1 thread");
    const two = await run({ backend: "cpu", logits: true, threads: 2 });
    assert.equal(two.stats.threads, 2, JSON.stringify(two.stats));
    sameBits(two, "cpu, 2 threads");

    const refused = await run({ backend: "webgpu" }).then(
      () => null,
      (e) => String(e),
    );
    assert.ok(refused, "backend webgpu must refuse qwen3_next");
    assert.match(refused, /qwen3_next models are not supported on the GPU backend yet/);

    const auto = await run({ backend: "auto", logits: true });
    assert.equal(auto.stats.backend, "cpu", JSON.stringify(auto.stats));
    sameBits(auto, "auto");
  } finally {
    await browser.close();
  }
});
