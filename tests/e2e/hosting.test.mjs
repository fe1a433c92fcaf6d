// A converted model on a plain static host: a real nginx (tests/e2e/nginx.mjs, the
// configuration of docs/hosting.md) serves the model directory, and the browser engine
// loads it by URL, from a page of `coli serve` (another origin: CORS) and from a plain
// static page on nginx itself (no helper at all). Same tokens as `coli generate`; a
// reload makes no request to nginx at all (its access log says so).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, symlinkSync, writeFileSync, rmSync, existsSync, cpSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT, ARTIFACTS, coli, convertedFixture, freePort, startHelper, launchBrowser, generateInPage } from "./harness.mjs";
import { startNginx, readableByAll } from "./nginx.mjs";

const MODEL = "qwen3_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 12;
let fx, root, nginx, helper, nativeIds;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  if (!existsSync(join(ROOT, "web/pkg/colibri_wasm.js"))) throw new Error("web/pkg is missing: run tools/build-web.sh");
  fx = convertedFixture(MODEL, "int4");
  nativeIds = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"])).ids;
  // The static host's tree: the model under /models/ (and /one-range/, an nginx that
  // answers several ranges with the whole file, like S3), the web engine under /colibri/.
  root = mkdtempSync(join(tmpdir(), "colibri-static-"));
  for (const dir of ["models", "one-range", "private"]) {
    mkdirSync(join(root, dir));
    symlinkSync(fx.path, join(root, dir, MODEL));
  }
  // The browser engine as a site would publish it: web/'s module, worker and wasm.
  mkdirSync(join(root, "colibri"));
  for (const f of ["colibri.js", "colibri-worker.js"]) cpSync(join(ROOT, "web", f), join(root, "colibri", f));
  cpSync(join(ROOT, "web/pkg"), join(root, "colibri/pkg"), { recursive: true });
  writeFileSync(join(root, "index.html"), "<!doctype html><title>a static site</title>");
  readableByAll(root, fx.modelsDir);
  nginx = await startNginx({ root, extraLocations: "location /private/ { }" });
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (nginx) await nginx.stop();
  if (root) rmSync(root, { recursive: true, force: true });
  if (fx) fx.cleanup();
});

const modelFiles = (reqs) => reqs.filter((r) => /^\/(models|one-range)\//.test(r.uri || ""));

test("a page of coli serve loads a model from nginx (another origin, CORS): coli generate's tokens; a reload asks nginx nothing", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const model = `${nginx.url}/models/${MODEL}/`;
    const first = await generateInPage(page, helper.url, { model, prompt: PROMPT, n: NEW });
    assert.deepEqual(first.ids, nativeIds, "greedy tokens differ from coli generate");
    assert.ok(first.isolated, "the helper's page is cross-origin isolated, and still reads nginx's files (CORS)");
    assert.equal(first.stats.multiRange, true, `nginx answers several ranges at once: ${JSON.stringify(first.stats)}`);
    assert.ok(first.stats.bytesFetched > 0 && first.stats.diskEnabled, JSON.stringify(first.stats));
    const cold = modelFiles(nginx.requests());
    const experts = cold.filter((r) => r.uri.endsWith("/weights.bin") && r.range.includes(","));
    assert.ok(experts.length > 0 && experts.every((r) => r.status === 206), `multi-range expert requests: ${JSON.stringify(cold)}`);
    assert.ok(cold.some((r) => r.method === "OPTIONS" && r.status === 204), "the multi-range requests were preflighted");
    assert.equal(helper.log().includes(`/models/${MODEL}/weights.bin`), false, "the helper served no model bytes");

    // A new document in the same profile: experts from OPFS, the rest from the HTTP cache.
    const seen = nginx.requests().length;
    const again = await generateInPage(page, helper.url, { model, prompt: PROMPT, n: NEW });
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.bytesFetched, 0, JSON.stringify(again.stats));
    assert.deepEqual(nginx.requests().slice(seen), [], "the reload made requests to nginx");
    // No helper learns this model's usage: the tab kept its own (OPFS) and pinned by it.
    assert.equal(first.stats.pins.ramBudget, 0, "nothing learned at the first load: no pin budget (as natively)");
    assert.ok(again.stats.learnedUses > 0 && again.stats.pins.ramExperts > 0, JSON.stringify(again.stats.pins));
    const count = (f) => cold.filter(f).length;
    writeFileSync(join(ARTIFACTS, "hosting-nginx.json"), JSON.stringify({
      cold: { requests: cold.length, options: count((r) => r.method === "OPTIONS"), multiRange: experts.length, bytes: cold.reduce((a, r) => a + (r.bytes || 0), 0) },
      reload: { requests: nginx.requests().length - seen },
      stats: { first: first.stats, reload: again.stats },
      log: cold,
    }, null, 2));
  } finally {
    await browser.close();
  }
});

test("a plain static page on nginx runs the engine and the model with no helper at all", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await helper.stop(); // nothing of colibri's runs but the page, its worker and nginx
    const r = await generateInPage(page, `${nginx.url}/colibri`, { model: `/models/${MODEL}/`, prompt: PROMPT, n: NEW, pageUrl: `${nginx.url}/` });
    assert.deepEqual(r.ids, nativeIds, "greedy tokens differ from coli generate");
    assert.equal(r.isolated, false);
    assert.ok(r.stats.bytesFetched > 0, JSON.stringify(r.stats));
    // (The browser's own /favicon.ico aside.)
    const bad = nginx.requests().filter((x) => x.status >= 400 && x.uri !== "/favicon.ico");
    assert.deepEqual(bad, [], "every request to nginx succeeded (no usage report to a helper that is not there)");
    assert.ok(nginx.requests().some((x) => x.uri === "/colibri/pkg/colibri_wasm_bg.wasm" && x.status === 200), "the engine came from nginx");
  } finally {
    helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
    await browser.close();
  }
});

test("a host that answers several ranges with the whole file (S3, GCS) gets one range per request", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const seen = nginx.requests().length;
    const r = await generateInPage(page, helper.url, { model: `${nginx.url}/one-range/${MODEL}/`, prompt: PROMPT, n: NEW });
    assert.deepEqual(r.ids, nativeIds);
    assert.equal(r.stats.multiRange, false, JSON.stringify(r.stats));
    const weights = nginx.requests().slice(seen).filter((x) => x.uri === `/one-range/${MODEL}/weights.bin`);
    assert.ok(weights.length > 0);
    for (const w of weights) {
      assert.equal(w.status, 206, `never the whole data file: ${JSON.stringify(w)}`);
      assert.ok(!w.range.includes(","), `one range per request: ${JSON.stringify(w)}`);
    }
  } finally {
    await browser.close();
  }
});

test("a host without CORS headers: load fails with one error that says so", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const err = await generateInPage(page, helper.url, { model: `${nginx.url}/private/${MODEL}/`, prompt: PROMPT, n: 1 }).then(
      () => null,
      (e) => String(e.message || e),
    );
    assert.ok(err, "loading a model the page may not read must fail");
    assert.match(err, /CORS/);
    assert.match(err, /private\/qwen3_moe\/colibri\.json/);
  } finally {
    await browser.close();
  }
});
