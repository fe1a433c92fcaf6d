// MTP drafts in the browser (generate({draft: "mtp"})): a converted deepseek_v3_mtp
// (its MTP layer kept, the layer's experts streamed from the helper like the others)
// gives the tokens of a run without drafts and of `coli generate --draft mtp`, greedy and
// sampled, on the cpu backend, also in a second turn that reuses the cache of an MTP
// generation; stats().speculation counts the drafts. WebGPU refuses it.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, ARTIFACTS } from "./harness.mjs";

const MODEL = "deepseek_v3_mtp";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 16;
const TURN = [11, 300, 12];
let fx, helper;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int8");
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

test("MTP drafts in the browser: the tokens without them and of coli generate --draft mtp", async (t) => {
  const native = (extra) =>
    JSON.parse(coli(["generate", "--model", fx.path, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--ignore-eos", "--seed", "5", "--json", ...extra]));
  const greedy = native(["--temperature", "0"]);
  const sampled = native(["--temperature", "0.9"]);
  assert.deepEqual(native(["--temperature", "0", "--draft", "mtp", "--speculate", "2"]).ids, greedy.ids);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const r = await page.evaluate(
      async ({ model, prompt, n, turn }) => {
        const { load } = await import("/colibri.js");
        const engine = await load({ model, backend: "cpu" });
        const gen = (o) => engine.generate({ ids: prompt, maxNewTokens: n, ignoreEos: true, seed: 5, ...o });
        const out = {};
        out.plain = (await gen({ temperature: 0 })).ids;
        const m = await gen({ temperature: 0, draft: "mtp", speculate: 2 });
        out.mtp = m.ids;
        out.mtpCached = m.cachedTokens;
        out.spec = engine.stats().speculation;
        const s = await gen({ temperature: 0.9, draft: "mtp" });
        out.sampled = s.ids;
        out.sampledCached = s.cachedTokens;
        // A second turn after the first answer: the cache of the MTP generation before it.
        const next = await engine.generate({ ids: [...prompt, ...out.mtp, ...turn], maxNewTokens: n, ignoreEos: true, temperature: 0, draft: "mtp", speculate: 2 });
        out.next = next.ids;
        out.nextCached = next.cachedTokens;
        return out;
      },
      { model: MODEL, prompt: PROMPT, n: NEW, turn: TURN },
    );
    // WebGPU: refused with the reason (in a page of its own: one engine per model and tab).
    await page.close();
    const page2 = await browser.context.newPage();
    await page2.goto(`${helper.url}/health`);
    const gpuError = await page2.evaluate(async ({ model, prompt }) => {
      const { load } = await import("/colibri.js");
      const gpu = await load({ model, backend: "webgpu" }).catch(() => null);
      if (!gpu) return "no webgpu";
      return gpu.generate({ ids: prompt, maxNewTokens: 2, draft: "mtp" }).then(() => "accepted", (e) => String(e.message || e));
    }, { model: MODEL, prompt: PROMPT });
    t.diagnostic(`speculation ${JSON.stringify(r.spec)}; webgpu: ${gpuError}`);
    if (gpuError !== "no webgpu") assert.match(gpuError, /cpu backend/);
    assert.deepEqual(r.plain, greedy.ids, "the browser without drafts = coli generate");
    assert.deepEqual(r.mtp, greedy.ids, "MTP drafts change no token (greedy)");
    assert.deepEqual(r.sampled, sampled.ids, "MTP drafts change no token (sampled)");
    // The cache is reused between MTP generations, never after one without (no hidden states).
    assert.equal(r.mtpCached, 0, "after a generation without MTP the prompt is fed again");
    assert.ok(r.sampledCached > 0, `an MTP generation after an MTP one reuses the cache (${r.sampledCached})`);
    const nextIds = [...PROMPT, ...greedy.ids, ...TURN];
    const nextNative = JSON.parse(coli(["generate", "--model", fx.path, "--ids", nextIds.join(","), "--max-new-tokens", String(NEW), "--ignore-eos", "--temperature", "0", "--json"]));
    assert.ok(r.nextCached >= PROMPT.length, `the second turn reuses the first's cache (${r.nextCached})`);
    assert.deepEqual(r.next, nextNative.ids, "a second turn with MTP drafts and a reused cache = coli generate");
    assert.ok(r.spec && r.spec.drafted > 0 && r.spec.produced === NEW, JSON.stringify(r.spec));
    assert.ok(r.spec.forwards <= NEW, JSON.stringify(r.spec));
  } finally {
    await browser.close();
  }
});
