// The built-in demo model (models/demo) through the browser path: held-out arithmetic
// answered correctly at temperature 0, with exactly the native engine's answer.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ROOT, coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

// Held-out operand pairs (never in training, in any phrasing: Tasks.add_held / sub_held of
// tools/train_demo.py); see helper/tests/it/demo_model.rs.
const CASES = [
  ["What is 84 minus 27?", 57],
  ["What is 47 plus 38?", 85],
];

const rendered = (q) => `<|im_start|>user\n${q}<|im_end|>\n<|im_start|>assistant\n`;
const finalNumber = (text) => Number(text.trim().replace(/\.$/, "").split("=").pop().trim());

test("the demo model answers held-out arithmetic in the browser exactly as natively", async () => {
  const empty = mkdtempSync(join(tmpdir(), "colibri-e2e-models-"));
  const helper = await startHelper({ modelsDir: empty, port: await freePort(), extra: ["--model", join(ROOT, "models/demo")] });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    for (const [q, want] of CASES) {
      const native = JSON.parse(coli(["generate", "--model", join(ROOT, "models/demo"), "--prompt", rendered(q), "--max-new-tokens", "64", "--temperature", "0", "--json"]));
      const web = await page.evaluate(async ({ prompt }) => {
        const { load } = await import("/colibri.js");
        window.engine ||= await load({ model: "demo", backend: "cpu" });
        const ids = await window.engine.encode(prompt, { addSpecialTokens: true });
        return window.engine.generate({ ids, maxNewTokens: 64, temperature: 0 });
      }, { prompt: rendered(q) });
      assert.deepEqual(web.ids, native.ids, `${q}: browser and native tokens differ`);
      assert.equal(finalNumber(web.text), want, `${q}: answered ${JSON.stringify(web.text)}`);
    }
    // The chat API without a temperature uses the model's defaults: the demo's
    // generation_config.json says do_sample false, so it answers greedily.
    const [q, want] = CASES[0];
    const chat = await page.evaluate(async (q) => {
      const r = await window.engine.chat.completions.create({ messages: [{ role: "user", content: q }], max_tokens: 64 });
      return { content: r.choices[0].message.content, sampling: window.engine.info.info.sampling };
    }, q);
    assert.deepEqual(chat.sampling, { temperature: 0, topP: 1 });
    assert.equal(finalNumber(chat.content), want, `${q}: the chat API answered ${JSON.stringify(chat.content)}`);

    // Turn 8 of a conversation mixing its tasks (the demo was retrained on conversations of
    // 1-8 turns): the browser's chat API and the helper's answer alike, and right.
    const messages = [
      ["Hello!", "Hello! Ask me something."],
      ["What is 23 + 45?", "23 + 45: 3 + 5 = 8. 2 + 4 = 6. So 23 + 45 = 68."],
      ["What is the capital of France?", "The capital of France is Paris."],
      ["Spell \"cat\" backwards.", "\"cat\" is spelled c-a-t. Backwards it is t-a-c."],
      ["How many items are in this list: cat, dog, owl?", "Let me count: 1 cat, 2 dog, 3 owl. There are 3."],
      ["What sound does a cow make?", "A cow says \"moo\"."],
      ["What is 91 - 35?", "91 - 35: 1 - 5 needs a borrow, 11 - 5 = 6. 9 - 1 - 3 = 5. So 91 - 35 = 56."],
    ].flatMap(([u, a]) => [{ role: "user", content: u }, { role: "assistant", content: a }]);
    messages.push({ role: "user", content: "Spell river backwards." });
    const req = { model: "demo", messages, max_tokens: 64, temperature: 0 };
    const api = await (await fetch(`${helper.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req) })).json();
    const web = await page.evaluate(async (req) => (await window.engine.chat.completions.create(req)).choices[0].message.content, req);
    assert.equal(api.choices[0].message.content, "\"river\" is spelled r-i-v-e-r. Backwards it is r-e-v-i-r.", JSON.stringify(api));
    assert.equal(web, api.choices[0].message.content);
  } finally {
    await browser.close();
    await helper.stop();
    rmSync(empty, { recursive: true, force: true });
  }
});

test("the chat page with the demo: named loading phases, its example prompts, tier shares that add up to 100%", async () => {
  const empty = mkdtempSync(join(tmpdir(), "colibri-e2e-models-"));
  const helper = await startHelper({ modelsDir: empty, port: await freePort(), extra: ["--model", join(ROOT, "models/demo")] });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const problems = [];
    page.on("pageerror", (e) => problems.push(String(e)));
    // Every text the loading line shows, in order.
    await page.addInitScript(() => {
      window.__phases = [];
      document.addEventListener("DOMContentLoaded", () => {
        const t = document.getElementById("progress-text");
        new MutationObserver(() => window.__phases.push(t.textContent)).observe(t, { childList: true, characterData: true, subtree: true });
      });
    });
    await page.goto(`${helper.url}/?model=demo`);
    await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
    const phases = await page.evaluate(() => window.__phases);
    assert.ok(phases.some((p) => p.startsWith("demo: fetching weights")), JSON.stringify(phases));
    if (await page.evaluate(() => !!navigator.gpu)) {
      // `auto` times both backends after the weights came: named, not "0 B of ...".
      assert.match(phases.at(-1), /measuring WebGPU vs CPU/, JSON.stringify(phases));
    }

    // The empty chat offers models/demo/examples.json; one click asks one.
    const want = JSON.parse(readFileSync(join(ROOT, "models/demo/examples.json"), "utf8")).prompts;
    await page.waitForSelector("#examples .example");
    assert.deepEqual(await page.$$eval("#examples .example", (b) => b.map((x) => x.textContent)), want);
    await page.click(`#examples .example >> nth=0`);
    await page.waitForFunction(() => document.body.dataset.state === "ready" && document.querySelector('.msg[data-role="assistant"] .bubble')?.textContent.length > 0 && !document.querySelector(".msg.streaming"), null, { timeout: 120_000 });
    const [question, answer] = await page.$$eval(".msg .bubble", (b) => b.map((x) => x.textContent));
    assert.equal(question, want[0]);
    assert.match(answer, /So 47 \+ 38 = 85\./, answer);
    assert.equal(await page.isVisible("#empty"), false);

    // Each expert use counted once, by the tier that served it: the shares add up.
    const rows = await page.$$eval(".tier-row", (r) => r.map((x) => ({ n: Number(x.dataset.count), pct: Number(x.querySelector(".pct").textContent.replace("%", "")) })));
    const uses = rows.reduce((a, r) => a + r.n, 0);
    const pct = rows.reduce((a, r) => a + r.pct, 0);
    assert.ok(uses > 0, JSON.stringify(rows));
    assert.ok(Math.abs(pct - 100) <= 2, `tier shares add up to ${pct}%: ${JSON.stringify(rows)}`);

    // A new chat shows the examples again.
    await page.click("#new-chat");
    await page.waitForSelector("#examples .example", { state: "visible" });
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
    await helper.stop();
    rmSync(empty, { recursive: true, force: true });
  }
});
