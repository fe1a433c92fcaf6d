// Draft models in the browser (load({draft}) / engine.loadDraft, generate({draft: "model"})):
// the target is the demo checkpoint converted to f32 (models/demo-hf), the draft the
// committed int8 demo (models/demo, the same tokenizer), as helper/tests/it/draft_cli.rs has
// them natively. The tokens are those of a run without drafts and of `coli generate
// --draft DIR`, greedy and sampled, and stats().speculation counts what `coli generate
// --json` counts; on WebGPU (the draft on the cpu backend) the greedy tokens are the
// same. A draft with another tokenizer is refused with the native message.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { ROOT, ARTIFACTS, coli, freePort, startHelper, launchBrowser } from "./harness.mjs";

const DEMO = join(ROOT, "models/demo");
const PROMPTS = ["What is 47 + 38?", "Tell me a story."].map((q) => `<|im_start|>user\n${q}<|im_end|>\n<|im_start|>assistant\n`);
const NEW = 40;
let dir, target, other, helper;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  dir = mkdtempSync(join(tmpdir(), "colibri-e2e-draft-"));
  target = join(dir, "demo-f32");
  other = join(dir, "qwen3_moe");
  coli(["convert", join(ROOT, "models/demo-hf"), "-o", target, "--quant", "f32"]);
  coli(["convert", join(ROOT, "tests/fixtures/qwen3_moe"), "-o", other, "--quant", "int8"]);
  // Serves demo-f32 and qwen3_moe from the directory, and the built-in demo.
  helper = await startHelper({ modelsDir: dir, port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** `coli generate` on the f32 target after `prompt` (raw text, special tokens added). */
function native(prompt, extra) {
  return JSON.parse(coli(["generate", "--model", target, "--prompt", prompt, "--max-new-tokens", String(NEW), "--seed", "4", "--json", ...extra]));
}

test("a draft model in the browser: the tokens without it and of coli generate --draft", async (t) => {
  const want = PROMPTS.map((p) => {
    const greedy = native(p, ["--temperature", "0"]);
    const sampled = native(p, ["--temperature", "1"]);
    const drafted = native(p, ["--temperature", "0", "--draft", DEMO, "--speculate", "3"]);
    assert.deepEqual(drafted.ids, greedy.ids, "coli generate --draft changed a token");
    assert.ok(greedy.ids.length > 4, JSON.stringify(greedy));
    return { greedy, sampled, drafted };
  });
  // A draft of another tokenizer, natively: one line (helper/tests/it/draft_cli.rs).
  let nativeRefusal = "";
  try {
    coli(["generate", "--model", target, "--prompt", "Hello", "--max-new-tokens", "4", "--draft", other], { stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    nativeRefusal = String(e.stderr).trim();
  }
  const reason = nativeRefusal.slice(nativeRefusal.indexOf("the draft model has another tokenizer"));
  assert.match(reason, /^the draft model has another tokenizer \(\d+ tokens vs the model's \d+, \d+ differ\)/, nativeRefusal);

  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    const web = await page.evaluate(
      async ({ prompts, n }) => {
        const { load } = await import("/colibri.js");
        const engine = await load({ model: "demo-f32", backend: "cpu" });
        const refusals = {};
        refusals.none = await engine.generate({ ids: [1, 2], maxNewTokens: 2, draft: "model" }).then(() => "accepted", (e) => String(e.message));
        refusals.other = await engine.loadDraft("qwen3_moe").then(() => "accepted", (e) => String(e.message));
        const draftInfo = await engine.loadDraft({ model: "demo", ramBytes: 64 << 20 });
        const runs = [];
        for (const p of prompts) {
          const ids = await engine.encode(p, { addSpecialTokens: true });
          const gen = (o) => engine.generate({ ids, maxNewTokens: n, seed: 4, ...o });
          const r = {};
          r.plain = (await gen({ temperature: 0 })).ids;
          const d = await gen({ temperature: 0, draft: "model", speculate: 3 });
          r.drafted = d.ids;
          r.cachedTokens = d.cachedTokens;
          r.spec = engine.stats().speculation;
          r.sampled = (await gen({ temperature: 1, draft: "model" })).ids;
          r.sampledSpec = engine.stats().speculation;
          runs.push(r);
        }
        const stats = engine.stats();
        return { refusals, draftInfo, runs, draft: stats.draft, tps: stats.tokensPerSecond };
      },
      { prompts: PROMPTS, n: NEW },
    );
    t.diagnostic(`draft ${JSON.stringify(web.draft)}; speculation ${JSON.stringify(web.runs.map((r) => r.spec))}`);
    assert.match(web.refusals.none, /needs a draft model/);
    assert.ok(web.refusals.other.startsWith("draft qwen3_moe: "), web.refusals.other);
    assert.equal(web.refusals.other.slice("draft qwen3_moe: ".length), reason, "the browser refuses with the native message");
    assert.equal(web.draftInfo.model, "demo");
    assert.equal(web.draft.backend, "cpu");
    assert.ok(web.draft.bytesFetched > 0, JSON.stringify(web.draft));
    for (const [i, r] of web.runs.entries()) {
      const w = want[i];
      assert.deepEqual(r.plain, w.greedy.ids, "the browser without drafts = coli generate");
      assert.deepEqual(r.drafted, w.greedy.ids, "draft-model drafts change no token (greedy)");
      assert.deepEqual(r.sampled, w.sampled.ids, "draft-model drafts change no token (sampled)");
      assert.ok(r.cachedTokens > 0, "the conversation's cache is reused with a draft model");
      const s = w.drafted.speculation;
      assert.deepEqual(
        [r.spec.forwards, r.spec.drafted, r.spec.accepted, r.spec.produced],
        [s.forwards, s.drafted, s.accepted, s.produced],
        "the browser and coli generate --draft speculate alike",
      );
      assert.ok(r.spec.drafted > 0 && r.spec.accepted > 0 && r.spec.accepted <= r.spec.drafted, JSON.stringify(r.spec));
      assert.equal(r.spec.acceptanceRate, r.spec.accepted / r.spec.drafted);
      assert.equal(r.spec.tokensPerForward, r.spec.produced / r.spec.forwards);
      assert.ok(r.sampledSpec.drafted > 0 && r.sampledSpec.produced === r.sampled.length, JSON.stringify(r.sampledSpec));
    }
    await page.close();

    // WebGPU: the model on the GPU, the draft on the cpu backend (load({draft})).
    const page2 = await browser.context.newPage();
    await page2.goto(`${helper.url}/health`);
    const gpu = await page2.evaluate(
      async ({ prompt, n }) => {
        const { load } = await import("/colibri.js");
        let engine;
        try {
          engine = await load({ model: "demo-f32", backend: "webgpu", draft: "demo" });
        } catch (e) {
          return { skipped: String(e.message) };
        }
        const ids = await engine.encode(prompt, { addSpecialTokens: true });
        const r = await engine.generate({ ids, maxNewTokens: n, temperature: 0, draft: "model", speculate: 3 });
        const stats = engine.stats();
        return { ids: r.ids, backend: stats.backend, draft: stats.draft, spec: stats.speculation };
      },
      { prompt: PROMPTS[0], n: NEW },
    );
    t.diagnostic(`webgpu: ${JSON.stringify(gpu)}`);
    if (gpu.skipped) {
      assert.match(gpu.skipped, /WebGPU backend unavailable/);
    } else {
      assert.equal(gpu.backend, "webgpu");
      assert.equal(gpu.draft.backend, "cpu");
      assert.deepEqual(gpu.ids, want[0].greedy.ids, "WebGPU with a cpu draft = coli generate");
      assert.ok(gpu.spec.drafted > 0, JSON.stringify(gpu.spec));
    }
  } finally {
    await browser.close();
  }
});
