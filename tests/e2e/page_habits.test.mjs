// The chat page's everyday habits (issue 36 item 6): a reload mid-answer keeps the partial
// answer, marked as cut, with Regenerate; each answer shows its tokens and tokens/s; the
// backend picker (auto / WebGPU / CPU) reloads the model where asked, remembers the choice,
// and both backends give the same answer. A real `coli serve`, the wasm engine, a converted
// fixture model (olmoe: random weights, so answers run to Max tokens), headless Chromium.
//
// E2E_WEB_FROM_DISK=1 serves web/ from disk (servers.mjs), as in app.test.mjs.
import { test, before, after, afterEach } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { convertedFixture, freePort, startHelper, launchBrowser, ARTIFACTS } from "./harness.mjs";
import { startWebFront } from "./servers.mjs";

const MODEL = "olmoe"; // 4096-token context: room for a long answer to reload in the middle of
let fx, helper, front, base, browser;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(MODEL, "int4");
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
  base = helper.url;
  if (process.env.E2E_WEB_FROM_DISK) {
    front = await startWebFront(helper.url);
    base = front.url;
  }
  browser = await launchBrowser();
});

const open = new Set();
afterEach(async () => {
  for (const page of [...open]) await page.close().catch(() => {});
});

after(async () => {
  if (browser) await browser.close();
  if (front) await front.stop();
  if (helper) await helper.stop();
  if (fx) fx.cleanup();
});

const ready = (page) => page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
const idle = (page) => page.waitForFunction(() => document.body.dataset.state === "ready" && !document.querySelector(".msg.streaming"), null, { timeout: 120_000 });

async function openApp(query = "") {
  const page = await browser.context.newPage();
  open.add(page);
  page.once("close", () => open.delete(page));
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e.stack || e)));
  await page.setViewportSize({ width: 1280, height: 820 });
  await page.goto(`${base}/${query}`);
  await ready(page);
  page.problems = problems;
  return page;
}

async function setSettings(page, values) {
  for (const [id, v] of Object.entries(values)) {
    await page.fill(`#${id}`, String(v));
    await page.dispatchEvent(`#${id}`, "change");
  }
}

async function ask(page, text) {
  await page.fill("#prompt", text);
  await page.keyboard.press("Enter");
}

const lastAnswer = (page) => page.textContent('.msg[data-role="assistant"]:last-child .bubble');
const tags = (page) => page.$$eval('.msg[data-role="assistant"]:last-child .meta .tag', (t) => t.map((x) => x.textContent));

test("a reload mid-answer keeps the partial answer, marked as cut, with Regenerate; answers show tokens/s", async () => {
  const page = await openApp(`?model=${MODEL}`);
  // Seed 8: an answer of about 1200 tokens (`coli generate --chat` gives the same ids);
  // seed 3's ended after 284, soon enough after the moment of the reload that under load
  // it sometimes finished first (saved as finished: no tag).
  await setSettings(page, { temperature: 1, "top-p": 1, "max-tokens": 3000, seed: 8 });
  await ask(page, "Tell me a long story about swifts.");
  // Well into the answer (saved at least twice by then), and still writing it.
  await page.waitForFunction(() => (document.querySelector(".msg.streaming .bubble")?.textContent.length || 0) > 40, null, { timeout: 60_000 });
  await page.waitForTimeout(1000);
  const before = await page.evaluate(() => ({ state: document.body.dataset.state, text: document.querySelector(".msg.streaming .bubble")?.textContent || "" }));
  assert.equal(before.state, "generating", "the answer should still be streaming when the page reloads");
  await page.reload();
  await ready(page);

  const kept = await lastAnswer(page);
  assert.ok(kept.length >= 20, `the partial answer is kept: ${JSON.stringify(kept)}`);
  // What was saved was on screen: the first 20 characters agree.
  assert.equal(kept.slice(0, 20), before.text.slice(0, 20));
  // The messages are drawn again as the model's load completes: the tag is waited for (an
  // answer saved as finished or stopped never gets it, and fails below).
  await page.waitForFunction(() => document.querySelector('.msg[data-role="assistant"]:last-child .meta .tag'), null, { timeout: 10_000 }).catch(() => {});
  assert.deepEqual(await tags(page), ["cut off"], "marked as cut (not as stopped, not as finished)");
  assert.equal(await page.locator(".msg.streaming").count(), 0);
  assert.equal(await page.locator('.msg[data-role="assistant"]:last-child .regen').count(), 1, "Regenerate is offered");
  await page.screenshot({ path: join(ARTIFACTS, "page-cut-answer.png") });

  // Regenerate writes a whole new answer, which is not marked and says how fast it came.
  await setSettings(page, { "max-tokens": 24 });
  await page.click('.msg[data-role="assistant"]:last-child .regen');
  await idle(page);
  assert.equal(await page.locator('.msg[data-role="assistant"]').count(), 1);
  assert.deepEqual(await tags(page), ["length limit"]);
  const speed = await page.textContent('.msg[data-role="assistant"]:last-child .speed');
  const m = /^24 tokens · ([\d.]+) tok\/s$/.exec(speed);
  assert.ok(m && Number(m[1]) > 0, `tokens and tokens/s under the answer: ${speed}`);

  // Kept through a reload too, with no cut mark: the answer had ended.
  await page.reload();
  await ready(page);
  assert.equal(await page.textContent('.msg[data-role="assistant"]:last-child .speed'), speed);
  assert.deepEqual(await tags(page), ["length limit"]);
  assert.deepEqual(page.problems, []);
});

