// The browser engine keeps the conversation's cache between calls in one tab: a second
// turn whose ids extend the first feeds only its new tokens (stats().cachedTokens) and
// still gives the native CPU path's tokens, as a fresh `coli generate` of the whole turn;
// after a reload the cache comes back from OPFS, and a corrupt stored cache is refused. On
// the wasm CPU backend and on WebGPU (whose cache is read back from the GPU into a file of
// its own, named for the adapter, and uploaded again after the reload).
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

async function reuseAcrossReload(backend) {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const r = await page.evaluate(
      async ({ model, prompt, secondIds, n, backend }) => {
        const { load } = await import("/colibri.js");
        const engine = await load({ model, backend });
        const opts = { maxNewTokens: n, temperature: 0, ignoreEos: true };
        const a = await engine.generate({ ids: prompt, ...opts });
        const b = await engine.generate({ ids: secondIds, ...opts });
        const afterSecond = engine.stats();
        // A prompt that diverges mid-way: the cache is cut back to the shared prefix.
        const c = await engine.generate({ ids: [...prompt.slice(0, 3), 1, 2], ...opts });
        return { a, b, c, afterSecond, afterThird: engine.stats() };
      },
      { model: MODEL, prompt: PROMPT, secondIds, n: NEW, backend },
    );
    assert.equal(r.afterSecond.backend, backend);
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

    // A reload (a restart of the tab): the cache comes back from OPFS, so the next turn of
    // the last conversation feeds only its new tokens, with the native tokens.
    const third = [...PROMPT.slice(0, 3), 1, 2, ...r.c.ids, 30, 31];
    const want = native(third);
    const turnAfterLoad = async () => {
      await page.goto(`${helper.url}/health`);
      return page.evaluate(
        async ({ model, ids, n, backend }) => {
          const { load } = await import("/colibri.js");
          const engine = await load({ model, backend });
          return engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
        },
        { model: MODEL, ids: third, n: NEW, backend },
      );
    };
    const restored = await turnAfterLoad();
    assert.equal(restored.cachedTokens, 5 + NEW - 1, "the whole stored conversation is reused after a reload");
    assert.deepEqual(restored.ids, want, "after a reload: tokens differ from a fresh coli generate");
    // WebGPU's file is its own (the adapter's floats may differ from the CPU's).
    const stored = await page.evaluate(async () => {
      const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-kv");
      const names = [];
      for await (const [name] of dir.entries()) names.push(name);
      return names;
    });
    assert.equal(stored.length, 1, JSON.stringify(stored));
    assert.equal(stored[0].includes(".webgpu-"), backend === "webgpu", JSON.stringify(stored));

    // A corrupt stored cache is refused (never used): nothing cached, the same tokens.
    await page.evaluate(async () => {
      const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-kv");
      for await (const [name, handle] of dir.entries()) {
        const bytes = new Uint8Array(await (await handle.getFile()).arrayBuffer());
        bytes[bytes.length >> 1] ^= 0x20;
        const w = await (await dir.getFileHandle(name)).createWritable();
        await w.write(bytes);
        await w.close();
      }
    });
    const refused = await turnAfterLoad();
    assert.equal(refused.cachedTokens, 0, "a corrupt stored cache must not be used");
    assert.deepEqual(refused.ids, want);
  } finally {
    await browser.close();
  }
}

test("a second turn reuses the cache (in the tab, and from OPFS after a reload) and gives the native tokens", () => reuseAcrossReload("cpu"));

test("on WebGPU too: the cache read back from the GPU, stored, uploaded after a reload, the native tokens", () => reuseAcrossReload("webgpu"));
