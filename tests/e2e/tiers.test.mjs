// The browser's managed tiers end to end (real helper, real Chromium, the real wasm
// engine): the disk tier evicts under a small budget and fetches evicted experts again,
// learned usage read back from the helper pins experts at load, and a second tab on the
// same model waits for (or takes over) the model's browser storage through Web Locks.
// Every run's tokens are `coli generate`'s.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, ARTIFACTS } from "./harness.mjs";

const MODEL = "qwen3_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 12;
let fx, helper, nativeIds, expertLen, nExperts;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int4");
  const g = JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"]));
  nativeIds = g.ids;
  const m = JSON.parse(readFileSync(join(fx.path, "colibri.json"), "utf8"));
  const lens = m.experts.layers.flatMap((l) => l.experts.map((e) => e.length));
  expertLen = lens[0];
  nExperts = m.experts.layers[0].experts.length;
  assert.ok(lens.every((l) => l === expertLen), "the fixture's experts all have one size");
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

/** In `page` (a document of the helper): loads the model with `options` as
 * `window.engine`; returns the stats and the expert tiers right after the load. */
async function loadIn(page, options = {}) {
  if (!page.url().startsWith(helper.url)) await page.goto(`${helper.url}/health`);
  return page.evaluate(async ({ model, options }) => {
    const { load } = await import("/colibri.js");
    window.engine = await load({ model, backend: "cpu", ...options });
    return { stats: window.engine.stats(), tiers: Array.from(await window.engine.expertTiers()) };
  }, { model: MODEL, options });
}

/** Greedy tokens after PROMPT in the page's engine, with the stats after them. */
function generate(page) {
  return page.evaluate(async ({ prompt, n }) => {
    const g = await window.engine.generate({ ids: prompt, maxNewTokens: n, temperature: 0, ignoreEos: true });
    return { ids: g.ids, stats: window.engine.stats(), tiers: Array.from(await window.engine.expertTiers()) };
  }, { prompt: PROMPT, n: NEW });
}

const statsOf = (page) => page.evaluate(() => window.engine.stats());

async function until(page, check, what, ms = 30_000) {
  const t0 = Date.now();
  for (;;) {
    const s = await statsOf(page);
    if (check(s)) return s;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test("under a disk budget of a few experts the tier evicts, evicted experts are fetched again, and the tokens do not change", async () => {
  const browser = await launchBrowser();
  const budget = 6 * expertLen;
  try {
    const page = await browser.context.newPage();
    // No RAM tier: every use is served by the disk tier or the helper.
    const loaded = await loadIn(page, { ramBytes: 0, diskBytes: budget });
    assert.equal(loaded.stats.diskKind, "opfs", JSON.stringify(loaded.stats));
    assert.equal(loaded.stats.diskBudget, budget);
    // The helper learned the native run's use (coli generate counts into the usage file);
    // without a RAM tier nothing is pinned in RAM, and half the disk budget is pinned.
    assert.ok(loaded.stats.learnedUses > 0);
    assert.equal(loaded.stats.pins.ramExperts, 0);
    const r = await generate(page);
    assert.deepEqual(r.ids, nativeIds, "greedy tokens differ from coli generate");
    const s = r.stats;
    assert.ok(s.diskEvictions > 0, `nothing evicted: ${JSON.stringify(s)}`);
    assert.ok(s.diskRefetches > 0, `no evicted expert was fetched again: ${JSON.stringify(s)}`);
    assert.ok(s.diskStoredBytes <= budget && s.diskFileBytes <= budget, `over the budget: ${JSON.stringify(s)}`);
    assert.ok(s.diskExperts <= 6);
    assert.ok(s.pins.diskExperts > 0 && s.pins.diskExperts <= 3, JSON.stringify(s.pins));
    // Every fetch is counted, the refetches of evicted experts among them.
    assert.equal(s.tierEvents.helperFetches * expertLen, s.bytesFetched);
    assert.ok(s.tiers.helper + s.tiers.disk === s.expertLoads);
    const rates = s.hitRates;
    assert.ok(Math.abs(rates.helper + rates.disk + rates.ram + rates.gpu - 1) < 1e-9, JSON.stringify(rates));
    // The same profile with a budget too small for any expert: same tokens, nothing stored.
    await page.reload();
    const tiny = await loadIn(page, { ramBytes: 0, diskBytes: expertLen - 1 });
    assert.equal(tiny.stats.diskExperts, 0, "a lowered budget trims the stored experts at load");
    const again = await generate(page);
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.diskExperts, 0);
    assert.ok(again.stats.diskSkipped > 0);
    writeFileSync(join(ARTIFACTS, "tiers-eviction-stats.json"), JSON.stringify({ budget, first: s, tiny: again.stats }, null, 2));
  } finally {
    await browser.close();
  }
});

test("learned usage read back from the helper pins its experts at load: the same prompt then fetches nothing", async () => {
  // The helper has what the tabs of the test before reported (GET /api/usage/{id}).
  const learned = await (await fetch(`${helper.url}/api/usage/${MODEL}`)).json();
  assert.ok(learned.total > 0, `the helper learned nothing: ${JSON.stringify(learned)}`);
  const hot = learned.counts.map(([l, e]) => l * nExperts + e).sort((a, b) => a - b);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    // A fresh profile (empty OPFS) with a RAM tier: its pin budget (a quarter) holds them all.
    const loaded = await loadIn(page, {});
    const s0 = loaded.stats;
    assert.equal(s0.usageError, null);
    assert.equal(s0.learnedUses, learned.total);
    assert.equal(s0.pins.ramExperts, hot.length, JSON.stringify(s0.pins));
    const resident = loaded.tiers.flatMap((t, i) => (t === 2 ? [i] : []));
    assert.deepEqual(resident, hot, "the experts in RAM right after load are the learned ones");
    const r = await generate(page);
    assert.deepEqual(r.ids, nativeIds);
    // Every expert the prompt routes to was pinned: no fetch, all RAM hits, all of them pinned.
    assert.equal(r.stats.bytesFetched, s0.bytesFetched, `fetched during generation: ${JSON.stringify(r.stats)}`);
    assert.equal(r.stats.tiers.helper, 0);
    assert.equal(r.stats.hitRates.ram, 1);
    assert.equal(r.stats.pins.ramHits, r.stats.expertLoads);
    // Without the learned pins (pinBytes 0), the same load keeps nothing in RAM.
    await page.reload();
    const unpinned = await loadIn(page, { pinBytes: 0, disk: false });
    assert.equal(unpinned.stats.pins.ramExperts, 0);
    assert.ok(unpinned.tiers.every((t) => t !== 2), "nothing is resident without pins");
    writeFileSync(join(ARTIFACTS, "tiers-pins-stats.json"), JSON.stringify({ learned: learned.total, load: s0, generate: r.stats }, null, 2));
  } finally {
    await browser.close();
  }
});

