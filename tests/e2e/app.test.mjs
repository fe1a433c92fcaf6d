// The chat page and the <colibri-chat> widget end to end: a real `coli serve` serving the
// page, the wasm engine and two converted fixture models, driven in Debian's Chromium.
// Screenshots go to target/e2e-artifacts/app-*.png.
//
// E2E_WEB_FROM_DISK=1 puts a small front (servers.mjs) before the helper that serves web/
// from disk, for working on the page without rebuilding `coli`.
import { test, before, after, afterEach } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT, coli, convertedFixture, freePort, startHelper, launchBrowser, ARTIFACTS } from "./harness.mjs";
import { startPageServer, startWebFront } from "./servers.mjs";

const LONG = "olmoe"; // 4096-token context: room for long answers
const GRID = "qwen3_moe"; // 32 experts x 2 layers: a busier Brain view
let fx, helper, front, base, browser, allowed, denied;

// docs/widget.md's snippet, fallback text included (shown only while the element is not
// defined, i.e. when widget.js could not be loaded at all).
const FALLBACK = "The chat needs the colibri helper on your computer";
const widgetPage = (src, attrs = "") => `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>a site that embeds colibri</title>
<style>body{font-family:system-ui,sans-serif;max-width:42rem;margin:2rem auto;padding:0 1rem;background:#f4f1ea} colibri-chat{height:420px}</style>
<script type="module" src="${src}"></script></head>
<body><h1>My page</h1><p>This page is served from another origin and embeds the colibri widget.</p>
<colibri-chat ${attrs}>${FALLBACK}: see <a href="https://example.invalid/colibri">how to start it</a>.</colibri-chat></body></html>`;

// Whether the element's own (light DOM) content is rendered: boxes of its text on screen.
const fallbackShown = (page) => page.evaluate(() => {
  const range = document.createRange();
  range.selectNodeContents(document.querySelector("colibri-chat"));
  return [...range.getClientRects()].some((r) => r.width > 0 && r.height > 0);
});

const widgetState = (page, state, timeout = 60_000) =>
  page.waitForFunction((s) => document.querySelector("colibri-chat")?.dataset.state === s, state, { timeout });

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  fx = convertedFixture(GRID, "int4");
  coli(["convert", join(ROOT, "tests/fixtures", LONG), "-o", join(fx.modelsDir, LONG), "--quant", "int4"]);
  // The pages of other origins need their ports before the helper starts (--allow-origin).
  allowed = await startPageServer({});
  denied = await startPageServer({});
  helper = await startHelper({ modelsDir: fx.modelsDir, port: await freePort(), extra: ["--allow-origin", allowed.origin] });
  base = helper.url;
  if (process.env.E2E_WEB_FROM_DISK) {
    front = await startWebFront(helper.url);
    base = front.url;
  }
  const page = await (await fetch(`${base}/`)).text();
  if (!page.includes("app.js")) throw new Error(`${base}/ is not the chat page: the helper does not serve web/ yet (set E2E_WEB_FROM_DISK=1 to serve it from disk)`);
  browser = await launchBrowser();
});

// Pages a test opened are closed even when it fails: an open page keeps its engine, and
// that engine's hold on the browser storage, into the next test.
const open = new Set();
async function newPage() {
  const page = await browser.context.newPage();
  open.add(page);
  page.once("close", () => open.delete(page));
  return page;
}

afterEach(async () => {
  for (const page of [...open]) await page.close().catch(() => {});
});

after(async () => {
  if (browser) await browser.close();
  if (front) await front.stop();
  if (helper) await helper.stop();
  for (const s of [allowed, denied]) if (s) await s.stop();
  if (fx) fx.cleanup();
});

async function openApp(query = "", viewport = { width: 1280, height: 820 }) {
  const page = await newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e.stack || e)));
  await page.setViewportSize(viewport);
  await page.goto(`${base}/${query}`);
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  page.problems = problems;
  return page;
}

async function setSettings(page, { temperature = 1, topP = 1, maxTokens = 48, seed = 7 } = {}) {
  for (const [id, v] of [["temperature", temperature], ["top-p", topP], ["max-tokens", maxTokens], ["seed", seed]]) {
    await page.fill(`#${id}`, String(v));
    await page.dispatchEvent(`#${id}`, "change");
  }
}

