// Hybrid expert placement on WebGPU (SwiftShader in headless Chromium): with a GPU expert
// pool too small for a layer's experts and load({hybrid: "on"}), experts missing from the
// pool run on the wasm CPU threads while the GPU computes the others; the tokens and logit
// bits are still coli's, and stats().hybrid counts the experts computed on each side.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { ARTIFACTS, launchBrowser, nativeReference } from "./harness.mjs";

const PROMPT = [5, 17, 3, 42, 7, 99, 120, 250];
const NEW = 10;
// An int4 olmoe fixture expert is about 5 KB: two fit, the rest of each layer's misses
// are candidates for the CPU.
const POOL = 12000;
let ref;

before(async () => {
  ref = await nativeReference({ model: "olmoe", prompt: PROMPT, n: NEW, quant: "int4" });
});

after(async () => {
  if (ref) await ref.stop();
});

test("hybrid on: coli's tokens and logit bits with experts computed on the CPU and the GPU; off: none on the CPU", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const on = await ref.run(page, { backend: "webgpu", logits: true, loadOptions: { hybrid: "on", gpuPoolBytes: POOL } });
    assert.equal(on.stats.backend, "webgpu");
    ref.sameBits(on, "hybrid on");
    const h = on.stats.hybrid;
    assert.ok(h && h.mode === "on", JSON.stringify(on.stats));
    assert.ok(h.cpuExperts > 0, `no expert ran on the CPU: ${JSON.stringify(h)}`);
    assert.ok(h.gpuExperts > 0, `no expert ran on the GPU: ${JSON.stringify(h)}`);
    assert.ok(h.cpuMs > 0, `the CPU's time per expert was not measured: ${JSON.stringify(h)}`);
    console.log("hybrid on:", JSON.stringify(h), "threads", on.stats.threads);

    const off = await ref.run(page, { backend: "webgpu", logits: true, loadOptions: { hybrid: "off", gpuPoolBytes: POOL } });
    ref.sameBits(off, "hybrid off");
    assert.equal(off.stats.hybrid.cpuExperts, 0, JSON.stringify(off.stats.hybrid));

    const auto = await ref.run(page, { backend: "webgpu", loadOptions: { hybrid: "auto", gpuPoolBytes: POOL } });
    assert.deepEqual(auto.ids, ref.ids, "hybrid auto: tokens differ");
    assert.ok(auto.stats.hybrid.cpuExperts > 0, JSON.stringify(auto.stats.hybrid));

    // A bad value is refused before anything loads.
    const err = await page.evaluate(async () => {
      const { load } = await import("/colibri.js");
      return load({ model: "olmoe", backend: "webgpu", hybrid: "maybe" }).then(() => null, (e) => String(e));
    });
    assert.match(err, /unknown hybrid/);
  } finally {
    await browser.close();
  }
});

test("the Brain view marks where each expert was computed: on the CPU and on the GPU, as many uses as stats().hybrid counts", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const problems = [];
    page.on("pageerror", (e) => problems.push(String(e.stack || e)));
    await page.setViewportSize({ width: 1280, height: 820 });
    // Room for 13 experts (the fixture has 2 layers of 24): some run on the GPU, the rest
    // of each step's experts on the CPU threads.
    await page.goto(`${ref.helper.url}/?model=olmoe&backend=webgpu&hybrid=on&gpuPool=72000`);
    await page.waitForFunction(() => document.body.dataset.state === "ready", null, { timeout: 120_000 });
    // Every step's marks, as the grid counts them (cells of the last forward pass).
    await page.evaluate(() => {
      window.__marks = [];
      const grid = document.getElementById("brain");
      new MutationObserver(() => window.__marks.push(grid.dataset.placement || null)).observe(grid, { attributes: true, attributeFilter: ["data-placement"] });
    });
    // Greedy: the same tokens, so the same routes, on every run.
    for (const [id, v] of [["temperature", 0], ["seed", 7], ["max-tokens", 6]]) {
      await page.fill(`#${id}`, String(v));
      await page.dispatchEvent(`#${id}`, "change");
    }
    await page.fill("#prompt", "Where do hummingbirds live?");
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => document.body.dataset.state === "ready" && !document.querySelector(".msg.streaming") && document.querySelector('.msg[data-role="assistant"]'), null, { timeout: 300_000 });
    // The counts line under the grid is stats().hybrid (drawn from the last stats event,
    // which may trail the last route event by a frame).
    await page.waitForFunction(() => {
      const uses = JSON.parse(document.getElementById("brain").dataset.placedUses || "null");
      return uses && document.getElementById("brain-hybrid").textContent.includes(`on the GPU: ${uses.gpu}, on the CPU threads at the same time: ${uses.cpu} `);
    }, null, { timeout: 10_000 }).catch(() => {});
    const line = await page.textContent("#brain-hybrid");
    const m = line.match(/on the GPU: (\d+), on the CPU threads at the same time: (\d+) \(hybrid on\)/);
    assert.ok(m, `the hybrid line: ${line}`);
    const [gpuExperts, cpuExperts] = [Number(m[1]), Number(m[2])];
    const grid = await page.evaluate(() => ({ ...document.getElementById("brain").dataset }));
    const marks = [...new Set(await page.evaluate(() => window.__marks))].filter(Boolean).map((x) => JSON.parse(x));
    const uses = JSON.parse(grid.placedUses || "null");
    console.log("brain placement:", JSON.stringify({ marks, uses, gpuExperts, cpuExperts }));
    assert.ok(marks.length >= 2, `the grid's marks should follow the steps: ${JSON.stringify(marks)}`);
    assert.ok(marks.some((c) => c.cpu + c.both > 0 && c.gpu + c.both > 0), `no step has cells marked CPU and cells marked GPU: ${JSON.stringify(marks)}`);
    assert.ok(cpuExperts > 0 && gpuExperts > 0, line);
    // Every routed expert use was reported with its side: they add up to stats().hybrid.
    assert.deepEqual(uses, { cpu: cpuExperts, gpu: gpuExperts }, "the placements reported add up to stats().hybrid");
    // The last step's marks are drawn: pixels of each placement colour it has.
    const last = JSON.parse(grid.placement);
    const drawn = await page.evaluate(async () => {
      const { PLACE_COLORS } = await import("/brain.js");
      const c = document.getElementById("brain");
      const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      const count = (hex) => {
        const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
        let n = 0;
        for (let i = 0; i < px.length; i += 4) if (px[i] === r && px[i + 1] === g && px[i + 2] === b) n++;
        return n;
      };
      return { cpu: count(PLACE_COLORS.cpu), gpu: count(PLACE_COLORS.gpu) };
    });
    assert.equal(drawn.cpu > 0, last.cpu + last.both > 0, `CPU marks drawn: ${JSON.stringify({ drawn, last })}`);
    assert.equal(drawn.gpu > 0, last.gpu + last.both > 0, `GPU marks drawn: ${JSON.stringify({ drawn, last })}`);
    await page.locator("#brain-hybrid").scrollIntoViewIfNeeded();
    await page.screenshot({ path: join(ARTIFACTS, "hybrid-brain.png") });
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
  }
});

