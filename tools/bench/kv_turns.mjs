// What saving the conversation's cache costs the browser per turn (docs/benchmarks.md
// "The browser's conversation cache, turn by turn"): a long first turn, then short turns
// that extend it, on the wasm CPU backend with browser storage on; prints each turn's wall
// time, the stored file's size after it, and the time `saveCache` took (the worker's
// generate resolves after it), as JSON.
//
//   node tools/bench/kv_turns.mjs --coli target/release/coli --models-dir DIR --model default \
//     [--prompt-tokens 512] [--turns 4] [--threads 2] [--web-dir web]
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const COLI = arg("coli", "target/release/coli");
const MODELS = arg("models-dir");
const MODEL = arg("model", "default");
const PROMPT = Number(arg("prompt-tokens", 512));
const TURNS = Number(arg("turns", 4));
const THREADS = Number(arg("threads", 2));
const WEB = arg("web-dir", "web");
const PORT = 7900 + (process.pid % 90);

const env = { ...process.env, COLIBRI_WEB_DIR: WEB };
const child = spawn(COLI, ["serve", "--port", String(PORT), "--models-dir", MODELS], { stdio: "ignore", env });
const url = `http://127.0.0.1:${PORT}`;
for (let i = 0; i < 300; i++) {
  try {
    if ((await fetch(`${url}/health`)).ok) break;
  } catch (_) {}
  await new Promise((r) => setTimeout(r, 100));
}
const profile = mkdtempSync(join(tmpdir(), "colibri-kv-turns-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
});
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(30 * 60 * 1000);
  await page.goto(`${url}/health`);
  const turns = await page.evaluate(
    async ({ model, prompt, turns, threads }) => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model, backend: "cpu", ramBytes: 3 * 2 ** 30, diskBytes: 2 ** 26, threads });
      const size = async () => {
        const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri-kv");
        let n = 0;
        for await (const [, h] of dir.entries()) n += (await h.getFile()).size;
        return n;
      };
      let ids = Array.from({ length: prompt }, (_, i) => 100 + ((i * 7919) % 20000));
      const out = [];
      for (let t = 0; t < turns; t++) {
        const t0 = performance.now();
        const r = await engine.generate({ ids, maxNewTokens: 4, temperature: 0, ignoreEos: true });
        const ms = performance.now() - t0;
        const s = engine.stats();
        // What the engine computed: the first token, then the rest at its decode rate; the
        // rest of the turn is the worker's (mostly `saveCache`).
        const compute = s.ttftMs + ((r.ids.length - 1) * 1000) / s.tokensPerSecond;
        out.push({ turn: t + 1, ids: ids.length, ms, compute_ms: compute, other_ms: ms - compute, file_bytes: await size() });
        ids = [...ids, ...r.ids, 5, 6, 7, 8];
      }
      return out;
    },
    { model: MODEL, prompt: PROMPT, turns: TURNS, threads: THREADS },
  );
  console.log(JSON.stringify({ bench: "kv_turns", model: MODEL, prompt_tokens: PROMPT, threads: THREADS, turns }));
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
  child.kill("SIGTERM");
}
