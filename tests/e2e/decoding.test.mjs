// Logprobs and option scoring through the browser engine, checked against the helper's
// native API and `coli choose` on the built-in demo model: the same numbers, to the bit
// (structured output: structured.test.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ROOT, coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

const DEMO = join(ROOT, "models/demo");
const Q = "What is the capital of Japan?";
const OPTIONS = ["The capital of Japan is Kyoto.", "The capital of Japan is Tokyo.", "The capital of Japan is Paris."];

async function post(url, body) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const v = await r.json();
  assert.equal(r.status, 200, JSON.stringify(v));
  return v;
}

test("logprobs and choose in the browser equal the helper's API and coli choose", async () => {
  const empty = mkdtempSync(join(tmpdir(), "colibri-e2e-models-"));
  const helper = await startHelper({ modelsDir: empty, port: await freePort(), extra: ["--model", DEMO] });
  const browser = await launchBrowser();
  try {
    const req = { model: "demo", messages: [{ role: "user", content: Q }], max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3 };
    const native = await post(`${helper.url}/v1/chat/completions`, req);
    const content = native.choices[0].logprobs.content;
    assert.ok(content.length > 0);
    for (const e of content) {
      assert.equal(e.top_logprobs.length, 3);
      assert.equal(e.top_logprobs[0].token, e.token, "greedy picks the most likely token");
    }
    const nativeChoice = await post(`${helper.url}/v1/choose`, { model: "demo", prompt: Q, options: OPTIONS });
    const cli = JSON.parse(coli(["choose", "--model", DEMO, "--prompt", Q, "--options", OPTIONS.join("|"), "--json"]));
    assert.deepEqual(cli.probabilities, nativeChoice.probabilities, "coli choose and POST /v1/choose");
    assert.equal(nativeChoice.choice, OPTIONS[1], JSON.stringify(nativeChoice));

    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(async ({ req, options, q }) => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "demo", backend: "cpu" });
      const plain = await engine.chat.completions.create(req);
      const chunks = [];
      for await (const c of engine.chat.completions.create({ ...req, stream: true })) chunks.push(c);
      const ids = await engine.encode(`<|im_start|>user\n${q}<|im_end|>\n<|im_start|>assistant\n`, { addSpecialTokens: true });
      const gen = await engine.generate({ ids, maxNewTokens: 24, temperature: 0, logprobs: true, topLogprobs: 3 });
      const choice = await engine.choose({ prompt: q, options });
      return { plain, chunks, choice, gen };
    }, { req, options: OPTIONS, q: Q });
    assert.equal(web.plain.choices[0].message.content, native.choices[0].message.content);
    assert.deepEqual(web.plain.choices[0].logprobs, native.choices[0].logprobs, "browser and helper logprobs differ");
    const streamed = web.chunks.flatMap((c) => c.choices[0].logprobs?.content || []);
    assert.deepEqual(streamed, content, "streamed logprobs");
    for (const k of ["probabilities", "logprobs", "entropy", "choice", "index"]) {
      assert.deepEqual(web.choice[k], nativeChoice[k], `choose: ${k} differs between the browser and the helper`);
    }
    assert.equal(web.choice.tokensRead, nativeChoice.tokens_read);
    // coli generate --logprobs: the same entries as the browser's generate({logprobs}).
    const rendered = `<|im_start|>user\n${Q}<|im_end|>\n<|im_start|>assistant\n`;
    const cliGen = JSON.parse(coli(["generate", "--model", DEMO, "--prompt", rendered, "--max-new-tokens", "24", "--temperature", "0", "--json", "--logprobs", "3"]));
    assert.deepEqual(web.gen.ids, cliGen.ids);
    assert.ok(cliGen.logprobs.length > 0);
    assert.deepEqual(web.gen.logprobs, cliGen.logprobs, "coli generate --logprobs and the browser differ");
  } finally {
    await browser.close();
    await helper.stop();
    rmSync(empty, { recursive: true, force: true });
  }
});
