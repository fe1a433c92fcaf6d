// The browser engine bounds grammar compilation as the helper does (issue 29: "the same
// limits in the CLI and the browser"): a JSON schema past the engine's limits (a 1,000-link
// $ref chain, a 10,000-property object, thousands of levels of literal nesting) or a Lark
// grammar whose rules chain 3,000 deep is refused with a clear message naming the limit,
// the one the helper's API answers with its 400, and the worker lives on: the next
// generate() runs. (The compiler recurses: without the limits these overflow the 1 MiB
// wasm stack, which corrupts memory or traps and takes the worker down. A schema nested
// past the JSON parsers' 128 levels is refused by them, naming the nesting; it used to
// make the call hang: its structured clone failed in the worker, which dropped the message.)
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ROOT, freePort, startHelper, launchBrowser } from "./harness.mjs";

const DEMO = join(ROOT, "models/demo");

function refChain(n) {
  const defs = {};
  for (let i = 0; i < n; i++) defs[`d${i}`] = i + 1 < n ? { $ref: `#/$defs/d${i + 1}` } : { type: "string" };
  return { $defs: defs, $ref: "#/$defs/d0" };
}

function wide(n) {
  const properties = {};
  for (let i = 0; i < n; i++) properties[`p${i}`] = { type: "integer" };
  return { type: "object", properties };
}

function nested(n) {
  let s = { type: "string" };
  for (let i = 0; i < n; i++) s = { type: "object", properties: { a: s }, required: ["a"] };
  return s;
}

// One JSON level per schema level: deeper than the engine's 64, within serde_json's 128.
function items(n) {
  let s = { type: "string" };
  for (let i = 0; i < n; i++) s = { type: "array", items: s };
  return s;
}

function larkChain(n) {
  const rules = ["start: r0"];
  for (let i = 0; i < n; i++) rules.push(i + 1 < n ? `r${i}: "a" r${i + 1}` : `r${i}: "a"`);
  return rules.join("\n");
}

// What each case's message must say (the engine's limit, the same words as the helper's).
// Each is built where it is used (a deeply nested literal is more than Playwright and
// JSON.stringify carry as an argument).
const CASES = [
  { name: "a 1,000-link $ref chain", build: "refChain", n: 1000, says: "deeper than 64 levels" },
  { name: "a 10,000-property object", build: "wide", n: 10000, says: "over the limit of 1000" },
  { name: "100 levels of nested arrays", build: "items", n: 100, says: "deeper than 64 levels" },
  // Past the JSON parsers' 128 levels: the helper's body parser and the engine's options
  // parser refuse it, each naming the nesting.
  { name: "1,500 levels of nested objects", build: "nested", n: 1500, says: "128 levels", helperSays: "recursion limit" },
  // Too deep for the test's own JSON.stringify to send to the helper; the page sends it
  // (Chromium's stack is larger) and the engine refuses it as above. (Before, a structured
  // clone of these took them to the worker, whose deserializer dropped the message: the
  // call never settled.)
  { name: "100,000 levels of nested arrays", build: "items", n: 100000, says: "128 levels", helperSays: null },
  { name: "a 3,000-rule Lark chain", build: "larkChain", n: 3000, grammar: true, says: "deeper than 64 levels" },
];
const BUILDERS = { refChain, wide, nested, items, larkChain };
const BUILDER_SOURCE = Object.values(BUILDERS).map(String).join("\n");

test("schemas and grammars past the limits are clear errors in the browser, as in the helper; the worker lives on", async () => {
  const dir = mkdtempSync(join(tmpdir(), "colibri-e2e-limits-"));
  const helper = await startHelper({ modelsDir: dir, port: await freePort(), extra: ["--model", DEMO] });
  const browser = await launchBrowser();
  try {
    // The helper's answer to the same schemas (response_format) and grammar (llama.cpp's `grammar`).
    const native = [];
    for (const c of CASES) {
      if (c.helperSays === null) {
        native.push(null);
        continue;
      }
      const body = { model: "demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 4 };
      const made = BUILDERS[c.build](c.n);
      if (c.grammar) body.grammar = made;
      else body.response_format = { type: "json_schema", json_schema: { name: "x", schema: made } };
      const r = await fetch(`${helper.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      native.push({ status: r.status, message: (await r.json()).error?.message ?? "" });
    }
    const page = await browser.context.newPage();
    const crashes = [];
    page.on("crash", () => crashes.push("page crashed"));
    page.on("pageerror", (e) => crashes.push(String(e)));
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(async ({ cases, source }) => {
      const builders = new Function(`${source}; return { refChain, wide, nested, items, larkChain };`)();
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "demo", backend: "cpu", threads: 1 });
      const ids = await engine.encode("Hello", { addSpecialTokens: true });
      const out = [];
      for (const c of cases) {
        let refused = null;
        const t = performance.now();
        try {
          const made = builders[c.build](c.n);
          const call = engine.generate({ ids, maxNewTokens: 4, ...(c.grammar ? { grammar: made } : { jsonSchema: made }) });
          const late = new Promise((_, no) => setTimeout(() => no(new Error("TIMEOUT: no answer in 60 s")), 60000));
          await Promise.race([call, late]);
        } catch (e) {
          refused = String(e && e.message ? e.message : e);
        }
        // The worker is still there and still generates.
        const after = await engine.generate({ ids, maxNewTokens: 4, ignoreEos: true });
        out.push({ refused, ms: performance.now() - t, after: after.ids.length });
      }
      return out;
    }, { cases: CASES, source: BUILDER_SOURCE });
    assert.deepEqual(crashes, []);
    for (const [i, c] of CASES.entries()) {
      const w = web[i];
      const n = native[i];
      console.log(`${c.name}: browser ${JSON.stringify(w.refused)} in ${w.ms.toFixed(0)} ms; helper ${n ? `${n.status} ${JSON.stringify(n.message)}` : "(not sent)"}`);
      assert.ok(w.refused, `${c.name}: the browser accepted it`);
      assert.ok(!w.refused.includes("\n") && w.refused.length < 400, `${c.name}: ${w.refused}`);
      assert.ok(w.refused.includes(c.says), `${c.name}: ${w.refused}`);
      if (n) {
        assert.equal(n.status, 400, `${c.name}: ${n.message}`);
        assert.ok(n.message.includes(c.helperSays ?? c.says), `${c.name}: ${n.message}`);
      }
      assert.equal(w.after, 4, `${c.name}: the engine did not generate after the refusal`);
    }
  } finally {
    await browser.close();
    await helper.stop();
  }
});
