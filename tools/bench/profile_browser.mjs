// Where colibri's browser engine spends its time: V8's sampling profiler, read from a
// Chromium trace (which, unlike a page's CDP session, also samples the engine's Web Worker
// and its thread-pool workers). Prints self time per function (wasm functions by their Rust
// names), most first. A developer tool, not a benchmark: timings are whatever the machine gives.
//
//   node tools/bench/profile_browser.mjs --coli target/release/coli --models-dir DIR --model NAME
//        [--threads 1] [--prompt-tokens 32] [--decode-tokens 4] [--vocab 50304] [--top 25] [--trace OUT.json]
//        [--web-dir DIR]   (serve web/ from DIR instead of coli's built-in copy: COLIBRI_WEB_DIR)
//
// The model is loaded (backend "cpu", RAM budget 3 GiB, no OPFS) and warmed until every expert
// is in RAM (warm.mjs); only the measured generation is traced.
import { spawn } from "node:child_process";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { warmAll } from "./warm.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const [coli, modelsDir, model] = [arg("coli"), arg("models-dir"), arg("model")];
if (!coli || !modelsDir || !model) {
  console.error("usage: profile_browser.mjs --coli BIN --models-dir DIR --model NAME [--threads N]");
  process.exit(2);
}
const threads = Number(arg("threads", 1));
const prompt = Number(arg("prompt-tokens", 32));
const decode = Number(arg("decode-tokens", 4));
const top = Number(arg("top", 25));
const dir = mkdtempSync(join(tmpdir(), "colibri-profile-"));
const tracePath = arg("trace", join(dir, "trace.json"));

const env = arg("web-dir") ? { ...process.env, COLIBRI_WEB_DIR: arg("web-dir") } : process.env;
const child = spawn(coli, ["serve", "--port", "0", "--models-dir", modelsDir], { stdio: ["ignore", "pipe", "pipe"], env });
const url = await new Promise((ok, bad) => {
  let log = "";
  const seen = (d) => {
    log += d;
    const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
    if (m) ok(`http://127.0.0.1:${m[1]}`);
  };
  child.stdout.on("data", seen);
  child.stderr.on("data", seen);
  child.on("exit", (c) => bad(new Error(`coli serve exited (${c}): ${log}`)));
});
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true, args: ["--no-sandbox", ...(process.env.CHROMIUM_ARGS ?? "").split(" ").filter(Boolean)] });
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(900_000);
  for (let i = 0; i < 50; i++) {
    try {
      await page.goto(`${url}/health`);
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  // Prompt ids as `coli bench` makes them, below the model's vocabulary size.
  const vocab = Number(arg("vocab", 50304));
  const ids = Array.from({ length: prompt }, (_, i) => Number((((BigInt(i) * 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn) >> 17n) % BigInt(vocab)));
  await page.evaluate(
    async ({ model, threads }) => {
      const { load } = await import("/colibri.js");
      window.engine = await load({ model, backend: "cpu", ramBytes: 3 * 2 ** 30, disk: false, threads });
    },
    { model, threads },
  );
  const warm = await page.evaluate(warmAll, { ids, vocab });
  const before = (await page.evaluate(() => window.engine.stats())).tiers;
  await browser.startTracing(page, { categories: ["disabled-by-default-v8.cpu_profiler"], path: tracePath });
  const t0 = performance.now();
  await page.evaluate(
    async ({ ids, decode }) => window.engine.generate({ ids, maxNewTokens: decode + 1, temperature: 0, ignoreEos: true }),
    { ids, decode },
  );
  const ms = performance.now() - t0;
  const stats = await page.evaluate(() => window.engine.stats());
  await browser.stopTracing();
  // ProfileChunk events carry (per sampled thread) new call-tree nodes and (sample, delta) pairs.
  const { traceEvents } = JSON.parse(readFileSync(tracePath, "utf8"));
  const names = new Map();
  const self = new Map();
  for (const e of traceEvents) {
    if (e.name !== "ProfileChunk") continue;
    const key = (n) => `${e.pid}/${e.id}/${n}`;
    const d = e.args.data;
    for (const n of d.cpuProfile?.nodes ?? []) names.set(key(n.id), n.callFrame.functionName || n.callFrame.url || "?");
    (d.cpuProfile?.samples ?? []).forEach((s, i) => self.set(key(s), (self.get(key(s)) ?? 0) + (d.timeDeltas?.[i] ?? 0)));
  }
  const byName = new Map();
  for (const [k, us] of self) {
    const name = (names.get(k) ?? "?").replace(/::h[0-9a-f]{16}$/, "");
    byName.set(name, (byName.get(name) ?? 0) + us);
  }
  const busy = [...byName].filter(([n]) => n !== "(idle)");
  const total = busy.reduce((s, [, us]) => s + us, 0);
  console.log(JSON.stringify({ generate_ms: Math.round(ms), threads: stats.threads, simd: stats.simd, tokens_per_second: stats.tokensPerSecond, ttft_ms: stats.ttftMs, tiers: Object.fromEntries(Object.entries(stats.tiers).map(([k, v]) => [k, v - (before[k] ?? 0)])), warmup: warm }));
  for (const [name, us] of busy.sort((a, b) => b[1] - a[1]).slice(0, top)) {
    console.log(`${(us / 1e3).toFixed(1).padStart(9)} ms ${((100 * us) / total).toFixed(1).padStart(5)}%  ${name}`);
  }
} finally {
  await browser.close();
  child.kill("SIGTERM");
  if (!arg("trace")) rmSync(dir, { recursive: true, force: true });
}
