import assert from "node:assert/strict";
// Shared plumbing for the browser tests: a real `coli serve` on a free loopback port,
// a converted fixture model, and Debian's Chromium with WebGPU on SwiftShader.
import { spawn, execFileSync } from "node:child_process";
import http from "node:http";
import { createHash } from "node:crypto";
import { mkdtempSync, cpSync, rmSync, mkdirSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import net from "node:net";
import { chromium } from "playwright-core";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const COLI = process.env.COLI || join(ROOT, "target/release/coli");
export const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
export const ARTIFACTS = process.env.E2E_ARTIFACTS || join(ROOT, "target/e2e-artifacts");

// The helpers' data directory (KV caches on disk, usage of read-only models): one per test
// process, so that no run finds what an earlier run (or another worktree) left there.
export const DATA_HOME = mkdtempSync(join(tmpdir(), "colibri-e2e-data-"));
process.on("exit", () => rmSync(DATA_HOME, { recursive: true, force: true }));
const ENV = { ...process.env, XDG_DATA_HOME: DATA_HOME };

export function coli(args, opts = {}) {
  return execFileSync(COLI, args, { encoding: "utf8", maxBuffer: 1 << 28, env: ENV, ...opts });
}

/** Converts tests/fixtures/NAME into a fresh temporary models directory as model id NAME. */
export function convertedFixture(name, quant = "f32") {
  const dir = mkdtempSync(join(tmpdir(), "colibri-e2e-"));
  coli(["convert", join(ROOT, "tests/fixtures", name), "-o", join(dir, name), "--quant", quant]);
  return { modelsDir: dir, path: join(dir, name), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** A `coli synth` model with `synthArgs` (a vocabulary of 2048: the demo model's
 * tokenizer is copied in), converted with `--quant quant` into DIR/models/synth; returns
 * its path and its manifest. */
export function synthModel(dir, synthArgs, quant) {
  const bf16 = join(dir, "bf16");
  coli(["synth", "-o", bf16, ...synthArgs, "--vocab", "2048"]);
  // coli synth writes no tokenizer; the demo model's has the same 2048 ids.
  cpSync(join(ROOT, "models/demo/tokenizer.json"), join(bf16, "tokenizer.json"));
  const path = join(dir, "models", "synth");
  coli(["convert", bf16, "-o", path, "--quant", quant]);
  rmSync(bf16, { recursive: true, force: true });
  return { path, manifest: JSON.parse(readFileSync(join(path, "colibri.json"), "utf8")) };
}

export async function freePort() {
  return new Promise((ok, bad) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
    s.on("error", bad);
  });
}

/** Starts `coli serve` (with `env` added to its environment) and resolves once /health answers. */
export async function startHelper({ modelsDir, port, extra = [], env = {} }) {
  const child = spawn(COLI, ["serve", "--port", String(port), "--models-dir", modelsDir, ...extra], { stdio: ["ignore", "pipe", "pipe"], env: { ...ENV, ...env } });
  let log = "";
  child.stdout.on("data", (d) => (log += d));
  child.stderr.on("data", (d) => (log += d));
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`coli serve exited: ${log}`);
    try {
      const r = await fetch(`${url}/health`);
      if (r.ok) return { child, url, log: () => log, stop: () => stopChild(child) };
    } catch (_) {}
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill("SIGKILL");
  throw new Error(`coli serve did not come up: ${log}`);
}

export function stopChild(child, signal = "SIGTERM") {
  return new Promise((ok) => {
    if (child.exitCode !== null || child.signalCode) return ok();
    child.once("exit", () => ok());
    child.kill(signal);
  });
}

export const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--enable-unsafe-webgpu",
  "--enable-features=Vulkan",
  "--use-vulkan=swiftshader",
  "--use-webgpu-adapter=swiftshader",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];

/** A persistent browser profile (so OPFS survives a reload) in a temporary directory. */
export async function launchBrowser() {
  const profile = mkdtempSync(join(tmpdir(), "colibri-chromium-"));
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  return { context, close: async () => { await context.close(); rmSync(profile, { recursive: true, force: true }); } };
}

export function copyDir(src, dst) {
  cpSync(src, dst, { recursive: true });
}

/** In a fresh document of the helper at `url` (its /health, so the app does not load an
 * engine of its own; the helper's documents are cross-origin isolated): loads `model`
 * through /colibri.js and generates `n` greedy tokens after `prompt`; with `logits`, also
 * the prompt's teacher-forced logits as f32 bits. `pageUrl`: another document to run in
 * (a page of another origin), `helper` then says where colibri.js is; `loadOptions`: more
 * options for load() (e.g. {hybrid: "on"}). */
