// Times the wasm int4 one-position kernel (decode's) in node's V8, the JIT Chromium runs:
// GB of weights per second of this process's CPU time (less disturbed by other load than
// wall time), best and median of 15. Every export named run* is a variant (add one to
// src/lib.rs to compare a kernel change; they run interleaved).
//   (cd tools/bench/qdot-wasm && RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
//      cargo build --release --target wasm32-unknown-unknown) && \
//   ROWS=16384 ITERS=4 node --experimental-wasm-relaxed-simd tools/bench/qdot-wasm/run.mjs [WASM]
// ROWS int4 rows of 2048 values (16384: 18.9 MB, from memory; 512: 0.6 MB, in L2); ALL=1
// prints every timing. Both regimes matter: a change can win in L2 and lose from memory.
import { readFileSync } from "node:fs";
const path = process.argv[2] ?? new URL("target/wasm32-unknown-unknown/release/qdot_wasm_bench.wasm", import.meta.url);
const module = await WebAssembly.compile(readFileSync(path));
// The engine links wasm-bindgen; nothing timed here calls JavaScript: stubs that fail loudly.
const imports = {};
for (const i of WebAssembly.Module.imports(module)) {
  if (i.kind !== "function") throw new Error(`unexpected import ${i.module}.${i.name} (${i.kind})`);
  (imports[i.module] ??= {})[i.name] = () => {
    throw new Error(`called ${i.module}.${i.name}`);
  };
}
const instance = await WebAssembly.instantiate(module, imports);
const e = instance.exports;
const bytes = e.setup(Number(process.env.ROWS ?? 16384), 2048);
e.run(2);
const gbs = (t) => (Number(process.env.ITERS ?? 4) * bytes) / t / 1e9;
// Kernels interleaved, 15 timings each (CPU time of this process): best and median GB/s.
const kernels = Object.keys(e).filter((k) => /^run/.test(k)).sort();
const times = Object.fromEntries(kernels.map((k) => [k, []]));
const checks = {};
for (let i = 0; i < 15; i++) {
  for (const k of kernels) {
    const c0 = process.cpuUsage();
    checks[k] = e[k](Number(process.env.ITERS ?? 4)) >>> 0;
    const c = process.cpuUsage(c0);
    times[k].push((c.user + c.system) / 1e6);
  }
}
for (const k of kernels) {
  const t = times[k].sort((a, b) => a - b);
  if (process.env.ALL) console.log(k, t.map((x) => gbs(x).toFixed(2)).join(" "));
  console.log(JSON.stringify({ kernel: k, bytes, checksum: checks[k], gb_per_s_best: gbs(t[0]), gb_per_s_median: gbs(t[7]) }));
}
