// A conversation longer than the model's context, on every browser surface: the engine's
// fit_chat drops the oldest turns (the system prompt stays), colibri.js reports it as the
// helper's API does (dropped_messages, same prompt, same answer), and the chat page and the
// widget say so in the conversation. Model: the demo checkpoint with its context cut to
// 200 tokens, converted as models/demo is.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, readdirSync, copyFileSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ARTIFACTS, ROOT, coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

const CTX = 200;
const SUMS = [[23, 45], [31, 27], [56, 18], [64, 29], [47, 38]];
let dir, helper, browser;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "colibri-e2e-context-"));
  const src = join(dir, "src");
  mkdirSync(src);
  for (const f of readdirSync(join(ROOT, "models/demo-hf"))) copyFileSync(join(ROOT, "models/demo-hf", f), join(src, f));
  const cfg = JSON.parse(readFileSync(join(src, "config.json"), "utf8"));
  cfg.max_position_embeddings = CTX;
  writeFileSync(join(src, "config.json"), JSON.stringify(cfg));
  mkdirSync(join(dir, "models"));
  coli(["convert", src, "-o", join(dir, "models/demo-small"), "--quant", "int8"]);
  helper = await startHelper({ modelsDir: join(dir, "models"), port: await freePort() });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await helper?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** The demo's worked answer (tools/train_demo.py add_answer). */
function addAnswer(a, b) {
  const u = (a % 10) + (b % 10);
  const c = u >= 10 ? 1 : 0;
  return `${a} + ${b}: ${a % 10} + ${b % 10} = ${u}${c ? ", carry 1. " : ". "}${Math.floor(a / 10)} + ${Math.floor(b / 10)}${c ? " + 1" : ""} = ${Math.floor(a / 10) + Math.floor(b / 10) + c}. So ${a} + ${b} = ${a + b}.`;
}

/** A system prompt, answered additions, then "What is 47 + 38?". */
function conversation(turns) {
  const m = [{ role: "system", content: "Answer briefly." }];
  for (const [a, b] of SUMS.slice(0, turns)) {
    m.push({ role: "user", content: `What is ${a} + ${b}?` });
    m.push({ role: "assistant", content: addAnswer(a, b) });
  }
  m.push({ role: "user", content: "What is 47 + 38?" });
  return m;
}

test("colibri.js drops the same turns as the helper's API and gives the same answer", async () => {
  const req = { model: "demo-small", messages: conversation(5), max_tokens: 40, temperature: 0 };
  const r = await fetch(`${helper.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req) });
  const native = await r.json();
  assert.equal(r.status, 200, JSON.stringify(native));
  assert.ok(native.dropped_messages >= 2 && native.dropped_messages % 2 === 0, JSON.stringify(native));
  const page = await browser.context.newPage();
  await page.goto(`${helper.url}/health`);
  const web = await page.evaluate(async (req) => {
    const { load } = await import("/colibri.js");
    const engine = await load({ model: "demo-small", backend: "cpu" });
    const plain = await engine.chat.completions.create(req);
    const chunks = [];
    for await (const c of engine.chat.completions.create({ ...req, stream: true })) chunks.push(c);
    let refused = null;
    try {
      await engine.chat.completions.create({ ...req, truncation: "disabled" });
    } catch (e) {
      refused = String(e.message || e);
    }
    return { plain, first: chunks[0], streamed: chunks.map((c) => c.choices[0]?.delta?.content || "").join(""), refused };
  }, req);
  assert.equal(web.plain.dropped_messages, native.dropped_messages);
  // The same counts; cached_tokens depend on what each engine served before (the helper
  // already answered this conversation in an earlier test, the tab did not).
  const counts = ({ prompt_tokens, completion_tokens, total_tokens }) => ({ prompt_tokens, completion_tokens, total_tokens });
  assert.deepEqual(counts(web.plain.usage), counts(native.usage));
  assert.equal(web.plain.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(web.plain.choices[0].message.content, native.choices[0].message.content);
  assert.match(native.choices[0].message.content, /So 47 \+ 38 = 85\.$/);
  assert.equal(web.first.dropped_messages, native.dropped_messages);
  assert.equal(web.streamed, native.choices[0].message.content);
  assert.match(web.refused, /context/i, "truncation: disabled refuses an overflow");
  await page.close();
});

test("the chat page marks the turns that no longer fit and keeps answering", async () => {
  const page = await browser.context.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e)));
  await page.goto(`${helper.url}/?model=demo-small`);
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  for (const [i, [a, b]] of SUMS.entries()) {
    await page.fill("#prompt", `What is ${a} + ${b}?`);
    await page.click("#send");
    await page.waitForFunction((n) => document.body.dataset.state === "ready" && document.querySelectorAll('.msg[data-role="assistant"]').length === n && !document.querySelector(".msg.streaming"), i + 1, { timeout: 120_000 });
    const last = await page.$$eval('.msg[data-role="assistant"] .bubble', (b) => b.at(-1).textContent);
    assert.match(last, new RegExp(`So ${a} \\+ ${b} = ${a + b}\\.$`), last);
  }
  const note = await page.textContent(".context-note");
  assert.match(note, /no longer fit the model's context \(200 tokens\)/, note);
  const dimmed = await page.$$eval(".msg.out-of-context", (m) => m.map((x) => x.dataset.role));
  assert.ok(dimmed.length >= 2 && dimmed.length % 2 === 0 && dimmed[0] === "user", JSON.stringify(dimmed));
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, "app-context.png") });
  // The note sits where the context begins: right after the last dimmed message.
  assert.equal(await page.evaluate(() => document.querySelector(".context-note").previousElementSibling.classList.contains("out-of-context")), true);
  assert.deepEqual(problems, []);
  await page.close();
});

test("the widget says so in its conversation", async () => {
  const page = await browser.context.newPage();
  await page.goto(`${helper.url}/health`);
  await page.evaluate(async () => {
    document.body.innerHTML = '<colibri-chat model="demo-small" style="display:block;height:420px"></colibri-chat>';
    await import("/widget.js");
  });
  await page.waitForFunction(() => document.querySelector("colibri-chat")?.dataset.state === "ready", null, { timeout: 120_000 });
  for (const [i, [a, b]] of SUMS.entries()) {
    await page.fill("colibri-chat textarea", `What is ${a} + ${b}?`);
    await page.press("colibri-chat textarea", "Enter");
    await page.waitForFunction((n) => {
      const w = document.querySelector("colibri-chat");
      const a = w.shadowRoot.querySelectorAll('.msg[data-role="assistant"] .bubble');
      return w.dataset.state === "ready" && a.length === n && a[n - 1].textContent.length > 0;
    }, i + 1, { timeout: 120_000 });
    const last = await page.evaluate(() => [...document.querySelector("colibri-chat").shadowRoot.querySelectorAll('.msg[data-role="assistant"] .bubble')].at(-1).textContent);
    assert.match(last, new RegExp(`So ${a} \\+ ${b} = ${a + b}\\.$`), last);
  }
  const note = await page.evaluate(() => document.querySelector("colibri-chat").shadowRoot.querySelector(".context-note")?.textContent);
  assert.match(note || "", /no longer fit the model's context/, String(note));
  const dimmed = await page.evaluate(() => document.querySelector("colibri-chat").shadowRoot.querySelectorAll(".msg.out-of-context").length);
  assert.ok(dimmed >= 2 && dimmed % 2 === 0, String(dimmed));
  await page.close();
});
