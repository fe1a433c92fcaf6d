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
      { messages: story, temperature: 0.9, seed: 7 },
      { messages: story, temperature: 0.9, seed: 8 },
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
    // A seed repeats its draw (the same text twice); another seed draws another.
    assert.equal(native[9].content, native[3].content, "the same seed twice gives the same text");
    assert.notEqual(native[10].content, native[3].content, "another seed gives another text");
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

// The browser passes chat.completions' request to the engine untouched, which checks it as
// the helper's API does (one engine function): every bad value is refused by both with the
// same `param` and `code`; and `stop` and `top_k` are honoured, not ignored.
test("bad parameters: the browser and the helper refuse them with the same param and code", async () => {
  const empty = mkdtempSync(join(tmpdir(), "colibri-e2e-models-"));
  const helper = await startHelper({ modelsDir: empty, port: await freePort(), extra: ["--model", DEMO] });
  const browser = await launchBrowser();
  try {
    const base = { model: "demo", messages: [{ role: "user", content: "What is 23 + 45?" }], max_tokens: 8 };
    const bad = [
      { top_k: -1 }, { top_k: 2.5 }, { temperature: "hot" }, { top_p: 2 }, { seed: "x" }, { stop: 7 },
      { stop: ["a", 1] }, { max_tokens: -3 }, { max_tokens: 0 }, { presence_penalty: 3 }, { frequency_penalty: -9 },
      { logit_bias: { 999999: 5 } }, { logit_bias: { 5: 101 } }, { ignore_eos: "yes" }, { suffix: "x" }, { n: 3 },
      { logprobs: 2 }, { logprobs: false, top_logprobs: 2 }, { truncation: "off" }, { best_of: 2 },
      { response_format: { type: "xml" } }, { verbosity: "low" },
    ];
    const native = [];
    for (const c of bad) {
      const r = await post(`${helper.url}/v1/chat/completions`, { ...base, ...c });
      assert.equal(r.status, 400, `${JSON.stringify(c)}: ${JSON.stringify(r.body)}`);
      native.push({ param: r.body.error.param, code: r.body.error.code, type: r.body.error.type });
    }
    const story = [{ role: "user", content: "Tell me a story." }];
    const long = "one two three four ".repeat(4000);
    const r = await post(`${helper.url}/v1/chat/completions`, { ...base, truncation: "disabled", messages: [{ role: "user", content: long }] });
    assert.equal(r.status, 400, JSON.stringify(r.body));
    const nativeTooLong = { param: r.body.error.param, code: r.body.error.code };
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(async ({ base, bad, story, long }) => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "demo", backend: "cpu" });
      const refused = [];
      for (const c of bad) {
        try {
          await engine.chat.completions.create({ ...base, ...c });
          refused.push(null);
        } catch (e) {
          refused.push({ param: e.param ?? null, code: e.code ?? null, type: e.type ?? null });
        }
      }
      const content = async (c) => (await engine.chat.completions.create({ ...base, max_tokens: 24, ...c })).choices[0];
      // top_k 1 is greedy at any temperature; without it a hot sample leaves the greedy path.
      const greedy = await content({ messages: story, temperature: 0 });
      const topK1 = await content({ messages: story, temperature: 2, seed: 5, top_k: 1 });
      const hot = await content({ messages: story, temperature: 2, seed: 5 });
      const plain = await content({ temperature: 0, max_tokens: 40 });
      const stopped = await content({ temperature: 0, max_tokens: 40, stop: " =" });
      const codeOf = async (f) => {
        try {
          await f();
          return null;
        } catch (e) {
          return { param: e.param ?? null, code: e.code ?? null };
        }
      };
      // generate()'s options go to the same check; a prompt past the context has its code.
      const generateBad = await codeOf(() => engine.generate({ ids: [5, 17, 3], topP: 2 }));
      const tooLong = await codeOf(() => engine.chat.completions.create({ ...base, truncation: "disabled", messages: [{ role: "user", content: long }] }));
      return { refused, greedy, topK1, hot, plain, stopped, generateBad, tooLong };
    }, { base, bad, story, long });

    assert.deepEqual(web.refused, native, "the browser refuses what the helper refuses, with the same param and code");
    assert.ok(native.every((n) => n.code === "invalid_parameter" && n.type === "invalid_request_error"), JSON.stringify(native));
    assert.deepEqual(native.map((n) => n.param), [
      "top_k", "top_k", "temperature", "top_p", "seed", "stop", "stop", "max_tokens", "max_tokens", "presence_penalty",
      "frequency_penalty", "logit_bias", "logit_bias", "ignore_eos", "suffix", "n", "logprobs", "top_logprobs", "truncation",
      "best_of", "response_format", "verbosity",
    ]);
    // top_k is honoured: top_k 1 at temperature 2 is the greedy answer, the same sample without it is not.
    assert.equal(web.topK1.message.content, web.greedy.message.content);
    assert.notEqual(web.hot.message.content, web.greedy.message.content);
    // stop is honoured: the answer ends before " =" (the plain answer has it), finish_reason "stop".
    assert.ok(web.plain.message.content.includes(" ="), web.plain.message.content);
    assert.ok(!web.stopped.message.content.includes(" ="), web.stopped.message.content);
    assert.ok(web.plain.message.content.startsWith(web.stopped.message.content), `${web.stopped.message.content} | ${web.plain.message.content}`);
    assert.equal(web.stopped.finish_reason, "stop");
    assert.deepEqual(web.generateBad, { param: "top_p", code: "invalid_parameter" });
    assert.deepEqual(nativeTooLong, { param: "messages", code: "context_length_exceeded" });
    assert.deepEqual(web.tooLong, nativeTooLong);
  } finally {
    await browser.close();
    await helper.stop();
    rmSync(empty, { recursive: true, force: true });
  }
});
