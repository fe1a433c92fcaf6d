// Chunked prefill in the browser engine (issue 29): a long prompt is read PREFILL_CHUNK
// (256) positions per engine step, so a cancel (an AbortSignal) stops it at the next
// chunk instead of after the whole prompt, as natively (the helper and coli chat). The
// tokens are those of `coli generate` (chunking never changes a bit). Times are relative
// to the whole prefill measured in the same page, so they hold on a slow machine too.
import { test } from "node:test";
import assert from "node:assert/strict";
import { coli, convertedFixture, freePort, startHelper, launchBrowser } from "./harness.mjs";

const N = 4000;
// Distinct per salt from the first id on: no prompt reuses another's cache.
const prompt = (salt) => Array.from({ length: N }, (_, i) => (i * 7919 + salt * 31 + 1) % 400);

test("a long prompt is read in chunks in the browser: coli's tokens, and a cancel stops it at the next chunk", async () => {
  const fx = convertedFixture("olmoe");
  const helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
  const browser = await launchBrowser();
  try {
    const args = ["generate", "--model", fx.path, "--ids", prompt(0).join(","), "--max-new-tokens", "4", "--temperature", "0", "--ignore-eos", "--json"];
    const native = JSON.parse(coli(args));
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(async ({ a, b, c }) => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "olmoe", backend: "cpu", threads: 1 });
      // The first run also brings every expert into the RAM tier.
      const first = await engine.generate({ ids: a, maxNewTokens: 4, ignoreEos: true });
      let t = performance.now();
      await engine.generate({ ids: b, maxNewTokens: 1, ignoreEos: true });
      const whole = performance.now() - t;
      const ctrl = new AbortController();
      setTimeout(() => ctrl.abort(), whole / 10);
      t = performance.now();
      const stopped = await engine.generate({ ids: c, maxNewTokens: 4, ignoreEos: true, signal: ctrl.signal });
      const took = performance.now() - t;
      // The engine goes on: the next prompt generates.
      const after = await engine.generate({ ids: a.slice(0, 16), maxNewTokens: 2, ignoreEos: true });
      return { first, whole, stopped, took, after: after.ids.length };
    }, { a: prompt(0), b: prompt(1), c: prompt(2) });
    console.log(`whole prefill ${web.whole.toFixed(0)} ms; cancelled a tenth in, it ended after ${web.took.toFixed(0)} ms`);
    assert.deepEqual(web.first.ids, native.ids, "the browser's tokens differ from coli generate's");
    assert.ok(web.whole > 400, `the prefill takes only ${web.whole} ms: too short to tell`);
    assert.equal(web.stopped.finishReason, "cancelled", JSON.stringify(web.stopped));
    assert.equal(web.stopped.ids.length, 0, JSON.stringify(web.stopped));
    // A tenth of the prefill, then at most one more chunk (a sixteenth), with room for a
    // loaded machine; one pass over the whole prompt took all of it.
    assert.ok(web.took < web.whole * 0.6, `the stopped prefill took ${web.took} ms; the whole one takes ${web.whole} ms`);
    assert.equal(web.after, 2);
  } finally {
    await browser.close();
    await helper.stop();
    fx.cleanup();
  }
});