// Records, in the page, every change of the last answer: its length, whether the page is
// generating, and the Brain view's step counter.
async function recordAnswer(page) {
  await page.evaluate(() => {
    window.__seen = [];
    const grid = document.getElementById("brain");
    new MutationObserver(() => {
      const last = document.querySelector('.msg[data-role="assistant"]:last-child .bubble');
      if (last) window.__seen.push({ len: last.textContent.length, state: document.body.dataset.state, steps: Number(grid.dataset.steps || 0) });
    }).observe(document.getElementById("messages"), { childList: true, subtree: true, characterData: true });
  });
}

const idle = (page) => page.waitForFunction(() => document.body.dataset.state === "ready" && !document.querySelector(".msg.streaming"), null, { timeout: 120_000 });
const canvasPixels = (page) => page.evaluate(() => document.getElementById("brain").toDataURL());

test("a message streams an answer token by token; the Brain view and the stats follow it; a reload finds the conversation", async () => {
  const page = await openApp(`?model=${GRID}`);
  assert.equal(await page.inputValue("#model"), GRID);
  assert.equal(await page.$('[data-notice="webgpu"]'), null, "this Chromium has WebGPU (SwiftShader)");
  const models = await page.$$eval("#model option", (o) => o.map((x) => x.value));
  assert.ok(models.includes(LONG) && models.includes(GRID), `the picker lists the helper's models: ${models}`);
  await setSettings(page, { maxTokens: 40 });
  const before = await canvasPixels(page);
  await recordAnswer(page);
  await page.fill("#prompt", "Tell me about **hummingbirds**");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.body.dataset.state === "generating", null, { timeout: 30_000 }).catch(() => {});
  await idle(page);

  const seen = await page.evaluate(() => window.__seen);
  const growing = seen.filter((s) => s.state === "generating" && s.len > 0).map((s) => s.len);
  assert.ok(new Set(growing).size >= 3, `the answer should grow in several steps while generating, saw lengths ${growing.join(",")}`);
  const steps = seen.filter((s) => s.state === "generating").map((s) => s.steps);
  assert.ok(steps.at(-1) > steps[0], `the Brain view should count forward passes during generation: ${steps[0]} -> ${steps.at(-1)}`);
  assert.notEqual(await canvasPixels(page), before, "the experts grid should change");
  const routed = Number(await page.getAttribute("#brain", "data-routed"));
  assert.ok(routed > 0);

  const answer = await page.textContent('.msg[data-role="assistant"] .bubble');
  assert.ok(answer.length > 0);
  assert.notEqual(await page.textContent("#stat-tps"), "—", "tokens/s is shown");
  assert.match(await page.textContent("#stat-ttft"), /\d+ ms/);
  assert.notEqual(await page.textContent("#stat-bytes"), "—");
  assert.equal(await page.textContent("#stat-recall"), "—", "the engine does not report prefetch recall yet");
  assert.match(await page.textContent('.tier-row[data-tier="helper"] .pct'), /\d+%/);
  assert.equal(await page.evaluate(() => document.activeElement.id), "prompt", "focus returns to the message box");
  await page.screenshot({ path: join(ARTIFACTS, "app-chat.png") });

  // Reload: the conversation is in the list and opens with the same text.
  await page.reload();
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  const titles = await page.$$eval("#conversations li .open span", (s) => s.map((x) => x.textContent));
  assert.ok(titles.includes("Tell me about **hummingbirds**"), `conversation list: ${titles}`);
  assert.equal(await page.textContent('.msg[data-role="user"] .bubble'), "Tell me about **hummingbirds**");
  assert.equal(await page.textContent('.msg[data-role="assistant"] .bubble'), answer);
  // The experts used before the reload are now in the browser, and the grid says so: on
  // its disk, and those the helper learned pinned in RAM at load.
  await page.waitForFunction(() => document.getElementById("brain").dataset.exact === "true", null, { timeout: 10_000 });
  const tiers = JSON.parse(await page.getAttribute("#brain", "data-tiers"));
  assert.ok(tiers.disk + tiers.ram > 0, `experts in the browser after a reload: ${JSON.stringify(tiers)}`);
  await page.screenshot({ path: join(ARTIFACTS, "app-reloaded.png") });

  // Regenerate replaces the answer; Edit resends a changed question.
  await page.click(".msg:last-child .regen");
  await idle(page);
  assert.equal(await page.locator('.msg[data-role="assistant"]').count(), 1);
  await page.click('.msg[data-role="user"] .meta button:text("Edit")');
  await page.fill(".edit-box", "And about swifts?");
  await page.keyboard.press("Enter");
  await idle(page);
  assert.deepEqual(await page.$$eval(".msg", (m) => m.map((x) => x.dataset.role)), ["user", "assistant"]);
  assert.equal(await page.textContent('.msg[data-role="user"] .bubble'), "And about swifts?");

  // Copy says what happened: "Copied" (the answer is on the clipboard), then "Copy" again;
  // "Copy failed" when the page may not write the clipboard.
  await browser.context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: base });
  const copyLabel = (want) => page.waitForFunction((w) => document.querySelector('.msg[data-role="assistant"] .copy').textContent === w, want, { timeout: 5_000 });
  await page.click('.msg[data-role="assistant"] .copy');
  await copyLabel("Copied");
  // The clipboard holds the answer's text as generated; the bubble shows it rendered as
  // Markdown, which drops leading and repeated white space (a random model's answer can
  // start with spaces), so the two are compared with white space collapsed.
  const spaced = (s) => s.replace(/\s+/g, " ").trim();
  assert.equal(
    spaced(await page.evaluate(() => navigator.clipboard.readText())),
    spaced(await page.textContent('.msg[data-role="assistant"] .bubble')),
  );
  await copyLabel("Copy");
  await browser.context.clearPermissions();
  await page.evaluate(() => { navigator.clipboard.writeText = () => Promise.reject(new Error("denied")); });
  await page.click('.msg[data-role="assistant"] .copy');
  await copyLabel("Copy failed");
  assert.deepEqual(page.problems, []);
  await page.close();
});