test("hybrid on with the experts in the disk tier: after a reload (RAM tier empty) they run on the CPU threads from OPFS, with coli's tokens", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    // No RAM tier (ramBytes 0): no expert is ever in RAM, every one comes from the disk
    // tier (OPFS) or the helper; the GPU pool holds two.
    const opts = { backend: "webgpu", logits: true, loadOptions: { hybrid: "on", gpuPoolBytes: POOL, ramBytes: 0 } };
    // The first run fetches the experts from the helper and stores them in OPFS.
    const first = await ref.run(page, opts);
    ref.sameBits(first, "hybrid on, first run");
    assert.equal(first.stats.diskKind, "opfs", JSON.stringify(first.stats));
    assert.ok(first.stats.bytesFetched > 0 && first.stats.diskExperts > 0, JSON.stringify(first.stats));
    // A new document (a new engine: RAM empty, the GPU pool empty, OPFS kept).
    const second = await ref.run(page, opts);
    ref.sameBits(second, "hybrid on, from the disk tier");
    assert.deepEqual(second.ids, first.ids);
    const s = second.stats;
    const h = s.hybrid;
    console.log("hybrid on from OPFS:", JSON.stringify({ first: first.stats.hybrid, second: h, tiers: s.tiers, events: s.tierEvents }));
    // Every expert came from OPFS (or the GPU pool): nothing from the helper, none from RAM.
    assert.equal(s.bytesFetched, 0, JSON.stringify(s));
    assert.equal(s.tiers.helper, 0, JSON.stringify(s.tiers));
    assert.equal(s.tiers.ram, 0, JSON.stringify(s.tiers));
    assert.ok(s.tiers.disk > 0 && s.tierEvents.diskHits > 0, JSON.stringify({ tiers: s.tiers, events: s.tierEvents }));
    // ... and the experts the pool lacks ran on the CPU threads, read from the disk tier.
    assert.ok(h.cpuExperts > 0, `no expert ran on the CPU from the disk tier: ${JSON.stringify(h)}`);
    assert.ok(h.gpuExperts > 0, JSON.stringify(h));
    // Without a disk tier (disk: false) the experts a layer lacks are fetched before
    // placement and wait in memory for their read: candidates too.
    const noDisk = await ref.run(page, { ...opts, loadOptions: { ...opts.loadOptions, disk: false } });
    ref.sameBits(noDisk, "hybrid on, no disk tier");
    const n = noDisk.stats;
    console.log("hybrid on without a disk tier:", JSON.stringify({ hybrid: n.hybrid, tiers: n.tiers }));
    assert.equal(n.diskEnabled, false);
    assert.ok(n.tiers.helper > 0 && n.tiers.disk === 0, JSON.stringify(n.tiers));
    assert.ok(n.hybrid.cpuExperts > 0, `no fetched expert ran on the CPU: ${JSON.stringify(n.hybrid)}`);
  } finally {
    await browser.close();
  }
});
