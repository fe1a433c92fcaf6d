// DeepSeek-V4 (#33) in the browser: tests/fixtures/deepseek_v4 converted with the defaults
// (int4 experts, int8 elsewhere) and deepseek_v4_fp8 in its release layout (FP8 dense
// weights, FP4 routed experts kept as MXFP4). The prompt (40 positions) and the 12
// decoded tokens run past the fixtures' sliding window (6) and through several compressed
// blocks (rates 4 and 8: 12 and 6 entries at the end), past the indexer's top-k (3). The
// wasm CPU backend gives the native CPU path's tokens and logits bit for bit on one thread
// and on two (the same Rust; the second run adopts the V4 cache file the first left in
// browser storage, and a next turn that extends the stored conversation resumes its V4
// state and gives coli's tokens), and so does WebGPU (the V4 graph's kernels over the same bounded
// state). Nothing in the browser engine is V4's own: the container loader, the session,
// the cache file and the GPU upload are the engine's, as natively.
import { test } from "node:test";
import assert from "node:assert/strict";
import { coli, generateInPage, launchBrowser, nativeReference } from "./harness.mjs";

// The fixtures' attention: a sliding window of 6 on every layer, and per layer the
// compression rate (0: the window only) and whether it is CSA (overlapping windows, an
// indexer of 12 floats per entry) rather than HCA; head_dim 16.
const WINDOW = 6, HEAD = 16, INDEX = 12;
const LAYERS = [[0, false], [4, true], [8, false], [4, true]];

// What the caches grow by per token (f32): the compressed entries only, one of head_dim
// (plus the indexer's on CSA layers) per `rate` positions: 0 + 4 * 28 / 4 + 4 * 16 / 8 + 28.
const BYTES_PER_TOKEN = LAYERS.reduce((b, [rate, csa]) => b + (rate ? (4 * (HEAD + (csa ? INDEX : 0))) / rate : 0), 0);

// The floats a CPU session's V4 state holds after `n` positions (the engine's
// V4Layout::record_floats): per layer the window's last WINDOW - 1 keys, and per
// compressor its entries, the unfinished window's kv and gate rows (two series wide on
// CSA) and CSA's carried window. Bounded by the window plus one entry per `rate` positions.
function v4StateFloats(n) {
  const comp = (dim, rate, overlap) =>
    Math.floor(n / rate) * dim + (n % rate) * (overlap ? 2 * dim : dim) * 2 + (overlap && n >= rate ? 2 * rate * dim : 0);
  return LAYERS.reduce(
    (f, [rate, csa]) => f + Math.min(n, WINDOW - 1) * HEAD + (rate ? comp(HEAD, rate, csa) + (csa ? comp(INDEX, rate, true) : 0) : 0),
    0,
  );
}

const models = [
  { model: "deepseek_v4", convertArgs: [] },
  { model: "deepseek_v4_fp8", convertArgs: [] },
];

for (const f of models) {
  test(`${f.model} in the browser: the native bits on the CPU backend (1 and 2 threads) and on WebGPU`, async () => {
    const prompt = Array.from({ length: 40 }, (_, i) => (i * 29 + 3) % 400);
    const n = 12;
    const ref = await nativeReference({ model: f.model, prompt, n, convertArgs: f.convertArgs });
    const browser = await launchBrowser();
    try {
      const page = await browser.context.newPage();
      const run = (opts) => ref.run(page, opts);
      const one = await run({ backend: "cpu", logits: true, threads: 1 });
      assert.equal(one.stats.backend, "cpu");
      assert.equal(one.stats.attention, "v4");
      assert.equal(one.stats.kvCacheBytesPerToken, BYTES_PER_TOKEN);
      assert.equal(one.stats.recurrentStateBytes, 0);
      // The conversation's cache after the generation: the prompt and the decoded tokens
      // but the last, and the bounded V4 state of those positions (plus the ids), and the
      // snapshot taken where the prompt ended (counted in the cache's bytes).
      const held = prompt.length + n - 1;
      assert.equal(one.stats.cachedTokens, 0);
      assert.equal(one.stats.kvCacheTokens, held);
      assert.ok(one.stats.kvSnapshotBytes > 0, JSON.stringify(one.stats));
      assert.equal(one.stats.kvCacheBytes - one.stats.kvSnapshotBytes, 4 * (held + v4StateFloats(held)), JSON.stringify(one.stats));
      ref.sameBits(one, "cpu, 1 thread");
      // A new document and worker: the stored conversation (51 positions) shares all of
      // the prompt but its last token, but the V4 state read back from its one record
      // holds no snapshot at or before 39: it restarts, so nothing counts as reused
      // (Context::keepable) and every id is fed: the same bits.
      const two = await run({ backend: "cpu", logits: true, threads: 2 });
      assert.equal(two.stats.threads, 2, JSON.stringify(two.stats));
      assert.equal(two.stats.cachedTokens, 0, JSON.stringify(two.stats));
      ref.sameBits(two, "cpu, 2 threads");
      // The next turn extends the whole stored conversation (its 52 ids): the state of
      // its 51 positions is kept as it is and only the last id is fed, with the native
      // tokens of that prompt.
      const next = prompt.concat(two.ids);
      const want = JSON.parse(coli(["generate", "--model", ref.path, "--ids", next.join(","), "--max-new-tokens", "4", "--temperature", "0", "--ignore-eos", "--json"]));
      const cont = await generateInPage(page, ref.helper.url, { model: f.model, prompt: next, n: 4, backend: "cpu", threads: 1 });
      assert.equal(cont.stats.cachedTokens, held, JSON.stringify(cont.stats));
      assert.deepEqual(cont.ids, want.ids, "cpu: the continued conversation's tokens differ from coli generate");

      const gpu = await run({ backend: "webgpu", logits: true });
      assert.equal(gpu.stats.backend, "webgpu", JSON.stringify(gpu.stats));
      assert.equal(gpu.stats.attention, "v4");
      assert.equal(gpu.stats.kvCacheTokens, held);
      // The same state in GPU buffers (the window's and the compressors' with their room
      // to grow): all of it is the session's GPU bytes, and no less than the CPU's.
      assert.equal(gpu.stats.memory.gpuKvBytes, gpu.stats.kvCacheBytes);
      assert.ok(gpu.stats.kvCacheBytes >= one.stats.kvCacheBytes, JSON.stringify(gpu.stats));
      ref.sameBits(gpu, "webgpu");
    } finally {
      await browser.close();
      await ref.stop();
    }
  });
}