export async function generateInPage(page, url, { model, prompt, n, backend = "cpu", storage = "auto", logits = false, threads, pageUrl, loadOptions = {} }) {
  await page.goto(pageUrl || `${url}/health`);
  return page.evaluate(
    async ({ model, prompt, n, backend, storage, logits, threads, helper, loadOptions }) => {
      const { load } = await import(`${helper}/colibri.js`);
      const engine = await load({ model, backend, storage, threads, ...loadOptions });
      const g = await engine.generate({ ids: prompt, maxNewTokens: n, temperature: 0, ignoreEos: true });
      const l = logits ? Array.from(new Uint32Array((await engine.logits({ ids: prompt })).buffer)) : null;
      const tiers = Array.from(await engine.expertTiers());
      const isolated = self.crossOriginIsolated;
      return { ids: g.ids, text: g.text, logitsBits: l, stats: engine.stats(), tiers, hasGpu: !!navigator.gpu, isolated };
    },
    { model, prompt, n, backend, storage, logits, threads, helper: pageUrl ? url : "", loadOptions },
  );
}

/** Asserts a page run (generateInPage with logits) has the native ids and logit bits. */
export function assertSameBits(r, nativeIds, nativeLogits, what) {
  assert.deepEqual(r.ids, nativeIds, `${what}: greedy tokens differ from coli generate`);
  const want = Array.from(new Uint32Array(nativeLogits.buffer));
  assert.equal(r.logitsBits.length, want.length);
  const diff = r.logitsBits.findIndex((b, i) => b !== want[i]);
  assert.equal(diff, -1, `${what}: logit ${diff} differs from coli logits`);
}

/** The native run a browser test must reproduce, and a helper serving its model: converts
 * tests/fixtures/`model` (with `--quant quant`, or `convertArgs` instead), has
 * `coli generate` make `n` greedy tokens after `prompt` and `coli logits` the prompt's
 * teacher-forced logits, then starts `coli serve` over the converted model. `run(page,
 * opts)` generates the same in a page (generateInPage), `sameBits(r, what)` checks a run
 * against the native bits (assertSameBits), `stop()` ends the helper and removes the files. */
export async function nativeReference({ model, prompt, n, quant = "int8", convertArgs }) {
  mkdirSync(ARTIFACTS, { recursive: true });
  const dir = mkdtempSync(join(tmpdir(), "colibri-e2e-"));
  const path = join(dir, model);
  coli(["convert", join(ROOT, "tests/fixtures", model), "-o", path, ...(convertArgs ?? ["--quant", quant])]);
  const g = JSON.parse(coli(["generate", "--model", path, "--ids", prompt.join(","), "--max-new-tokens", String(n), "--temperature", "0", "--ignore-eos", "--json"]));
  const scratch = mkdtempSync(join(tmpdir(), "colibri-e2e-logits-"));
  const out = join(scratch, "logits.f32");
  coli(["logits", "--model", path, "--ids", prompt.join(","), "--out", out]);
  // The file's own bytes: a small file's Buffer is a view into a shared pool.
  const raw = readFileSync(out);
  const logits = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
  rmSync(scratch, { recursive: true, force: true });
  let helper;
  try {
    helper = await startHelper({ modelsDir: dir, port: await freePort() });
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  return {
    path,
    ids: g.ids,
    logits,
    helper,
    run: (page, opts) => generateInPage(page, helper.url, { model, prompt, n, ...opts }),
    sameBits: (r, what) => assertSameBits(r, g.ids, logits, what),
    stop: async () => {
      await helper.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A stand-in for the Hugging Face hub serving `dir` as repository `repo`: the file list,
 * HEAD with the LFS size and sha256, GET with Range; `requests` lists what it was asked. */
export async function startHub(repo, dir) {
  const files = Object.fromEntries(readdirSync(dir).map((f) => [f, readFileSync(join(dir, f))]));
  const requests = [];
  const server = http.createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    requests.push(`${req.method} ${path}`);
    if (path === `/api/models/${repo}/revision/main`) {
      res.writeHead(200, { "Content-Type": "application/json" });
      return res.end(JSON.stringify({ id: repo, siblings: Object.keys(files).map((f) => ({ rfilename: f })) }));
    }
    const prefix = `/${repo}/resolve/main/`;
    const body = path.startsWith(prefix) ? files[path.slice(prefix.length)] : undefined;
    if (!body) return res.writeHead(404).end();
    const sha = createHash("sha256").update(body).digest("hex");
    if (req.method === "HEAD") {
      return res.writeHead(200, { "Content-Length": body.length, "X-Linked-Size": body.length, "X-Linked-Etag": `"${sha}"` }).end();
    }
    const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range || "");
    if (!m) return res.writeHead(200, { "Content-Length": body.length }).end(body);
    const start = Number(m[1]);
    const end = m[2] ? Math.min(Number(m[2]), body.length - 1) : body.length - 1;
    res.writeHead(206, { "Content-Length": end - start + 1, "Content-Range": `bytes ${start}-${end}/${body.length}` });
    res.end(body.subarray(start, end + 1));
  });
  const port = await freePort();
  await new Promise((ok) => server.listen(port, "127.0.0.1", ok));
  return { url: `http://127.0.0.1:${port}`, requests, stop: () => new Promise((ok) => server.close(ok)) };
}