test("the model picker switches to another of the helper's models; the choice is remembered", async () => {
  const page = await openApp(`?backend=cpu&model=${GRID}`);
  // The Brain view has one cell per (layer, expert): 2 x 32 for GRID, 2 x 24 for LONG.
  const cells = async () => Object.values(JSON.parse((await page.getAttribute("#brain", "data-tiers")) || "{}")).reduce((a, b) => a + b, 0);
  await page.waitForFunction(() => document.getElementById("brain").dataset.tiers, null, { timeout: 10_000 });
  assert.equal(await cells(), 64);
  await page.selectOption("#model", LONG);
  await page.waitForFunction(() => document.body.dataset.state === "loading", null, { timeout: 10_000 }).catch(() => {});
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  assert.equal(await page.inputValue("#model"), LONG);
  await page.waitForFunction(() => JSON.parse(document.getElementById("brain").dataset.tiers || "{}").helper !== undefined, null, { timeout: 10_000 });
  for (let t0 = Date.now(); (await cells()) !== 48; ) {
    assert.ok(Date.now() - t0 < 10_000, `the Brain view should show ${LONG}'s 2 x 24 experts, has ${await cells()} cells`);
    await new Promise((r) => setTimeout(r, 50));
  }
  await page.click("#new-chat");
  await setSettings(page, { maxTokens: 4 });
  await page.fill("#prompt", "which model?");
  await page.keyboard.press("Enter");
  await idle(page);
  assert.ok((await page.textContent('.msg[data-role="assistant"] .bubble')).length > 0);
  const models = await page.evaluate(() => new Promise((ok, bad) => {
    const r = indexedDB.open("colibri-app");
    r.onerror = () => bad(r.error);
    r.onsuccess = () => {
      const g = r.result.transaction("conversations").objectStore("conversations").getAll();
      g.onsuccess = () => { ok(g.result.filter((c) => c.title === "which model?").map((c) => c.model)); r.result.close(); };
      g.onerror = () => bad(g.error);
    };
  }));
  assert.deepEqual(models, [LONG], "the conversation records the model it was had with");
  // Without ?model, a new page opens the model picked last.
  await page.goto(`${base}/?backend=cpu`);
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  assert.equal(await page.inputValue("#model"), LONG);
  assert.deepEqual(page.problems, []);
});

test("Esc stops an answer mid-way", async () => {
  const page = await openApp(`?model=${LONG}`);
  await page.click("#new-chat");
  await setSettings(page, { maxTokens: 2000 });
  // Press Esc from inside the page as soon as the first text of the answer shows.
  await page.evaluate(() => {
    const obs = new MutationObserver(() => {
      const last = document.querySelector('.msg[data-role="assistant"] .bubble');
      if (last && last.textContent.length > 0) {
        obs.disconnect();
        document.dispatchEvent(new KeyboardEvent("keydown", { key: "Escape", bubbles: true }));
      }
    });
    obs.observe(document.getElementById("messages"), { childList: true, subtree: true, characterData: true });
  });
  await page.fill("#prompt", "Write a very long story");
  await page.click("#send");
  await idle(page);
  const meta = await page.textContent('.msg[data-role="assistant"] .meta');
  assert.match(meta, /stopped/);
  assert.doesNotMatch(meta, /length limit/);
  const stats = await page.evaluate(() => ({ tps: document.getElementById("stat-tps").textContent }));
  assert.ok(stats.tps);
  assert.equal(await page.isVisible("#send"), true, "Send is back");
  assert.equal(await page.isHidden("#stop"), true);
  await page.screenshot({ path: join(ARTIFACTS, "app-stopped.png") });
  await page.close();
});

