// The browser engine keeps the conversation's cache between calls in one tab: a second
// turn whose ids extend the first feeds only its new tokens (stats().cachedTokens) and
// still gives the native CPU path's tokens, as a fresh `coli generate` of the whole turn;
// after a reload the cache comes back from OPFS, and a corrupt stored cache is refused. On
// the wasm CPU backend and on WebGPU (whose cache is read back from the GPU into a file of
// its own, named for the adapter, and uploaded again after the reload). A turn that extends
// the stored conversation appends one record of its new positions to the file (the bytes
// already there stay as they were); a conversation that went another way rewrites it.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { coli, convertedFixture, freePort, startHelper, launchBrowser } from "./harness.mjs";

const MODEL = "qwen3_moe";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 8;
let fx, helper, first, second, secondIds, fxNext, helperNext;

const native = (ids) =>
  JSON.parse(coli(["generate", "--model", fx.path, "--ids", ids.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"])).ids;

before(async () => {
  fx = convertedFixture(MODEL, "int4");
  first = native(PROMPT);
  secondIds = [...PROMPT, ...first, 11, 12, 13];
  second = native(secondIds);
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
  fxNext = convertedFixture("qwen3_next", "int4");
  helperNext = await startHelper({ modelsDir: fxNext.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
  if (helperNext) await helperNext.stop();
  if (fxNext) fxNext.cleanup();
});

// The positions of each record of a version 2 KV cache file (docs/format.md "KV cache
// files"), every length checked against the file's.
function records(file) {
  assert.equal(file.subarray(0, 8).toString("latin1"), "COLIKV02");
  const headerLen = file.readUInt32LE(8);
  const header = JSON.parse(file.subarray(12, 12 + headerLen).toString("utf8"));
  const perPosition = header.widths.reduce((a, [k, v]) => a + k + v, 0);
  const state = (header.states || []).reduce((a, [c, s]) => a + c + s, 0);
  const counts = [];
  let at = 12 + headerLen + 8;
  while (at < file.length) {
    assert.equal(file.subarray(at, at + 4).toString("latin1"), "TURN", `a record at byte ${at}`);
    const n = file.readUInt32LE(at + 4);
    counts.push(n);
    at += 8 + 4 * (n + n * perPosition + state) + 8;
  }
  assert.equal(at, file.length, "the records end where the file does");
  return counts;
}

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
        // The stored file's bytes (base64: they come back through JSON).
        const stored = async () => {
          const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-kv");
          for await (const [, handle] of dir.entries()) {
            const bytes = new Uint8Array(await (await handle.getFile()).arrayBuffer());
            let bin = "";
            for (const x of bytes) bin += String.fromCharCode(x);
            return btoa(bin);
          }
          return "";
        };
        const a = await engine.generate({ ids: prompt, ...opts });
        const fileA = await stored();
        const b = await engine.generate({ ids: secondIds, ...opts });
        const fileB = await stored();
        const afterSecond = engine.stats();
        // A prompt that diverges mid-way: the cache is cut back to the shared prefix.
        const c = await engine.generate({ ids: [...prompt.slice(0, 3), 1, 2], ...opts });
        const fileC = await stored();
        return { a, b, c, afterSecond, afterThird: engine.stats(), fileA, fileB, fileC };
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
    // The file after each turn: the first turn's record; the second appended to it; the
    // diverging third rewrote it as one record of its own ids.
    const [fileA, fileB, fileC] = [r.fileA, r.fileB, r.fileC].map((f) => Buffer.from(f, "base64"));
    assert.deepEqual(records(fileA), [PROMPT.length + NEW - 1]);
    assert.deepEqual(records(fileB), [PROMPT.length + NEW - 1, secondIds.length - PROMPT.length]);
    assert.ok(fileB.subarray(0, fileA.length).equals(fileA), "the second turn appends: the first turn's bytes stay");
    assert.deepEqual(records(fileC), [5 + NEW - 1]);

    // A reload (a restart of the tab): the cache comes back from OPFS, so the next turn of
    // the last conversation feeds only its new tokens, with the native tokens.
    const third = [...PROMPT.slice(0, 3), 1, 2, ...r.c.ids, 30, 31];
    const want = native(third);
    const turnAfterLoad = async (ids = third) => {
      await page.goto(`${helper.url}/health`);
      return page.evaluate(
        async ({ model, ids, n, backend }) => {
          const { load } = await import("/colibri.js");
          const engine = await load({ model, backend });
          return engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
        },
        { model: MODEL, ids, n: NEW, backend },
      );
    };
    const restored = await turnAfterLoad();
    assert.equal(restored.cachedTokens, 5 + NEW - 1, "the whole stored conversation is reused after a reload");
    const fileD = await page.evaluate(async () => {
      const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-kv");
      for await (const [, handle] of dir.entries()) return Array.from(new Uint8Array(await (await handle.getFile()).arrayBuffer()));
    });
    assert.deepEqual(records(Buffer.from(fileD)), [5 + NEW - 1, third.length - 5], "after a reload the turn appends to the file read back");
    // The appended record reads back (on WebGPU its rows were read back from the GPU from
    // the file's end on): another reload continues the whole conversation from the file.
    const fourth = [...third, ...restored.ids, 40, 41];
    const again = await turnAfterLoad(fourth);
    assert.equal(again.cachedTokens, third.length + NEW - 1, "the appended conversation is reused whole");
    assert.deepEqual(again.ids, native(fourth), "from an appended file: tokens differ from a fresh coli generate");
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

// A Gated DeltaNet model's stored cache keeps the state where the turn's prompt ended (its
// record split there): after a reload, a next prompt that cuts the answer right there (as a
// chat template that drops a thinking block does) reuses the whole first prompt, not
// nothing, and gives the native tokens.
test("qwen3_next after a reload: a prompt that cuts the answer reuses the first prompt from the stored cache", async () => {
  const prompt = [5, 17, 3, 42, 7, 99, 120, 250, 31, 64, 9, 77];
  const next = [...prompt, 201, 202, 203];
  const generate = (ids) =>
    JSON.parse(coli(["generate", "--model", fxNext.path, "--ids", ids.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"])).ids;
  const want = generate(next);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const turn = async (ids) => {
      await page.goto(`${helperNext.url}/health`);
      return page.evaluate(
        async ({ ids, n }) => {
          const { load } = await import("/colibri.js");
          const engine = await load({ model: "qwen3_next", backend: "cpu" });
          return engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
        },
        { ids, n: NEW },
      );
    };
    const a = await turn(prompt);
    assert.deepEqual(a.ids, generate(prompt));
    const b = await turn(next);
    assert.equal(b.cachedTokens, prompt.length, "the state where the first prompt ended came back from the file");
    assert.deepEqual(b.ids, want, "tokens differ from a fresh coli generate");
  } finally {
    await browser.close();
  }
});

// A Gated DeltaNet state goes back only to where a pass ended: a prompt that leaves the
// last conversation mid-way ends a pass there, so that the next prompt leaving it at the
// same place (a message edited again) keeps that prefix instead of feeding it all again;
// the native tokens each time.
for (const backend of ["cpu", "webgpu"]) test(`qwen3_next in one tab (${backend}): a prompt edited twice keeps the prefix before the edit the second time`, async () => {
  const prompt = [5, 17, 3, 42, 7, 99, 120, 250, 31, 64, 9, 77];
  const edits = [[...prompt.slice(0, 8), 1, 2, 3], [...prompt.slice(0, 8), 4, 5, 6]];
  const generate = (ids) =>
    JSON.parse(coli(["generate", "--model", fxNext.path, "--ids", ids.join(","), "--max-new-tokens", String(NEW), "--temperature", "0", "--ignore-eos", "--json"])).ids;
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helperNext.url}/health`);
    const r = await page.evaluate(
      async ({ turns, n, backend }) => {
        const { load } = await import("/colibri.js");
        const engine = await load({ model: "qwen3_next", backend });
        const out = [];
        for (const ids of turns) out.push(await engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true }));
        return out;
      },
      { turns: [prompt, ...edits], n: NEW, backend },
    );
    assert.equal(r[1].cachedTokens, 0, "the first edit: no state where it leaves the first prompt");
    assert.equal(r[2].cachedTokens, 8, "the second edit keeps the state where the first edit's pass ended");
    for (const [i, ids] of [prompt, ...edits].entries()) assert.deepEqual(r[i].ids, generate(ids), `turn ${i + 1}: tokens differ from coli generate`);
  } finally {
    await browser.close();
  }
});

// chat.completions.create passes where the system messages end (sharedPrefix): a Gated
// DeltaNet model's prompt pass ends there, so the next conversation with the same system
// prompt keeps it (the first one that follows, not only the one after), with the answer a
// fresh tab gives.
test("qwen3_next in one tab: a new conversation with the same system prompt keeps it", async () => {
  const system = "You answer questions about animals, briefly and politely, in plain words.";
  const req = (q) => ({ model: "qwen3_next", messages: [{ role: "system", content: system }, { role: "user", content: q }], max_tokens: 6, temperature: 0 });
  const browser = await launchBrowser();
  try {
    const run = async (qs) => {
      const page = await browser.context.newPage();
      await page.goto(`${helperNext.url}/health`);
      const out = await page.evaluate(
        async ({ reqs }) => {
          const { load } = await import("/colibri.js");
          const engine = await load({ model: "qwen3_next", backend: "cpu" });
          const r = [];
          for (const q of reqs) {
            const c = await engine.chat.completions.create(q);
            r.push({ text: c.choices[0].message.content, cached: c.usage.prompt_tokens_details.cached_tokens });
          }
          return r;
        },
        { reqs: qs.map(req) },
      );
      await page.close();
      return out;
    };
    const [a, b] = await run(["What do owls eat?", "Do fish sleep?"]);
    assert.equal(a.cached, 0);
    assert.ok(b.cached > 10, `the second conversation keeps the system prompt: ${JSON.stringify(b)}`);
    const [alone] = await run(["Do fish sleep?"]);
    assert.equal(b.text, alone.text, "the same answer as a fresh tab");
  } finally {
    await browser.close();
  }
});
