// The browser engine end to end: a real helper, real Chromium (WebGPU on SwiftShader),
// the real wasm engine loaded through /colibri.js, compared with the native `coli`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, copyDir, generateInPage, ARTIFACTS, assertSameBits } from "./harness.mjs";
import { startPageServer } from "./servers.mjs";

const MODEL = "qwen3_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 12;
// Pages of another origin that use the helper's engine: one plain (a widget host; not
// cross-origin isolated) and one that isolates itself (COOP + COEP).
const ISOLATING = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp" };
let fx, port, helper, nativeIds, nativeLogits, plainSite, isolatedSite;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int4");
  const g = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const out = join(tmpdir(), `colibri-e2e-logits-${process.pid}.f32`);
  coli(["logits", "--model", fx.path, "--ids", PROMPT.join(","), "--out", out]);
  nativeLogits = new Float32Array(readFileSync(out).buffer.slice(0));
  plainSite = await startPageServer({ "/": "<!doctype html><title>plain</title>" });
  isolatedSite = await startPageServer({ "/": "<!doctype html><title>isolated</title>" }, { headers: ISOLATING });
  port = await freePort();
  helper = await startHelper({ modelsDir: fx.modelsDir, port, extra: ["--allow-origin", plainSite.origin, "--allow-origin", isolatedSite.origin] });
});

after(async () => {
  if (helper) await helper.stop();
  if (plainSite) await plainSite.stop();
  if (isolatedSite) await isolatedSite.stop();
  if (fx) fx.cleanup();
});

const runInPage = (page, url, opts = {}) => generateInPage(page, url, { model: MODEL, prompt: PROMPT, n: NEW, ...opts });

test("the browser engine gives the native CPU path's tokens and logits bit for bit; a reload fetches no expert bytes", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const first = await runInPage(page, helper.url, { logits: true });
    assert.ok(first.hasGpu, "WebGPU should be exposed (SwiftShader)");
    assert.deepEqual(first.ids, nativeIds, "greedy tokens differ from coli generate");
    const want = Array.from(new Uint32Array(nativeLogits.buffer));
    assert.equal(first.logitsBits.length, want.length);
    const diff = first.logitsBits.findIndex((b, i) => b !== want[i]);
    assert.equal(diff, -1, `logit ${diff} differs from coli logits`);
    assert.equal(first.stats.backend, "cpu");
    assert.ok(first.stats.bytesFetched > 0, "a cold start must fetch experts");
    assert.ok(first.stats.diskEnabled, `disk tier off: ${JSON.stringify(first.stats)}`);
    // Fetched from the helper (at load, for the experts `coli generate` taught the helper
    // to pin, and during the steps).
    assert.ok(first.stats.tierEvents.helperFetches > 0);
    await page.screenshot({ path: join(ARTIFACTS, "browser-engine.png") });

    // Same profile, new page load: the experts come from the browser's disk tier.
    const again = await runInPage(page, helper.url);
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.bytesFetched, 0, `reload fetched ${again.stats.bytesFetched} expert bytes: ${JSON.stringify(again.stats)}`);
    assert.equal(again.stats.tiers.helper, 0);
    // From OPFS: read at load for the pins learned from the first run (GET /api/usage), the
    // rest as the steps use them.
    assert.ok(again.stats.tierEvents.diskHits > 0, "experts should come from OPFS after a reload");
    assert.ok(again.stats.pins.ramExperts > 0, "the first run's experts are pinned at load");
    writeFileSync(join(ARTIFACTS, "browser-engine-stats.json"), JSON.stringify({ first: first.stats, reload: again.stats }, null, 2));
  } finally {
    await browser.close();
  }
});

const sameBits = (r, what) => assertSameBits(r, nativeIds, nativeLogits, what);

