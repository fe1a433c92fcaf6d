// The browser engine keeps the conversation's cache between calls in one tab: a second
// turn whose ids extend the first feeds only its new tokens (stats().cachedTokens) and
// still gives the native CPU path's tokens, as a fresh `coli generate` of the whole turn.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { coli, convertedFixture, freePort, startHelper, launchBrowser } from "./harness.mjs";

const MODEL = "qwen3_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 8;
let fx, helper, first, second, secondIds;

const native = (ids) =>
  JSON.parse(coli(["generate", "--model", fx.path, "--ids", ids.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"])).ids;

before(async () => {
  fx = convertedFixture(MODEL, "int4");
  first = native(PROMPT);
  secondIds = [...PROMPT, ...first, 11, 12, 13];
  second = native(secondIds);
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

test("a second turn in the tab reuses the cache and gives the native tokens", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const r = await page.evaluate(
      async ({ model, prompt, secondIds, n }) => {
        const { load } = await import("/colibri.js");
        const engine = await load({ model, backend: "cpu" });
        const opts = { maxNewTokens: n, temperature: 0, ignoreEos: true };
        const a = await engine.generate({ ids: prompt, ...opts });
        const b = await engine.generate({ ids: secondIds, ...opts });
        const afterSecond = engine.stats();
        // A prompt that diverges mid-way: the cache is cut back to the shared prefix.
        const c = await engine.generate({ ids: [...prompt.slice(0, 3), 1, 2], ...opts });
        return { a, b, c, afterSecond, afterThird: engine.stats() };
      },
      { model: MODEL, prompt: PROMPT, secondIds, n: NEW },
    );
    assert.deepEqual(r.a.ids, first, "first turn: tokens differ from coli generate");
    assert.equal(r.a.cachedTokens, 0);
    assert.deepEqual(r.b.ids, second, "second turn: tokens differ from a fresh coli generate");
    // The first turn's prompt and answer, but its last token (never fed).
    const reused = PROMPT.length + NEW - 1;
    assert.equal(r.b.cachedTokens, reused);
    assert.equal(r.afterSecond.cachedTokens, reused);
    assert.equal(r.afterSecond.promptTokens, secondIds.length);
    assert.equal(r.afterSecond.kvCacheTokens, secondIds.length + NEW - 1);
    assert.ok(r.afterSecond.kvCacheBytes >= r.afterSecond.kvCacheTokens * r.afterSecond.kvCacheBytesPerToken);
    assert.deepEqual(r.c.ids, native([...PROMPT.slice(0, 3), 1, 2]), "diverging turn: tokens differ");
    assert.equal(r.afterThird.cachedTokens, 3);
  } finally {
    await browser.close();
  }
});