test("model text with HTML is shown as text, never run", async () => {
  const page = await openApp(`?model=${GRID}`);
  const evil = "Hi <script>window.__pwned = 1</script> and <img src=x onerror=\"window.__pwned = 2\"> [x](javascript:window.__pwned=3)\n\n```html\n<script>alert(1)</script>\n```\n\n**bold** `<b>code</b>`";
  const r = await page.evaluate(async (text) => {
    const { renderMarkdown } = await import("/markdown.js");
    const host = document.createElement("div");
    host.className = "bubble";
    host.id = "md-probe";
    host.append(renderMarkdown(text));
    document.getElementById("messages").append(host);
    await new Promise((ok) => setTimeout(ok, 300));
    const all = [...host.querySelectorAll("*")];
    return {
      tags: [...new Set(all.map((e) => e.tagName.toLowerCase()))].sort(),
      handlers: all.flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith("on")),
      hrefs: [...host.querySelectorAll("a")].map((a) => a.getAttribute("href")),
      text: host.textContent,
      pwned: window.__pwned ?? null,
    };
  }, evil);
  for (const bad of ["script", "img", "iframe", "b"]) assert.ok(!r.tags.includes(bad), `a <${bad}> element was created: ${r.tags}`);
  assert.deepEqual(r.handlers, []);
  assert.deepEqual(r.hrefs, [], "javascript: links stay text");
  assert.ok(r.text.includes("<script>window.__pwned = 1</script>"), r.text);
  assert.ok(r.text.includes('<img src=x onerror="window.__pwned = 2">'));
  assert.ok(r.text.includes("<script>alert(1)</script>"), "code blocks keep their text");
  assert.ok(r.tags.includes("strong") && r.tags.includes("code") && r.tags.includes("pre"), `Markdown still renders: ${r.tags}`);
  assert.equal(r.pwned, null);
  await page.locator("#md-probe").screenshot({ path: join(ARTIFACTS, "app-markdown-safety.png") });

  // And ordinary Markdown keeps its structure.
  const shape = await page.evaluate(async () => {
    const { renderMarkdown } = await import("/markdown.js");
    const d = document.createElement("div");
    d.append(renderMarkdown("# T\n- a\n- b **c**\n  - d\n\n1. x\n\n> q\n\nsee [docs](https://example.com/x) or snake_case_name"));
    const q = (s) => [...d.querySelectorAll(s)].map((e) => e.textContent);
    return { h1: q("h1"), li: q("ul > li").length, nested: q("li > ul > li"), ol: q("ol > li"), quote: q("blockquote"), href: d.querySelector("a")?.href, em: q("em") };
  });
  assert.deepEqual(shape, { h1: ["T"], li: 3, nested: ["d"], ol: ["x"], quote: ["q"], href: "https://example.com/x", em: [] });

  // Tables: header, alignment, inline Markdown in cells, an escaped pipe; HTML stays text.
  const table = await page.evaluate(async () => {
    const { renderMarkdown } = await import("/markdown.js");
    const d = document.createElement("div");
    d.append(renderMarkdown("Sums:\n\n| a | b | a + b |\n|:--|:-:|--:|\n| 47 | **38** | 85 |\n| x \\| y | <b>z</b> |\n\nafter | not a table"));
    const rows = [...d.querySelectorAll("table tr")].map((r) => [...r.children].map((c) => `${c.tagName}:${c.textContent}:${c.style.textAlign}`));
    return { rows, strong: d.querySelector("td strong")?.textContent, b: d.querySelectorAll("b").length, paras: [...d.querySelectorAll("p")].map((p) => p.textContent) };
  });
  assert.deepEqual(table, {
    rows: [["TH:a:left", "TH:b:center", "TH:a + b:right"], ["TD:47:left", "TD:38:center", "TD:85:right"], ["TD:x | y:left", "TD:<b>z</b>:center", "TD::right"]],
    strong: "38", b: 0, paras: ["Sums:", "after | not a table"],
  });

  // The same text as a stored answer, through the app's own rendering path.
  await page.evaluate((text) => {
    const now = Date.now();
    const conv = { id: "cxss", title: "xss", model: "qwen3_moe", created: now, updated: now, messages: [{ role: "user", content: "<b>hi</b>" }, { role: "assistant", content: text }] };
    localStorage.setItem("colibri.conversations.v1", JSON.stringify([conv]));
    localStorage.setItem("colibri.active.v1", JSON.stringify("cxss"));
  }, evil);
  await page.reload();
  await page.waitForSelector('.msg[data-role="assistant"]');
  await page.waitForTimeout(300);
  const inApp = await page.evaluate(() => ({
    n: document.querySelectorAll("#messages script, #messages img, #messages b").length,
    user: document.querySelector('.msg[data-role="user"] .bubble').textContent,
    pwned: window.__pwned ?? null,
  }));
  assert.deepEqual(inApp, { n: 0, user: "<b>hi</b>", pwned: null });
  await page.close();
});