test("the CPU backend on 2 and 3 threads (isolated pages) and on 1 (a page that is not isolated) gives the native bits", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    // The helper's own document is cross-origin isolated: the threaded build, a pool of 2.
    const own = await runInPage(page, helper.url, { logits: true, threads: 2 });
    assert.equal(own.isolated, true, "the helper's pages must be cross-origin isolated");
    assert.equal(own.stats.threads, 2, JSON.stringify(own.stats));
    assert.match(own.stats.threadsReason, /threads: 2/);
    // The integer kernels' wasm SIMD128 path with relaxed SIMD's int4 dot (the threaded
    // build), checked to the bit against native AVX2/512.
    assert.equal(own.stats.simd, "simd128+relaxed", JSON.stringify(own.stats));
    sameBits(own, "helper page, 2 threads");
    // More threads than this machine's cores, as asked: still the same bits.
    const three = await runInPage(page, helper.url, { logits: true, threads: 3 });
    assert.equal(three.stats.threads, 3, JSON.stringify(three.stats));
    sameBits(three, "helper page, 3 threads");
    // Asked for one thread on an isolated page: the threaded build (relaxed SIMD), a pool of 1.
    const one = await runInPage(page, helper.url, { logits: true, threads: 1 });
    assert.equal(one.stats.threads, 1);
    assert.equal(one.stats.simd, "simd128+relaxed", JSON.stringify(one.stats));
    sameBits(one, "helper page, 1 thread");
    // A page of another origin that is not isolated (the widget's case): one thread, and why.
    const plain = await runInPage(page, helper.url, { logits: true, threads: 2, pageUrl: `${plainSite.url}/` });
    assert.equal(plain.isolated, false);
    assert.equal(plain.stats.threads, 1, JSON.stringify(plain.stats));
    assert.match(plain.stats.threadsReason, /not cross-origin isolated/);
    // ...on the one-thread build (plain SIMD128, no relaxed SIMD): the same bits too.
    assert.equal(plain.stats.simd, "simd128", JSON.stringify(plain.stats));
    sameBits(plain, "page not isolated, 1 thread");
    // A page of another origin that isolates itself: the pool's workers start from the
    // helper's scripts there too (CORS + CORP), 2 threads.
    const iso = await runInPage(page, helper.url, { logits: true, threads: 2, pageUrl: `${isolatedSite.url}/` });
    assert.equal(iso.isolated, true);
    assert.equal(iso.stats.threads, 2, JSON.stringify(iso.stats));
    sameBits(iso, "isolated page of another origin, 2 threads");
  } finally {
    await browser.close();
  }
});