test("the backend picker loads the model on the chosen backend, remembers it, and both answer alike", async () => {
  const page = await openApp(`?model=${MODEL}`);
  assert.equal(await page.inputValue("#backend-pick"), "auto");
  assert.equal(await page.$eval('#backend-pick option[value="webgpu"]', (o) => o.disabled), false, "this Chromium has WebGPU (SwiftShader)");
  await setSettings(page, { temperature: 0, "max-tokens": 12, seed: 1 });

  const answerOn = async (backend, label) => {
    await page.selectOption("#backend-pick", backend);
    await page.waitForFunction(() => document.body.dataset.state === "loading", null, { timeout: 10_000 }).catch(() => {});
    await ready(page);
    assert.equal(await page.textContent("#backend"), label, `the badge names the backend after picking ${backend}`);
    await page.click("#new-chat");
    await ask(page, "Name three birds.");
    await page.waitForFunction(() => document.body.dataset.state === "generating", null, { timeout: 30_000 }).catch(() => {});
    await idle(page);
    return lastAnswer(page);
  };
  const cpu = await answerOn("cpu", "CPU · wasm");
  const gpu = await answerOn("webgpu", "WebGPU");
  assert.ok(cpu.length > 0);
  assert.equal(gpu, cpu, "the same tokens on both backends");

  // Remembered: a reload loads the model on WebGPU again.
  await page.reload();
  await ready(page);
  assert.equal(await page.inputValue("#backend-pick"), "webgpu");
  assert.equal(await page.textContent("#backend"), "WebGPU");
  assert.deepEqual(page.problems, []);
  // ?backend= in the URL still overrides the setting (one page at a time: an open page's
  // engine holds the model's browser storage).
  await page.close();
  const forced = await openApp(`?model=${MODEL}&backend=cpu`);
  assert.equal(await forced.inputValue("#backend-pick"), "cpu");
  assert.equal(await forced.textContent("#backend"), "CPU · wasm");
  // Back to auto for the tests that follow (the setting is kept per origin).
  await forced.selectOption("#backend-pick", "auto");
  await ready(forced);
  assert.deepEqual(forced.problems, []);
});

