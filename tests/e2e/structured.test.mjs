// Structured output in the browser engine on the demo model: generate({jsonSchema}) and
// chat.completions.create({response_format}) return JSON valid under the schema, the same
// tokens as `coli generate --json-schema` and the helper's API for the same seed. The
// demo model is retrained from time to time: validity and browser == native are checked,
// never its exact text.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ROOT, coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

const DEMO = join(ROOT, "models/demo");
const REPEAT = "one two three four five one two three four five one two three";
const SCHEMA = {
  type: "object",
  additionalProperties: false,
  required: ["city", "days", "rain"],
  properties: {
    city: { type: "string", maxLength: 10 },
    days: { type: "integer", minimum: 1, maximum: 14 },
    rain: { type: "boolean" },
  },
};

function assertValid(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v).sort(), ["city", "days", "rain"], text);
  assert.ok(typeof v.city === "string" && [...v.city].length <= 10, text);
  assert.ok(Number.isInteger(v.days) && v.days >= 1 && v.days <= 14, text);
  assert.equal(typeof v.rain, "boolean", text);
}

async function post(url, body) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const v = await r.json();
  assert.equal(r.status, 200, JSON.stringify(v));
  return v;
}

test("generate({jsonSchema}) validates and equals coli generate --json-schema token for token", async () => {
  const dir = mkdtempSync(join(tmpdir(), "colibri-e2e-structured-"));
  const schemaFile = join(dir, "schema.json");
  writeFileSync(schemaFile, JSON.stringify(SCHEMA));
  const helper = await startHelper({ modelsDir: dir, port: await freePort(), extra: ["--model", DEMO] });
  const browser = await launchBrowser();
  const prompt = "<|im_start|>user\nPlan a trip as JSON.<|im_end|>\n<|im_start|>assistant\n";
  const runs = [{ seed: 0, temperature: 0 }, { seed: 7, temperature: 1 }, { seed: 11, temperature: 1 }];
  try {
    const rf = { type: "json_schema", json_schema: { name: "trip", schema: SCHEMA, strict: true } };
    const chatReq = { model: "demo", messages: [{ role: "user", content: "Plan a trip as JSON." }], max_tokens: 80, temperature: 1, seed: 5, response_format: rf };
    const native = await post(`${helper.url}/v1/chat/completions`, chatReq);
    assert.equal(native.choices[0].finish_reason, "stop", JSON.stringify(native));
    assertValid(native.choices[0].message.content);

    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(async ({ prompt, runs, schema, chatReq, REPEAT }) => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "demo", backend: "cpu" });
      const ids = await engine.encode(prompt, { addSpecialTokens: true });
      const gens = [];
      for (const r of runs) gens.push(await engine.generate({ ids, maxNewTokens: 80, jsonSchema: schema, ...r }));
      const chat = await engine.chat.completions.create(chatReq);
      let refused = null;
      try {
        await engine.generate({ ids, maxNewTokens: 8, jsonSchema: { type: "frobnicate" } });
      } catch (e) {
        refused = String(e.message);
      }
      const cut = await engine.generate({ ids, maxNewTokens: 3, jsonSchema: schema });
      // Speculation from prompt lookup: the same tokens as without.
      const rep = await engine.encode(REPEAT, { addSpecialTokens: true });
      const plain = await engine.generate({ ids: rep, maxNewTokens: 40, ignoreEos: true });
      const spec = await engine.generate({ ids: rep, maxNewTokens: 40, ignoreEos: true, speculate: 4 });
      const specStats = engine.stats().speculation;
      return { gens, chat, refused, cut, plain, spec, specStats };
    }, { prompt, runs, schema: SCHEMA, chatReq, REPEAT });

    for (const [i, r] of runs.entries()) {
      const g = web.gens[i];
      assert.equal(g.finishReason, "stop", JSON.stringify(g));
      assertValid(g.text);
      const cli = JSON.parse(coli(["generate", "--model", DEMO, "--prompt", prompt, "--json-schema", schemaFile, "--max-new-tokens", "80",
        "--temperature", String(r.temperature), "--seed", String(r.seed), "--json"]));
      assert.deepEqual(g.ids, cli.ids, `seed ${r.seed}: the browser and coli generate differ`);
      assert.equal(g.text, cli.text);
      assert.equal(cli.finish_reason, "stop");
    }
    // chat.completions.create with response_format: the helper's answer, to the token.
    assert.equal(web.chat.choices[0].message.content, native.choices[0].message.content);
    assert.equal(web.chat.choices[0].finish_reason, "stop");
    assert.match(web.refused || "", /frobnicate/);
    assert.equal(web.cut.finishReason, "length");
    assert.throws(() => JSON.parse(web.cut.text));
    assert.deepEqual(web.spec.ids, web.plain.ids, "speculation changed the tokens");
    const cliSpec = JSON.parse(coli(["generate", "--model", DEMO, "--prompt", REPEAT, "--max-new-tokens", "40", "--ignore-eos", "--speculate", "4", "--json"]));
    assert.deepEqual(web.spec.ids, cliSpec.ids);
    const s = cliSpec.speculation;
    assert.deepEqual(
      [web.specStats.forwards, web.specStats.drafted, web.specStats.accepted, web.specStats.produced],
      [s.forwards, s.drafted, s.accepted, s.produced],
      "the browser and coli generate speculate alike",
    );
  } finally {
    await browser.close();
    await helper.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