test("both wasm builds' dot-product paths give the scalar reference's bits (kernelSelfCheck)", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/`);
    const got = await page.evaluate(async () => {
      const out = { isolated: self.crossOriginIsolated };
      for (const pkg of ["pkg", "pkg-threads"]) {
        const m = await import(`/${pkg}/colibri_wasm.js`);
        await m.default();
        try {
          out[pkg] = m.kernelSelfCheck();
        } catch (e) {
          out[pkg] = String(e.message || e);
        }
      }
      return out;
    });
    assert.equal(got.isolated, true);
    // Each build compares its SIMD128 path (relaxed int4 dot in pkg-threads) and the
    // scalar reference on every shape: at least two paths' worth of products agreed.
    for (const pkg of ["pkg", "pkg-threads"]) {
      assert.equal(typeof got[pkg], "number", `${pkg}: ${got[pkg]}`);
      assert.ok(got[pkg] >= 3200, `${pkg}: ${got[pkg]} products checked`);
    }
  } finally {
    await browser.close();
  }
});

test("a helper killed and restarted mid-generation is recovered from", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    await page.evaluate(async (model) => {
      const { load } = await import("/colibri.js");
      window.engine = await load({ model, backend: "cpu" });
    }, MODEL);
    // Experts are not fetched yet (fresh profile): kill the helper, start generating,
    // and bring the helper back while the engine is retrying.
    await helper.stop();
    const gen = page.evaluate(({ prompt, n }) => window.engine.generate({ ids: prompt, maxNewTokens: n, temperature: 0, ignoreEos: true }), { prompt: PROMPT, n: NEW });
    await new Promise((r) => setTimeout(r, 1500));
    helper = await startHelper({ modelsDir: fx.modelsDir, port });
    const r = await gen;
    assert.deepEqual(r.ids, nativeIds);
    const stats = await page.evaluate(() => window.engine.stats());
    assert.ok(stats.retries > 0 || stats.requests > 0);
  } finally {
    await browser.close();
  }
});

test("corrupt expert bytes from the helper are refused and never stored", async () => {
  // A second models directory whose data file has every layer-0 expert damaged.
  const bad = join(fx.modelsDir, "..", `colibri-e2e-bad-${process.pid}`);
  copyDir(fx.modelsDir, bad);
  const manifest = JSON.parse(readFileSync(join(bad, MODEL, "colibri.json"), "utf8"));
  const dataPath = join(bad, MODEL, manifest.data_file);
  const data = readFileSync(dataPath);
  for (const e of manifest.experts.layers[0].experts) data[e.offset + Math.floor(e.length / 2)] ^= 0xff;
  writeFileSync(dataPath, data);

  const badPort = await freePort();
  let badHelper = await startHelper({ modelsDir: bad, port: badPort });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${badHelper.url}/health`);
    const err = await page.evaluate(async ({ model, prompt }) => {
      const { load } = await import("/colibri.js");
      window.engine = await load({ model, backend: "cpu" });
      try {
        await window.engine.generate({ ids: prompt, maxNewTokens: 2, temperature: 0 });
        return null;
      } catch (e) {
        return String(e.message);
      }
    }, { model: MODEL, prompt: PROMPT });
    assert.ok(err && /checksum/.test(err), `expected a checksum error, got ${err}`);
    const s1 = await page.evaluate(() => window.engine.stats());
    // The step failed at layer 0, whose experts were all bad: none of them reached the disk
    // tier (layer 1's good experts may have, pinned at load by the usage the copy carries).
    const layers = manifest.experts.layers;
    const tiers = await page.evaluate(async () => Array.from(await window.engine.expertTiers()));
    const layer0 = tiers.slice(layers[0].layer * layers[0].experts.length, (layers[0].layer + 1) * layers[0].experts.length);
    assert.ok(layer0.every((t) => t === 0), `corrupt experts were stored: ${JSON.stringify(s1)}`);
    // Now the same origin's helper serves the good bytes: nothing corrupt was kept.
    await badHelper.stop();
    badHelper = await startHelper({ modelsDir: fx.modelsDir, port: badPort });
    const r = await page.evaluate(({ prompt, n }) => window.engine.generate({ ids: prompt, maxNewTokens: n, temperature: 0, ignoreEos: true }), { prompt: PROMPT, n: NEW });
    assert.deepEqual(r.ids, nativeIds);
    const s2 = await page.evaluate(() => window.engine.stats());
    assert.equal(s2.corruptDropped, 0, "a corrupt expert had been stored");
  } finally {
    await browser.close();
    await badHelper.stop();
  }
});

test("where OPFS is missing, IndexedDB is the disk tier: same tokens, and a reload fetches no expert bytes", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const run = async () => {
      const r = await runInPage(page, helper.url, { storage: "indexeddb" });
      r.dbs = await page.evaluate(async () => (await indexedDB.databases()).map((d) => d.name));
      return r;
    };
    const first = await run();
    assert.deepEqual(first.ids, nativeIds);
    assert.equal(first.stats.diskKind, "indexeddb", JSON.stringify(first.stats));
    assert.ok(first.stats.diskExperts > 0 && first.stats.bytesFetched > 0);
    assert.ok(first.dbs.some((n) => n.startsWith(`colibri-${MODEL}-`)), `no expert database: ${first.dbs}`);
    // Reload: the experts are read back from IndexedDB (asynchronously, steps retried).
    const again = await run();
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.bytesFetched, 0, JSON.stringify(again.stats));
    assert.ok(again.stats.tierEvents.diskHits > 0);
  } finally {
    await browser.close();
  }
});

test("a second tab on the same model runs on RAM and says why, instead of storing every expert twice", async () => {
  const browser = await launchBrowser();
  try {
    const first = await runInPage(await browser.context.newPage(), helper.url);
    assert.equal(first.stats.diskKind, "opfs");
    // The first tab's worker still holds the model's OPFS files.
    const second = await runInPage(await browser.context.newPage(), helper.url);
    assert.deepEqual(second.ids, nativeIds);
    assert.equal(second.stats.diskEnabled, false);
    assert.equal(second.stats.diskKind, null, "it must not fall back to IndexedDB");
    assert.match(second.stats.diskError, /another colibri tab or window is using/);
  } finally {
    await browser.close();
  }
});