test("the widget answers on a page of an allowed origin; New chat forgets the conversation", async () => {
  allowed.setPage("/", widgetPage(`${base}/widget.js`, `model="${GRID}" placeholder="Ask the widget" theme="dark"`));
  const page = await newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e)));
  // Records the conversations the widget hands its engine's worker (what the model sees).
  await page.addInitScript(() => {
    window.__prompts = [];
    const post = Worker.prototype.postMessage;
    Worker.prototype.postMessage = function (m, ...rest) {
      if (m?.op === "chatPrompt") window.__prompts.push(m.args.messages.map((x) => x.content));
      return post.call(this, m, ...rest);
    };
  });
  await page.setViewportSize({ width: 900, height: 760 });
  await page.goto(`${allowed.url}/`);
  await widgetState(page, "ready", 120_000);
  assert.equal(await page.getAttribute("colibri-chat textarea", "placeholder"), "Ask the widget");
  assert.equal(await fallbackShown(page), false, "the fallback text hides once the widget runs");
  const answered = (n) => page.waitForFunction((n) => {
    const w = document.querySelector("colibri-chat");
    const a = w.shadowRoot.querySelectorAll('.msg[data-role="assistant"] .bubble');
    return w.dataset.state === "ready" && a.length === n && a[n - 1].textContent.length > 0;
  }, n, { timeout: 120_000 });
  await page.fill("colibri-chat textarea", "Hello from another site");
  await page.press("colibri-chat textarea", "Enter");
  await answered(1);
  await page.screenshot({ path: join(ARTIFACTS, "app-widget.png") });

  // New chat: the box empties, and the next question is sent without the old turns.
  await page.click("colibri-chat button.new");
  assert.equal(await page.evaluate(() => document.querySelector("colibri-chat").shadowRoot.querySelectorAll(".msg").length), 0);
  await page.fill("colibri-chat textarea", "A second question");
  await page.press("colibri-chat textarea", "Enter");
  await answered(1);
  const roles = await page.evaluate(() => [...document.querySelector("colibri-chat").shadowRoot.querySelectorAll(".msg")].map((m) => m.dataset.role));
  assert.deepEqual(roles, ["user", "assistant"]);
  assert.deepEqual(await page.evaluate(() => window.__prompts), [["Hello from another site"], ["A second question"]]);
  assert.deepEqual(problems, []);
  await page.close();
});

test("the widget says when the helper is not running, with the command that starts it", async () => {
  const deadPort = await freePort();
  const dead = `http://127.0.0.1:${deadPort}`;
  // The site hosts its own copy of the widget (docs/widget.md), so it runs without the helper.
  allowed.setPage("/widget.js", readFileSync(join(ROOT, "web/widget.js")), "text/javascript");
  allowed.setPage("/markdown.js", readFileSync(join(ROOT, "web/markdown.js")), "text/javascript");
  allowed.setPage("/down", widgetPage("/widget.js", `model="${GRID}" helper="${dead}"`));
  // The snippet that loads widget.js from the helper itself: nothing can run, the
  // element's fallback text is what visitors see.
  allowed.setPage("/down-script", widgetPage(`${dead}/widget.js`, `model="${GRID}"`));
  const page = await newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e)));
  let message = null;
  await page.exposeFunction("__error", (m) => (message = m));
  await page.addInitScript(() => document.addEventListener("colibri-error", (e) => window.__error(e.detail.message)));
  await page.goto(`${allowed.url}/down`);
  await widgetState(page, "error");
  const msg = await page.textContent("colibri-chat .error");
  assert.match(msg, new RegExp(`helper is not running at ${dead.replace(/\./g, "\\.")}`), msg);
  assert.ok(msg.includes(`coli serve --port ${deadPort} --allow-origin ${allowed.origin}`), msg);
  assert.ok(message && message.includes("is not running"), `colibri-error event: ${message}`);
  assert.equal(await fallbackShown(page), false);
  await page.screenshot({ path: join(ARTIFACTS, "app-widget-down.png") });

  // The helper starts on that port: "Try again" loads the model.
  const late = await startHelper({ modelsDir: fx.modelsDir, port: deadPort, extra: ["--allow-origin", allowed.origin] });
  try {
    await page.click("colibri-chat .error button");
    await widgetState(page, "ready", 120_000);
    assert.equal(await page.$("colibri-chat .error"), null);
  } finally {
    await page.close();
    await late.stop();
  }

  const page2 = await newPage();
  await page2.goto(`${allowed.url}/down-script`);
  await page2.waitForTimeout(1000);
  assert.equal(await page2.evaluate(() => !!customElements.get("colibri-chat")), false);
  assert.equal(await fallbackShown(page2), true, "the element's fallback text shows");
  assert.ok((await page2.textContent("colibri-chat")).includes(FALLBACK));
  assert.deepEqual(problems, []);
});

