// OpenAI's sampling parameters through the browser engine's chat.completions, against the
// helper's /v1/chat/completions on the built-in demo model: the same answer for each
// (the one sampler of the engine, native and wasm), none of them ignored (each answer
// differs from the plain one), and what cannot be honoured refused by name on both.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ROOT, freePort, startHelper, launchBrowser } from "./harness.mjs";

const DEMO = join(ROOT, "models/demo");

async function post(url, body) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

test("sampling parameters: the browser answers as the helper's API does", async () => {
  const empty = mkdtempSync(join(tmpdir(), "colibri-e2e-models-"));
  const helper = await startHelper({ modelsDir: empty, port: await freePort(), extra: ["--model", DEMO] });
  const browser = await launchBrowser();
  try {
    const base = { model: "demo", messages: [{ role: "user", content: "What is 23 + 45?" }], max_tokens: 40 };
    const story = [{ role: "user", content: "Tell me a story." }];
    const cases = [
      { temperature: 0 },
      { temperature: 0, logit_bias: { 100: 100 } },
      // Ids 15-24 are the digits "0"-"9" in the demo's tokenizer: banned, the sum cannot be written.
      { temperature: 0, logit_bias: Object.fromEntries([...Array(10).keys()].map((d) => [15 + d, -100])) },
      // The demo is near-certain of its arithmetic: the seeded cases ask for a story, where
      // it is not, so that a penalty or top_k has draws to change.
      { messages: story, temperature: 0.9, seed: 7 },
      { messages: story, temperature: 0.9, seed: 7, presence_penalty: 2 },
      { messages: story, temperature: 0.9, seed: 7, frequency_penalty: 2 },
      { messages: story, temperature: 0.9, seed: 7, top_k: 2 },
      { temperature: 0, stop: [" ="] },
      { temperature: 0, max_completion_tokens: 5 },
    ];
    const native = [];
    for (const c of cases) {
      const r = await post(`${helper.url}/v1/chat/completions`, { ...base, ...c });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      native.push({ content: r.body.choices[0].message.content, finish: r.body.choices[0].finish_reason });
    }
    const refusals = [{ n: 2 }, { functions: [{ name: "f", parameters: {} }] }, { reasoning_effort: "low" }, { modalities: ["audio"] }, { stop: "x", response_format: { type: "json_object" } }];
    const nativeRefusals = [];
    for (const c of refusals) {
      const r = await post(`${helper.url}/v1/chat/completions`, { ...base, ...c });
      assert.equal(r.status, 400, JSON.stringify(c));
      nativeRefusals.push(r.body.error.param);
    }

    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(async ({ base, cases, refusals }) => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "demo", backend: "cpu" });
      const out = [];
      for (const c of cases) {
        const r = await engine.chat.completions.create({ ...base, ...c });
        out.push({ content: r.choices[0].message.content, finish: r.choices[0].finish_reason });
      }
      const refused = [];
      for (const c of refusals) {
        try {
          await engine.chat.completions.create({ ...base, ...c });
          refused.push(null);
        } catch (e) {
          refused.push(e.param ?? e.message);
        }
      }
      let range = null;
      try {
        await engine.chat.completions.create({ ...base, presence_penalty: 3 });
      } catch (e) {
        range = e.message;
      }
      return { out, refused, range };
    }, { base, cases, refusals });

    for (let i = 0; i < cases.length; i++) {
      assert.deepEqual(web.out[i], native[i], `browser and helper differ for ${JSON.stringify(cases[i])}`);
    }
    const plain = native[0].content;
    for (const i of [1, 2, 7, 8]) assert.notEqual(native[i].content, plain, `${JSON.stringify(cases[i])} changed nothing`);
    for (const i of [4, 5, 6]) assert.notEqual(native[i].content, native[3].content, `${JSON.stringify(cases[i])} changed nothing`);
    assert.ok(!native[7].content.includes(" ="), native[7].content);
    assert.equal(native[8].finish, "length");
    assert.deepEqual(web.refused, nativeRefusals, "the browser refuses what the helper refuses, by the same name");
    assert.deepEqual(nativeRefusals, ["n", "functions", "reasoning_effort", "modalities", "response_format"]);
    assert.match(web.range || "", /presence_penalty must be between -2 and 2/);
  } finally {
    await browser.close();
    await helper.stop();
    rmSync(empty, { recursive: true, force: true });
  }
});