test("a second tab waits for the model's browser storage and takes it when the first closes; a third takes it over", async () => {
  const browser = await launchBrowser();
  try {
    const a = await browser.context.newPage();
    await loadIn(a, {});
    const ra = await generate(a);
    assert.deepEqual(ra.ids, nativeIds);
    assert.equal(ra.stats.diskKind, "opfs");
    assert.ok(ra.stats.diskExperts > 0);

    // B (no RAM tier) finds the storage held: it runs on RAM (the helper) and waits.
    const b = await browser.context.newPage();
    const lb = await loadIn(b, { ramBytes: 0 });
    assert.equal(lb.stats.diskEnabled, false);
    assert.equal(lb.stats.diskKind, null, "it must not fall back to IndexedDB");
    assert.match(lb.stats.diskError, /another colibri tab or window is using/);
    const rb = await generate(b);
    assert.deepEqual(rb.ids, nativeIds);
    assert.ok(rb.stats.bytesFetched > 0);

    // A closes: B takes the storage and reads A's experts from it.
    await a.close();
    const sb = await until(b, (s) => s.diskEnabled, "tab B to take the storage");
    assert.equal(sb.diskKind, "opfs");
    const rb2 = await generate(b);
    assert.deepEqual(rb2.ids, nativeIds);
    assert.equal(rb2.stats.bytesFetched, rb.stats.bytesFetched, "after the hand-off the experts come from OPFS");
    assert.ok(rb2.stats.tiers.disk > rb.stats.tiers.disk);

    // C takes it over at once: B closes its files and waits again.
    const c = await browser.context.newPage();
    const lc = await loadIn(c, { ramBytes: 0, storageHandoff: "takeover" });
    assert.equal(lc.stats.diskKind, "opfs", JSON.stringify(lc.stats));
    const rc = await generate(c);
    assert.deepEqual(rc.ids, nativeIds);
    assert.equal(rc.stats.bytesFetched, 0, "the taken-over storage holds every expert");
    const sb2 = await until(b, (s) => !s.diskEnabled, "tab B to give the storage up");
    assert.match(sb2.diskError, /took this model's browser storage over/);
    const rb3 = await generate(b);
    assert.deepEqual(rb3.ids, nativeIds);
  } finally {
    await browser.close();
  }
});
