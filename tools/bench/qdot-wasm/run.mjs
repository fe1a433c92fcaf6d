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
// KQUANT=4 or 5: Q4K or Q5K rows (GGUF Q4_K/Q5_K kept: 16-byte headers per 256 values, Q5K
// 32 bytes of fifth bits more) with their activations (`setup_k`), through the engine's
// dispatch (`run`: dot_row; `run_engine`: dot_rows). FORMATS=int4,int8,q4k,q5k times
// several kinds of rows of the same shape in one module, interleaved round by round (GROUP
// applies to int4; int8 takes group 128 unless written int8/G, e.g. int4/64,int8/32); the
// default ONLY there is '^run$|^run_engine$'. Every line gives GB/s of stored bytes and
// Gvalues/s (values of the rows per second: rows x 2048 per pass). A kernel whose first
// call returns 0 (a variant not written for those rows) is left out. FORM=32 (or 16, the
// default) sets the relaxed one-position kernels' summing form (qdot::wasm_form).
// The module also exports `check` (the engine's kernel check: products compared, 0 on a
// difference; `check_msg` / `check_msg_len` give the difference as UTF-8 in its memory).
// ROWS int4 rows of 2048 values (16384: 18.9 MB, from memory; 512: 0.6 MB, in L2); ALL=1
// prints every timing; ONLY=REGEX times only the exports it matches (e.g.
// ONLY='^run$|engine'). Both regimes matter: a change can win in L2 and lose from memory.
import { readFileSync, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const path = process.argv[2] ?? new URL("target/wasm32-unknown-unknown/release/qdot_wasm_bench.wasm", import.meta.url);
const wasm = readFileSync(path);
const group = Number(process.env.GROUP ?? 32);
// The kinds of rows: [name, setup kind, group]; kind 0 int4, 1 int8, 4 Q4K, 5 Q5K.
const formats = process.env.FORMATS
  ? process.env.FORMATS.split(",").map((f) => {
      const [name, g] = f.split("/");
      const kind = { int4: 0, int8: 1, q4k: 4, q5k: 5 }[name];
      if (kind === undefined) throw new Error(`FORMATS: unknown ${f} (int4, int8, q4k, q5k)`);
      const fg = Number(g ?? (kind === 1 ? 128 : group));
      return [kind >= 4 ? `q${kind}_k` : `${name}/g${fg}`, kind, fg];
    })
  : process.env.KQUANT
    ? [[`q${process.env.KQUANT}_k`, Number(process.env.KQUANT), 32]]
    : [[`${process.env.INT8 === "1" ? "int8" : "int4"}/g${group}`, process.env.INT8 === "1" ? 1 : 0, group]];
const opts = {
  only: process.env.ONLY ?? (process.env.FORMATS ? "^run$|^run_engine$" : ""),
  mat: process.env.MXFP4 === "1" ? 3 : Number(process.env.FP8 ?? 0),
  formats,
  rows: Number(process.env.ROWS ?? 16384),
  iters: Number(process.env.ITERS ?? 4),
  all: !!process.env.ALL,
  form: process.env.FORM ?? "",
};

// Runs where it is called (node or the page): returns the report lines.
async function bench(bytes, { only, mat, formats, rows, iters, all, form }, cpu) {
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
  const cols = 2048;
  if (form) e.set_form(form === "32" ? 0 : 1);
  // One slot per kind of rows (`select` picks it); FP8 and MXFP4 have their own state.
  const sets = mat
    ? [{ name: ["fp8", "fp8-random", "mxfp4"][mat - 1], size: e.setup_mat(rows, cols, mat - 1) }]
    : formats.map(([name, kind, g], slot) => ({
        name,
        slot,
        size: kind >= 4 ? e.setup_k(rows, cols, kind) : e.setup(rows, cols, g, kind),
      }));
  const kernels = Object.keys(e)
    .filter((k) => (mat ? /^matmul$/ : /^run/).test(k) && (!only || new RegExp(only).test(k)))
    .sort();
  const pick = (r) => r.slot !== undefined && e.select(r.slot);
  // Variants return 0 on rows they are not written for: those are left out.
  const runs = sets
    .flatMap((s) => kernels.map((k) => ({ ...s, k, times: [] })))
    .filter((r) => {
      pick(r);
      return e[r.k](2) !== 0;
    });
  for (let i = 0; i < 15; i++) {
    for (const r of runs) {
      pick(r);
      const t0 = cpu();
      r.checksum = e[r.k](iters) >>> 0;
      r.times.push(cpu() - t0);
    }
  }
  const out = [];
  for (const r of runs) {
    const t = r.times.sort((a, b) => a - b);
    const gbs = (x) => (iters * r.size) / x / 1e9;
    const gvs = (x) => (iters * rows * cols) / x / 1e9;
    if (all) out.push(`${r.name} ${r.k} ${t.map((x) => gbs(x).toFixed(2)).join(" ")}`);
    out.push(
      JSON.stringify({
        rows: r.name,
        kernel: r.k,
        bytes: r.size,
        checksum: r.checksum,
        gb_per_s_best: +gbs(t[0]).toFixed(3),
        gb_per_s_median: +gbs(t[7]).toFixed(3),
        gvalues_per_s_best: +gvs(t[0]).toFixed(3),
        gvalues_per_s_median: +gvs(t[7]).toFixed(3),
      }),
    );
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
