// MTP drafts in the browser (generate({draft: "mtp"})): a converted deepseek_v3_mtp
// (its MTP layer kept, the layer's experts streamed from the helper like the others)
// gives the tokens of a run without drafts and of `coli generate --draft mtp`, greedy and
// sampled, on the cpu backend; stats().speculation counts the drafts. WebGPU refuses it.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { coli, convertedFixture, freePort, startHelper, launchBrowser, ARTIFACTS } from "./harness.mjs";

const MODEL = "deepseek_v3_mtp";
const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 16;
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
      async ({ model, prompt, n }) => {
        const { load } = await import("/colibri.js");
        const engine = await load({ model, backend: "cpu" });
        const gen = (o) => engine.generate({ ids: prompt, maxNewTokens: n, ignoreEos: true, seed: 5, ...o });
        const out = {};
        out.plain = (await gen({ temperature: 0 })).ids;
        out.mtp = (await gen({ temperature: 0, draft: "mtp", speculate: 2 })).ids;
        out.spec = engine.stats().speculation;
        out.sampled = (await gen({ temperature: 0.9, draft: "mtp" })).ids;
        return out;
      },
      { model: MODEL, prompt: PROMPT, n: NEW },
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
    assert.ok(r.spec && r.spec.drafted > 0 && r.spec.produced === NEW, JSON.stringify(r.spec));
    assert.ok(r.spec.forwards <= NEW, JSON.stringify(r.spec));
  } finally {
    await browser.close();
  }
});