test("chats exported as JSON import back; search finds chats by their text; a delete can be undone", async () => {
  // The earlier tests' chats are on this origin too: start from an empty list.
  const first = await openApp(`?model=${MODEL}`);
  await first.evaluate(() => localStorage.removeItem("colibri.active.v1"));
  await first.evaluate(() => new Promise((ok) => {
    const r = indexedDB.deleteDatabase("colibri-app");
    r.onsuccess = r.onerror = r.onblocked = () => ok();
  }));
  await first.close();
  const page = await openApp(`?model=${MODEL}`);
  assert.equal(await page.locator("#conversations li").count(), 0);
  const chats = [
    { id: "c-swifts", title: "About swifts", model: MODEL, created: 1, updated: 2, messages: [{ role: "user", content: "Do swifts sleep in flight?" }, { role: "assistant", content: "They do, in short naps." }] },
    { id: "c-owls", title: "About owls", model: MODEL, created: 3, updated: 4, messages: [{ role: "user", content: "Why do owls hoot?" }, { role: "assistant", content: "To keep their territory.", stopped: true }] },
  ];
  const titles = () => page.$$eval("#conversations li .open span", (s) => s.map((x) => x.textContent));
  await page.setInputFiles("#import", { name: "birds.json", mimeType: "application/json", buffer: Buffer.from(JSON.stringify(chats)) });
  await page.waitForFunction(() => document.querySelectorAll("#conversations li").length >= 2);
  assert.deepEqual((await titles()).sort(), ["About owls", "About swifts"]);
  assert.equal(await page.textContent('.msg[data-role="user"] .bubble'), "Do swifts sleep in flight?", "the first imported chat opens");
  assert.deepEqual(await page.$$eval(".msg .bubble", (b) => b.map((x) => x.textContent.trim())), ["Do swifts sleep in flight?", "They do, in short naps."]);

  // A file that is not an export says why, and imports nothing.
  await page.setInputFiles("#import", { name: "notes.json", mimeType: "application/json", buffer: Buffer.from('{"text": "hi"}') });
  await page.waitForSelector('[data-notice="import"]');
  assert.match(await page.textContent('[data-notice="import"]'), /Could not import notes\.json: no "messages" list/);
  assert.equal((await titles()).length, 2);

  // Export → JSON, then import that file: a copy with the same messages (a new id).
  const [d] = await Promise.all([page.waitForEvent("download"), page.click("#export-json")]);
  const exported = await (await import("node:fs/promises")).readFile(await d.path(), "utf8");
  await page.setInputFiles("#import", { name: "again.json", mimeType: "application/json", buffer: Buffer.from(exported) });
  await page.waitForFunction(() => document.querySelectorAll("#conversations li").length === 3);
  assert.deepEqual((await titles()).filter((t) => t === "About swifts").length, 2);

  // Search: message text (not only titles), every word, any case.
  await page.fill("#search", "HOOT owls");
  assert.deepEqual(await titles(), ["About owls"]);
  await page.fill("#search", "naps");
  assert.deepEqual(await titles(), ["About swifts", "About swifts"]);
  await page.fill("#search", "penguins");
  assert.deepEqual(await titles(), []);
  assert.equal(await page.isVisible("#no-match"), true);
  await page.fill("#search", "");
  assert.equal((await titles()).length, 3);

  // Delete the open chat, then Undo: it is back, open, with its messages, and survives a reload.
  await page.click('#conversations li:has(span:text("About owls")) .open');
  await page.click('#conversations li:has(span:text("About owls")) .del');
  assert.equal(await page.locator(".msg").count(), 0, "a new chat replaces the deleted one");
  assert.equal((await titles()).includes("About owls"), false);
  await page.click('[data-notice="undo-delete"] .undo');
  assert.equal((await titles()).includes("About owls"), true);
  assert.deepEqual(await page.$$eval(".msg .bubble", (b) => b.map((x) => x.textContent.trim())), ["Why do owls hoot?", "To keep their territory."]);
  await page.reload();
  await ready(page);
  assert.equal((await titles()).includes("About owls"), true);
  // A delete not undone is gone after a reload.
  await page.click('#conversations li:has(span:text("About owls")) .del');
  await page.reload();
  await ready(page);
  assert.equal((await titles()).includes("About owls"), false);
  // A write the page journaled but IndexedDB never committed (a reload aborts a transaction
  // still in flight) is applied at the next load: here a delete of one of the two swift chats.
  const swiftId = await page.getAttribute('#conversations li:has(span:text("About swifts"))', "data-id");
  await page.evaluate((id) => localStorage.setItem(`colibri.pending.v1.${id}`, JSON.stringify({ seq: "x", conv: null })), swiftId);
  await page.reload();
  await ready(page);
  assert.deepEqual(await titles(), ["About swifts"]);
  assert.equal(await page.getAttribute("#conversations li", "data-id") === swiftId, false);
  assert.equal(await page.evaluate(() => Object.keys(localStorage).filter((k) => k.startsWith("colibri.pending.")).length), 0, "the journal empties once written");
  await page.reload();
  await ready(page);
  assert.deepEqual(await titles(), ["About swifts"], "the replayed delete reached IndexedDB");

  // A chat deleted while its answer streams stays deleted: the answer stops and nothing
  // saves the chat again (neither the partial saves nor the answer's end).
  await setSettings(page, { temperature: 1, "max-tokens": 3000 });
  await page.click("#new-chat");
  await ask(page, "Tell me about kestrels.");
  await page.waitForFunction(() => (document.querySelector(".msg.streaming .bubble")?.textContent.length || 0) > 20, null, { timeout: 60_000 });
  assert.equal((await titles()).includes("Tell me about kestrels."), true);
  await page.click('#conversations li:has(span:text("Tell me about kestrels.")) .del');
  await idle(page);
  await page.waitForTimeout(700);
  assert.equal((await titles()).includes("Tell me about kestrels."), false);
  await page.reload();
  await ready(page);
  assert.equal((await titles()).includes("Tell me about kestrels."), false);
  assert.deepEqual(page.problems, []);
});