test("a page of an origin that is not allowed gets the widget, which says which flag to add", async () => {
  denied.setPage("/", widgetPage(`${base}/widget.js`, `model="${GRID}"`));
  // The helper refuses the origin everything but the widget's own code.
  const api = await fetch(`${base}/api/models`, { headers: { Origin: denied.origin } });
  assert.equal(api.status, 403);
  assert.equal(api.headers.get("access-control-allow-origin"), null);
  const widget = await fetch(`${base}/widget.js`, { headers: { Origin: denied.origin } });
  assert.equal(widget.status, 200);
  assert.equal(widget.headers.get("access-control-allow-origin"), "*");
  const page = await newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e)));
  await page.goto(`${denied.url}/`);
  await widgetState(page, "error");
  const msg = await page.textContent("colibri-chat .error");
  assert.ok(msg.includes(`This site is not allowed: start coli with --allow-origin ${denied.origin}`), msg);
  const port = new URL(base).port;
  assert.ok(msg.includes(`coli serve${port === "7878" ? "" : ` --port ${port}`} --allow-origin ${denied.origin}`), msg);
  // The page still cannot read anything from the helper.
  const read = await page.evaluate((u) => fetch(`${u}/api/models`).then(() => "read", () => "refused"), base);
  assert.equal(read, "refused");
  const file = await page.evaluate((u) => fetch(`${u}/models/${"qwen3_moe"}/colibri.json`).then(() => "read", () => "refused"), base);
  assert.equal(file, "refused");
  assert.deepEqual(problems, []);
  await page.screenshot({ path: join(ARTIFACTS, "app-widget-refused.png") });
  await page.close();
});

