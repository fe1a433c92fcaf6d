// The browser engine on WebGPU (SwiftShader in headless Chromium): the same tokens as
// the native CPU path, logits compared with `coli logits` (ULP report), the GPU expert
// pool as a tier, and the measured `auto` choice.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, generateInPage, ARTIFACTS } from "./harness.mjs";

const MODEL = "qwen3_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 12;
let fx, helper, nativeIds, nativeLogits;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int4");
  const g = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const out = join(tmpdir(), `colibri-e2e-webgpu-logits-${process.pid}.f32`);
  coli(["logits", "--model", fx.path, "--ids", PROMPT.join(","), "--out", out]);
  nativeLogits = new Float32Array(readFileSync(out).buffer.slice(0));
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

const runInPage = (page, backend, logits = false) => generateInPage(page, helper.url, { model: MODEL, prompt: PROMPT, n: NEW, backend, logits });

// Distance in units in the last place between two f32 bit patterns.
function ulps(a, b) {
  const ord = (u) => (u & 0x80000000 ? -(u & 0x7fffffff) : u);
  return Math.abs(ord(a) - ord(b));
}

test("backend webgpu: stats say webgpu, greedy tokens equal coli generate, logits match coli logits; a reload fetches nothing", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const r = await runInPage(page, "webgpu", true);
    assert.equal(r.stats.backend, "webgpu", JSON.stringify(r.stats));
    assert.ok(r.stats.adapter, "the adapter is named");
    // Chromium implements WGSL's packed_4x8_integer_dot_product (SwiftShader included), so the
    // integer matmuls run qmatmul_dp4a.wgsl, and the bit checks below cover it.
    assert.equal(r.stats.dp4a, true, "WebGPU integer matmuls use dot4I8Packed");
    assert.deepEqual(r.ids, nativeIds, "greedy tokens on WebGPU differ from coli generate");

    const want = Array.from(new Uint32Array(nativeLogits.buffer));
    assert.equal(r.logitsBits.length, want.length);
    const d = r.logitsBits.map((b, i) => ulps(b, want[i]));
    const report = {
      adapter: r.stats.adapter,
      dp4a: r.stats.dp4a,
      logits: d.length,
      maxUlp: Math.max(...d),
      meanUlp: d.reduce((a, b) => a + b, 0) / d.length,
      differing: d.filter((x) => x > 0).length,
    };
    writeFileSync(join(ARTIFACTS, "webgpu-ulp.json"), JSON.stringify({ report, stats: r.stats }, null, 2));
    console.log("WebGPU vs native CPU logits:", JSON.stringify(report));
    // The kernels reproduce the CPU's arithmetic (docs/gpu.md): the goal is bit identity.
    assert.equal(report.maxUlp, 0, `logits differ by up to ${report.maxUlp} ULP on ${report.differing} values`);

    // The GPU pool is a tier: repeated experts were served from it, and the tier map says so.
    assert.ok(r.stats.tiers.gpu > 0, `no GPU pool hits: ${JSON.stringify(r.stats.tiers)}`);
    assert.ok(r.tiers.includes(3), "no expert is reported as resident on the GPU");
    // The router lookahead guessed next layers' experts and its recall is reported.
    const p = r.stats.prefetch;
    assert.ok(p && p.routed > 0 && p.predicted > 0, `no lookahead record: ${JSON.stringify(r.stats)}`);
    assert.equal(r.stats.prefetchRecall, p.predictedHits / p.routed);
    assert.ok(p.wastedBytes >= 0);

    // A reload on WebGPU fetches no expert bytes: they come from the browser's disk tier.
    const again = await runInPage(page, "webgpu");
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.bytesFetched, 0, JSON.stringify(again.stats));
    assert.ok(again.stats.tierEvents.diskHits > 0);
    // The first run's experts, learned by the helper, are pinned in the GPU pool at load:
    // every use of the same prompt is a GPU pool hit.
    assert.ok(again.stats.pins.gpuExperts > 0, JSON.stringify(again.stats.pins));
    assert.equal(again.stats.hitRates.gpu, 1, JSON.stringify(again.stats.tiers));
  } finally {
    await browser.close();
  }
});

test("backend auto measures WebGPU against the CPU backend and keeps the faster", async () => {
  const browser = await launchBrowser();
  try {
    const r = await runInPage(await browser.context.newPage(), "auto");
    const a = r.stats.auto;
    assert.ok(a && a.webgpuMs > 0 && a.cpuMs >= 0, `auto did not measure: ${JSON.stringify(r.stats)}`);
    assert.equal(r.stats.backend, a.webgpuMs <= a.cpuMs ? "webgpu" : "cpu");
    assert.deepEqual(r.ids, nativeIds);
  } finally {
    await browser.close();
  }
});