test("the message box counts the chat's tokens against the context before sending, as the model reads them", async () => {
  const page = await openApp(`?model=${MODEL}`);
  await page.click("#new-chat");
  await setSettings(page, { "max-tokens": 16 });
  const counted = async (text) => {
    await page.fill("#prompt", text);
    await page.waitForFunction((t) => document.getElementById("prompt").value === t && document.getElementById("token-count").dataset.tokens, text);
    // The count comes 200 ms after the last key; wait for it to settle.
    await page.waitForTimeout(500);
    return { n: Number(await page.getAttribute("#token-count", "data-tokens")), text: await page.textContent("#token-count"), over: await page.$eval("#token-count", (e) => e.classList.contains("over")) };
  };
  const short = await counted("Name three birds.");
  // The helper's API counts the same prompt (the same template and tokenizer) in its usage.
  const r = await (await fetch(`${helper.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Name three birds." }], max_tokens: 1 }) })).json();
  assert.equal(short.n, r.usage.prompt_tokens, "the page counts what the model reads");
  assert.equal(short.text, `· ${short.n} / 4,096 tokens`);
  assert.equal(short.over, false);
  const longer = await counted("Name three birds. ".repeat(20));
  assert.ok(longer.n > short.n + 40, `${longer.n} vs ${short.n}`);
  // With room for a 4,090-token answer the chat no longer fits: red, and it says why.
  await setSettings(page, { "max-tokens": 4090 });
  const over = await counted("Name three birds.");
  assert.equal(over.over, true);
  assert.match(await page.getAttribute("#token-count", "title"), /oldest messages will be dropped/);
  assert.deepEqual(page.problems, []);
});

test("with the model in browser storage, the page opens and chats with no helper running (service worker)", async () => {
  // A helper (and front) of its own: this test stops it.
  const own = await startHelper({ modelsDir: fx.modelsDir, port: await freePort() });
  const ownFront = process.env.E2E_WEB_FROM_DISK ? await startWebFront(own.url) : null;
  const url = ownFront ? ownFront.url : own.url;
  const page = await browser.context.newPage();
  open.add(page);
  page.once("close", () => open.delete(page));
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e.stack || e)));
  let stopped = false;
  try {
    await page.goto(`${url}/?model=${MODEL}&backend=cpu`);
    await ready(page);
    await page.waitForFunction(() => !!navigator.serviceWorker.controller, null, { timeout: 30_000 });
    // What a visit without the helper needs is kept once the model has loaded.
    for (let i = 0; ; i++) {
      const keptAll = await page.evaluate(async (m) => !!(await caches.match(`/models/${m}/colibri.json`)) && !!(await caches.match("/pkg/colibri_wasm_bg.wasm")) && !!(await caches.match("/api/models")), MODEL);
      if (keptAll) break;
      assert.ok(i < 100, "the shell and the model's files are kept for offline use");
      await page.waitForTimeout(200);
    }
    await setSettings(page, { temperature: 0, "max-tokens": 12, seed: 1 });
    await page.click("#new-chat");
    await ask(page, "Name three birds.");
    await page.waitForFunction(() => document.body.dataset.state === "generating", null, { timeout: 30_000 }).catch(() => {});
    await idle(page);
    const online = await lastAnswer(page);
    const onlineTags = await tags(page);
    assert.ok(online.length > 0);

    // The helper goes away; the page opens again from the service worker, loads the model
    // from browser storage, and answers the same question the same way.
    if (ownFront) await ownFront.stop();
    await own.stop();
    stopped = true;
    assert.equal(await fetch(`${url}/health`).then(() => "up", () => "down"), "down");
    await page.reload();
    await ready(page);
    await page.waitForSelector('[data-notice="helper"]', { timeout: 30_000 });
    assert.match(await page.textContent('[data-notice="helper"]'), /the model kept in this browser still answers/);
    await page.click("#new-chat");
    await ask(page, "Name three birds.");
    await page.waitForFunction(() => document.body.dataset.state === "generating", null, { timeout: 30_000 }).catch(() => {});
    await idle(page);
    assert.equal(await lastAnswer(page), online, "the same answer with no helper");
    assert.deepEqual(await tags(page), onlineTags, "no error");
    await page.screenshot({ path: join(ARTIFACTS, "page-offline.png") });
    assert.deepEqual(problems, []);
  } finally {
    if (!stopped) {
      if (ownFront) await ownFront.stop();
      await own.stop();
    }
  }
});