test("conversations are kept in IndexedDB, renamed, exported as JSON and Markdown, deleted; the theme toggle overrides the system", async () => {
  const page = await openApp(`?model=${GRID}&backend=cpu`);
  await page.click("#new-chat");
  await setSettings(page, { maxTokens: 4 });
  await page.fill("#prompt", "first words");
  await page.keyboard.press("Enter");
  await idle(page);
  const stored = () => page.evaluate(() => new Promise((ok, bad) => {
    const r = indexedDB.open("colibri-app");
    r.onerror = () => bad(r.error);
    r.onsuccess = () => {
      const g = r.result.transaction("conversations").objectStore("conversations").getAll();
      g.onsuccess = () => { ok(g.result.map((c) => c.title)); r.result.close(); };
      g.onerror = () => bad(g.error);
    };
  }));

  // Rename: the list shows the new name, a reload keeps it.
  await page.click("#conversations li.active .ren");
  await page.fill("#conversations .rename-box", "My renamed chat");
  await page.press("#conversations .rename-box", "Enter");
  assert.equal(await page.textContent("#conversations li.active .open span"), "My renamed chat");
  // The write to IndexedDB is asynchronous: a reload before it commits would lose it.
  for (let t0 = Date.now(); !(await stored()).includes("My renamed chat"); ) {
    assert.ok(Date.now() - t0 < 30_000, "the renamed conversation never reached IndexedDB");
    await new Promise((r) => setTimeout(r, 50));
  }
  await page.reload();
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  assert.equal(await page.textContent("#conversations li.active .open span"), "My renamed chat");

  // Export: real downloads of the open conversation.
  const download = async (id) => {
    const [d] = await Promise.all([page.waitForEvent("download"), page.click(id)]);
    return { name: d.suggestedFilename(), text: readFileSync(await d.path(), "utf8") };
  };
  const md = await download("#export-md");
  assert.equal(md.name, "My-renamed-chat.md");
  assert.ok(md.text.startsWith("# My renamed chat\n"), md.text);
  assert.ok(md.text.includes("**You:**\n\nfirst words\n"), md.text);
  assert.ok(md.text.includes("**colibri:**"), md.text);
  const json = await download("#export-json");
  assert.equal(json.name, "My-renamed-chat.json");
  const conv = JSON.parse(json.text);
  assert.equal(conv.title, "My renamed chat");
  assert.equal(conv.model, GRID);
  assert.deepEqual(conv.messages.map((m) => m.role), ["user", "assistant"]);
  assert.equal(conv.messages[0].content, "first words");

  // Theme: system -> light -> dark -> system; the choice survives a reload.
  const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const theme = () => page.evaluate(() => document.documentElement.dataset.theme ?? "system");
  assert.equal(await theme(), "system");
  await page.click("#theme");
  assert.equal(await theme(), "light");
  assert.equal(await bg(), "rgb(247, 247, 245)");
  await page.click("#theme");
  assert.equal(await theme(), "dark");
  assert.equal(await bg(), "rgb(21, 23, 26)");
  await page.reload();
  assert.equal(await theme(), "dark");
  assert.equal(await bg(), "rgb(21, 23, 26)");
  await page.click("#theme");
  assert.equal(await theme(), "system");

  // Kept in IndexedDB (not localStorage); deleting removes it there too.
  assert.ok((await stored()).includes("My renamed chat"));
  assert.equal(await page.evaluate(() => localStorage.getItem("colibri.conversations.v1")), null);
  await page.click("#conversations li.active .del");
  await page.waitForFunction(() => ![...document.querySelectorAll("#conversations .open span")].some((s) => s.textContent === "My renamed chat"));
  await page.reload();
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  assert.ok(!(await stored()).includes("My renamed chat"));
  assert.deepEqual(page.problems, []);
  await page.close();
});

test("clearing the model's cached experts empties the browser tier and reloads the model", async () => {
  // The CPU backend: `auto` would fetch a few experts again while it times both backends.
  const page = await openApp(`?model=${GRID}&backend=cpu`);
  await page.click("#new-chat");
  await setSettings(page, { maxTokens: 8 });
  await page.fill("#prompt", "warm the cache");
  await page.keyboard.press("Enter");
  await idle(page);
  const dirs = () => page.evaluate(async () => {
    const top = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri");
    const out = [];
    for await (const [name, h] of top.entries()) {
      const d = await top.getDirectoryHandle(name);
      const f = await (await d.getFileHandle("experts.bin")).getFile().catch(() => null);
      out.push({ name, bytes: f ? f.size : -1, modified: f ? f.lastModified : 0, kind: h.kind });
    }
    return out;
  });
  const cleared = Date.now();
  await page.click("#clear-cache");
  await page.waitForSelector('[data-notice="cache"]', { timeout: 60_000 });
  assert.match(await page.textContent('[data-notice="cache"]'), /Cleared/);
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  // The reload pins the experts the helper learned (GET /api/usage) and stores them again,
  // in a new file: nothing else.
  const learned = await (await fetch(`${helper.url}/api/usage/${GRID}`)).json();
  const manifest = JSON.parse(readFileSync(join(fx.modelsDir, GRID, "colibri.json"), "utf8"));
  const pinned = learned.counts.length * manifest.experts.layers[0].experts[0].length;
  const after = (await dirs()).filter((d) => d.name.startsWith(`${GRID}-`));
  assert.ok(after.length <= 1 && after.every((d) => d.bytes <= 0 || (d.bytes <= pinned && d.modified >= cleared - 1000)),
    `the model's expert file should hold only the learned pins, written after the clear: ${JSON.stringify({ after, pinned, cleared })}`);
  assert.match(await page.textContent("#storage"), /used of/);
  await page.screenshot({ path: join(ARTIFACTS, "app-cleared.png") });
  await page.close();
});

