// Times the wasm int4 one-position kernel (decode's) in V8: GB of weights per second, best
// and median of 15 timings. Every export named run* is a variant (add one to src/lib.rs or
// src/variants.rs to compare a kernel change; they run interleaved; run_b* must print
// run's checksum, run_x* are ablations with wrong results on purpose).
//   (cd tools/bench/qdot-wasm && RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
//      cargo build --release --target wasm32-unknown-unknown) && \
//   ROWS=16384 ITERS=4 node --experimental-wasm-relaxed-simd tools/bench/qdot-wasm/run.mjs [WASM]
// In node the time is this process's CPU time (less disturbed by other load than wall
// time). CHROMIUM=/usr/bin/chromium runs the same loop in that headless Chromium's V8 (the
// JIT the browser engine really gets; wall time there), driven by playwright-core from
// tests/e2e/node_modules or tools/bench/node_modules; CHROMIUM_ARGS adds Chromium flags
// (e.g. "--js-flags=--no-liftoff"). run_many* time the many-position (prefill) kernel on 16
// positions: their GB/s count each row once, so multiply by 16 for row-positions.
// GROUP: the group (default 32; the run_b/run_c/run_x variants are for int4 group 32 only).
// INT8=1: int8 rows instead of int4 (the variants return 0). FP8=1: FP8 rows (blocks of
// 128, quantized as a release's) through the engine's matmul (`kernels::fp8_wasm`), the
// export `matmul` alone; FP8=2 the same with uniformly random bytes (more subnormal codes);
// MXFP4=1 MXFP4 rows the same way.
// The module also exports `check` (the engine's kernel check: products compared, 0 on a
// difference; `check_msg` / `check_msg_len` give the difference as UTF-8 in its memory).
// ROWS int4 rows of 2048 values (16384: 18.9 MB, from memory; 512: 0.6 MB, in L2); ALL=1
// prints every timing; ONLY=REGEX times only the exports it matches (e.g.
// ONLY='^run$|engine'). Both regimes matter: a change can win in L2 and lose from memory.
import { readFileSync, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const path = process.argv[2] ?? new URL("target/wasm32-unknown-unknown/release/qdot_wasm_bench.wasm", import.meta.url);
const wasm = readFileSync(path);
const opts = { only: process.env.ONLY ?? "", mat: process.env.MXFP4 === "1" ? 3 : Number(process.env.FP8 ?? 0), int8: process.env.INT8 === "1", group: Number(process.env.GROUP ?? 32), rows: Number(process.env.ROWS ?? 16384), iters: Number(process.env.ITERS ?? 4), all: !!process.env.ALL };

// Runs where it is called (node or the page): returns the report lines.
async function bench(bytes, { only, mat, int8, group, rows, iters, all }, cpu) {
  const module = await WebAssembly.compile(bytes);
  // The engine links wasm-bindgen; nothing timed here calls JavaScript: stubs that fail loudly.
  const imports = {};
  for (const i of WebAssembly.Module.imports(module)) {
    if (i.kind !== "function") throw new Error(`unexpected import ${i.module}.${i.name} (${i.kind})`);
    (imports[i.module] ??= {})[i.name] = () => {
      throw new Error(`called ${i.module}.${i.name}`);
    };
  }
  const e = (await WebAssembly.instantiate(module, imports)).exports;
  const size = mat ? e.setup_mat(rows, 2048, mat - 1) : e.setup(rows, 2048, group, int8 ? 1 : 0);
  const kernels = Object.keys(e)
    .filter((k) => (mat ? /^matmul$/ : /^run/).test(k) && (!only || new RegExp(only).test(k)))
    .sort();
  for (const k of kernels) e[k](2);
  const gbs = (t) => (iters * size) / t / 1e9;
  const times = Object.fromEntries(kernels.map((k) => [k, []]));
  const checks = {};
  for (let i = 0; i < 15; i++) {
    for (const k of kernels) {
      const t0 = cpu();
      checks[k] = e[k](iters) >>> 0;
      times[k].push(cpu() - t0);
    }
  }
  const out = [];
  for (const k of kernels) {
    const t = times[k].sort((a, b) => a - b);
    if (all) out.push(`${k} ${t.map((x) => gbs(x).toFixed(2)).join(" ")}`);
    out.push(JSON.stringify({ kernel: k, bytes: size, checksum: checks[k], gb_per_s_best: gbs(t[0]), gb_per_s_median: gbs(t[7]) }));
  }
  return out;
}

let lines;
if (process.env.CHROMIUM) {
  const root = fileURLToPath(new URL("../../../", import.meta.url));
  const pw = [`${root}tests/e2e/node_modules/playwright-core/index.mjs`, `${root}tools/bench/node_modules/playwright-core/index.mjs`].find(existsSync);
  if (!pw) throw new Error("playwright-core not found: npm ci in tests/e2e");
  const { chromium } = await import(pw);
  const args = process.env.CHROMIUM_ARGS ? process.env.CHROMIUM_ARGS.split(" ") : [];
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, headless: true, args });
  const page = await browser.newPage();
  page.setDefaultTimeout(0);
  lines = await page.evaluate(
    async ([src, b64, o]) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const f = (0, eval)(`(${src})`);
      return f(bytes, o, () => performance.now() / 1e3);
    },
    [bench.toString(), wasm.toString("base64"), opts],
  );
  await browser.close();
} else {
  const cpu = () => {
    const c = process.cpuUsage();
    return (c.user + c.system) / 1e6;
  };
  lines = await bench(wasm, opts, cpu);
}
for (const l of lines) console.log(l);