test("low browser storage is shown with usage and quota, and offers to clear the model's experts", async () => {
  const page = await newPage();
  // A quota just above what this origin uses (Chromium's CDP quota override does not
  // reach navigator.storage.estimate() here, so the page's estimate is wrapped).
  await page.addInitScript(() => {
    const real = StorageManager.prototype.estimate;
    StorageManager.prototype.estimate = async function () {
      const e = await real.call(this);
      return { ...e, quota: e.usage + 64 * 1024 };
    };
  });
  await page.goto(`${base}/?model=${GRID}`);
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  await page.waitForSelector('[data-notice="quota"]', { timeout: 30_000 });
  const text = await page.textContent('[data-notice="quota"]');
  assert.match(text, /almost full/);
  assert.match(text, /used of/);
  assert.match(await page.textContent('[data-notice="quota"] button'), new RegExp(`Clear ${GRID}`));
  assert.match(await page.getAttribute("#storage .meter", "class"), /low/);
  // This model's share of it (the disk tier's budget), and persistence only when asked:
  // a button, which calls navigator.storage.persist(); then either granted (the button
  // goes) or a notice says the browser declined.
  await page.waitForFunction(() => /at most/.test(document.getElementById("disk-tier").textContent), null, { timeout: 30_000 });
  assert.equal(await page.evaluate(() => navigator.storage.persisted()), false, "nothing asked for persistence on load");
  assert.equal(await page.isVisible("#persist"), true);
  await page.click("#persist");
  await page.waitForFunction(() => document.getElementById("persist").hidden || document.querySelector('[data-notice="persist"]'), null, { timeout: 30_000 });
  await page.screenshot({ path: join(ARTIFACTS, "app-quota-low.png") });
});

test("without WebGPU the page says that the model runs on the CPU backend", async () => {
  const page = await newPage();
  await page.addInitScript(() => Object.defineProperty(Navigator.prototype, "gpu", { get: () => undefined, configurable: true }));
  await page.goto(`${base}/?model=${GRID}`);
  await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
  const text = await page.textContent('[data-notice="webgpu"]');
  assert.match(text, /No WebGPU/);
  assert.match(text, /CPU backend/);
  assert.equal(await page.textContent("#backend"), "CPU · wasm");
  // The chat page is cross-origin isolated, so the CPU backend gets a thread per core (at most 8).
  const { isolated, cores } = await page.evaluate(() => ({ isolated: self.crossOriginIsolated, cores: navigator.hardwareConcurrency }));
  assert.equal(isolated, true);
  const title = await page.getAttribute("#backend", "title");
  assert.match(title, cores > 1 ? new RegExp(`computes on ${Math.min(cores, 8)} threads`) : /computes on one thread/);
  await page.screenshot({ path: join(ARTIFACTS, "app-no-webgpu.png") });
  await page.close();
});

test("narrow screens: no sideways scrolling, drawers open from the header", async () => {
  const page = await openApp(`?model=${GRID}`, { width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `page is ${overflow}px wider than the screen`);
  await page.screenshot({ path: join(ARTIFACTS, "app-narrow.png") });
  await page.click("#toggle-panel");
  await page.waitForTimeout(400);
  assert.equal(await page.getAttribute("#toggle-panel", "aria-expanded"), "true");
  await page.screenshot({ path: join(ARTIFACTS, "app-narrow-panel.png") });
  await page.click("#panel .close-drawer");
  assert.equal(await page.getAttribute("#toggle-panel", "aria-expanded"), "false");
  await page.click("#toggle-sidebar");
  await page.waitForTimeout(400);
  await page.screenshot({ path: join(ARTIFACTS, "app-narrow-sidebar.png") });
  await page.close();
});

test("the page says so when the helper goes away, and how to start it", async () => {
  // A helper of its own, so stopping it does not disturb the other tests.
  const port = await freePort();
  let own = await startHelper({ modelsDir: fx.modelsDir, port });
  let ownFront = process.env.E2E_WEB_FROM_DISK ? await startWebFront(own.url) : null;
  const page = await newPage();
  try {
    await page.goto(`${ownFront ? ownFront.url : own.url}/?model=${GRID}`);
    await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
    await own.stop();
    await page.waitForSelector('[data-notice="helper"]', { timeout: 30_000 });
    const text = await page.textContent('[data-notice="helper"]');
    assert.match(text, /not reachable/);
    // The command that starts a helper where this page looks for one: its port.
    const pagePort = new URL(page.url()).port;
    assert.ok(text.includes(`coli serve --port ${pagePort}`), text);
    assert.ok(text.includes(`./tools/start.sh --port ${pagePort}`), text);
    await page.screenshot({ path: join(ARTIFACTS, "app-helper-down.png") });
    own = await startHelper({ modelsDir: fx.modelsDir, port });
    await page.waitForSelector('[data-notice="helper"]', { state: "detached", timeout: 30_000 });
  } finally {
    await page.close();
    if (ownFront) await ownFront.stop();
    await own.stop();
  }
});
