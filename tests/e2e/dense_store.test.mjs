// The browser keeps a model's dense weights in OPFS (wasm/src/dense_file.rs): the first
// load fetches them from the helper and writes them as they stream by, later loads (a
// reload, the other backend) read them from there and fetch none. A stored copy that was
// damaged is caught by the checksums, emptied, and fetched again; a budget too small for
// the copy keeps none; a first load whose download (large ranges, several at once) fails
// fetches as it reads and still keeps the copy. A load also removes what the model's
// other versions left in browser storage. The helper's own count of the bytes it sent (/health) checks the
// engine's. Every run gives `coli generate`'s tokens.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { coli, freePort, startHelper, launchBrowser, synthModel } from "./harness.mjs";

const PROMPT = [5, 17, 3, 42];
const NEW = 3;
let dir, helper, nativeIds, dense;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "colibri-e2e-densestore-"));
  const { path: model, manifest } = synthModel(dir, ["--layers", "2", "--experts", "4", "--top-k", "2", "--hidden", "1024", "--intermediate", "128", "--heads", "8"], "int8");
  dense = manifest.dense;
  nativeIds = JSON.parse(coli(["generate", "--model", model, "--ids", PROMPT.join(","), "--max-new-tokens", String(NEW), "--ignore-eos", "--json"])).ids;
  helper = await startHelper({ modelsDir: join(dir, "models"), port: await freePort() });
});

after(async () => {
  if (helper) await helper.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const sent = async () => (await (await fetch(`${helper.url}/health`)).json()).file_bytes_sent;

/** Loads the model in a fresh document (a fresh worker) and generates; returns the ids,
 * the stats, and the bytes of the model's data file the helper sent during the load
 * other than the experts the engine fetched (learned pins): the dense weights' share. */
async function run(page, backend, loadOptions = {}) {
  await page.goto(`${helper.url}/health`);
  const before = await sent();
  const loaded = await page.evaluate(
    async ({ backend, loadOptions }) => {
      const { load } = await import("/colibri.js");
      window.engine = await load({ model: "synth", backend, ramBytes: 16 << 20, ...loadOptions });
      return window.engine.stats();
    },
    { backend, loadOptions },
  );
  const loadSent = (await sent()) - before - loaded.bytesFetched;
  const r = await page.evaluate(
    async ({ ids, n }) => {
      const g = await window.engine.generate({ ids, maxNewTokens: n, temperature: 0, ignoreEos: true });
      const stats = window.engine.stats();
      window.engine.terminate?.();
      return { ids: g.ids, stats };
    },
    { ids: PROMPT, n: NEW },
  );
  return { ...r, loaded, loadSent };
}

/** Overwrites 4 KiB in the middle of the stored dense copy (from the page: the worker
 * holds the file only while it loads). */
async function damage(page) {
  await page.goto(`${helper.url}/health`);
  return page.evaluate(async (at) => {
    const top = await (await navigator.storage.getDirectory()).getDirectoryHandle("colibri");
    for await (const [name, h] of top.entries()) {
      if (!name.startsWith("synth-") || h.kind !== "directory") continue;
      const f = await h.getFileHandle("dense.bin");
      const w = await f.createWritable({ keepExistingData: true });
      await w.write({ type: "write", position: at, data: new Uint8Array(4096).fill(0x5a) });
      await w.close();
      return name;
    }
    return null;
  }, Math.floor(dense.length / 2));
}

test("the dense weights are kept in OPFS: a reload and the other backend fetch none of them; a damaged copy is fetched again", async (t) => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    assert.ok(dense.length > 8 << 20, `dense region ${dense.length} bytes: less than one 8 MiB chunk`);

    // First load: from the helper, and written to OPFS on the way.
    const first = await run(page, "webgpu");
    assert.deepEqual(first.ids, nativeIds, "WebGPU tokens differ from coli generate");
    const d1 = first.stats.dense;
    assert.equal(d1.from, "network", JSON.stringify(d1));
    const tensorBytes = dense.tensors.reduce((a, t) => a + t.length, 0);
    // (Norms and the like are read once to open the model and again for their GPU buffers.)
    assert.ok(d1.fetchedBytes >= tensorBytes && d1.fetchedBytes < 1.1 * dense.length, JSON.stringify(d1));
    assert.equal(d1.storedBytes, dense.length + 16, JSON.stringify(d1));
    assert.equal(d1.error, null);
    t.diagnostic(`first load: the helper sent ${first.loadSent} bytes, stats ${JSON.stringify(d1)}`);
    assert.ok(first.loadSent >= tensorBytes, `the helper sent ${first.loadSent} bytes`);

    // A reload on WebGPU, then the CPU backend: from OPFS, nothing fetched for them.
    for (const backend of ["webgpu", "cpu"]) {
      const r = await run(page, backend);
      assert.deepEqual(r.ids, nativeIds, `${backend} from the stored copy: tokens differ`);
      const d = r.stats.dense;
      assert.equal(d.from, "opfs", `${backend}: ${JSON.stringify(d)}`);
      assert.equal(d.fetchedBytes, 0, `${backend}: ${JSON.stringify(d)}`);
      assert.equal(d.storedBytes, dense.length + 16);
      // The helper's count: nothing of the data file but experts (well under a tenth of the
      // dense region, to leave room for what it counts besides).
      t.diagnostic(`${backend} from OPFS: the helper sent ${r.loadSent} bytes during the load (dense region ${dense.length})`);
      assert.ok(r.loadSent < dense.length / 10, `${backend}: the helper sent ${r.loadSent} bytes during the load`);
    }

    // A damaged copy: the checksums catch it, it is fetched again (and kept again).
    assert.ok(await damage(page), "no stored dense copy found in OPFS");
    const healed = await run(page, "webgpu");
    assert.deepEqual(healed.ids, nativeIds, "tokens after a damaged copy differ");
    const dh = healed.stats.dense;
    assert.equal(dh.from, "network", JSON.stringify(dh));
    assert.match(dh.error || "", /checksum mismatch/, JSON.stringify(dh));
    assert.ok(dh.fetchedBytes >= tensorBytes, JSON.stringify(dh));
    assert.equal(dh.storedBytes, dense.length + 16);
    const again = await run(page, "cpu");
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.dense.from, "opfs", JSON.stringify(again.stats.dense));
    assert.equal(again.stats.dense.fetchedBytes, 0);

    // A budget smaller than the dense weights: no copy (the stored one is removed), the
    // network serves them, and the experts keep the whole budget.
    const small = await run(page, "cpu", { diskBytes: dense.length });
    assert.deepEqual(small.ids, nativeIds);
    assert.equal(small.stats.dense.storedBytes, 0, JSON.stringify(small.stats.dense));
    assert.match(small.stats.dense.error || "", /do not fit the disk budget/);
    assert.ok(small.stats.dense.fetchedBytes >= tensorBytes);
    assert.equal(small.stats.diskBudget, dense.length);
    const gone = await damage(page).catch((e) => String(e));
    assert.ok(gone === null || /NotFound/.test(gone), `the copy is still there: ${gone}`);
    // With room for it, the copy's bytes come out of the experts' budget.
    const roomy = await run(page, "cpu", { diskBytes: 4 * dense.length });
    assert.equal(roomy.stats.dense.storedBytes, dense.length + 16);
    assert.equal(roomy.stats.diskBudget, 4 * dense.length - (dense.length + 16));
  } finally {
    await browser.close();
  }
});

test("a first load whose download of the dense weights fails fetches them as it reads, keeps the copy, and gives the same tokens", async (t) => {
  const browser = await launchBrowser();
  try {
    // The download asks for the region in ranges larger than the load's own 8 MiB reads:
    // refuse those (as a proxy cutting large transfers would), let the rest through.
    let refused = 0;
    await browser.context.route(/\/weights\.bin$/, (route) => {
      const m = /bytes=(\d+)-(\d+)/.exec(route.request().headers().range || "");
      if (m && Number(m[2]) - Number(m[1]) + 1 > 8 << 20) {
        refused++;
        return route.abort("connectionreset");
      }
      return route.continue();
    });
    const page = await browser.context.newPage();
    const r = await run(page, "cpu");
    assert.deepEqual(r.ids, nativeIds);
    const d = r.stats.dense;
    t.diagnostic(`download refused ${refused} times: ${JSON.stringify(d)}`);
    assert.ok(refused > 0, "no download range was seen (was the route bypassed?)");
    assert.match(d.error || "", /downloading the dense weights failed/, JSON.stringify(d));
    assert.equal(d.from, "network");
    assert.equal(d.storedBytes, dense.length + 16, JSON.stringify(d));
    await browser.context.unroute(/\/weights\.bin$/);
    const again = await run(page, "webgpu");
    assert.deepEqual(again.ids, nativeIds);
    assert.equal(again.stats.dense.from, "opfs", JSON.stringify(again.stats.dense));
    assert.equal(again.stats.dense.fetchedBytes, 0);
  } finally {
    await browser.close();
  }
});


test("a load removes the browser storage of the model's other versions, unless a tab still uses it; other models' stay", async () => {
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${helper.url}/health`);
    // What earlier versions of "synth" (other fingerprints) and another model left.
    const OLD = "synth-00000000000000aa", BUSY = "synth-00000000000000bb", OTHER = "other-00000000000000aa";
    await page.evaluate(async (names) => {
      const root = await navigator.storage.getDirectory();
      const top = await root.getDirectoryHandle("colibri", { create: true });
      for (const n of names) {
        const f = await (await top.getDirectoryHandle(n, { create: true })).getFileHandle("dense.bin", { create: true });
        const w = await f.createWritable();
        await w.write(new Uint8Array(1 << 20));
        await w.close();
        const kv = await root.getDirectoryHandle("colibri-kv", { create: true });
        for (const f of [`${n}.kv`, `${n}.webgpu-0123456789abcdef.kv`]) await (await kv.getFileHandle(f, { create: true })).createWritable().then((w) => w.close());
      }
    }, [OLD, BUSY, OTHER]);
    // Another tab of this origin uses BUSY's storage (holds its Web Lock).
    const other = await browser.context.newPage();
    await other.goto(`${helper.url}/health`);
    await other.evaluate((n) => new Promise((held) => navigator.locks.request(`colibri-storage:${n}`, () => (held(), new Promise(() => {})))), BUSY);

    const pruned = await page.evaluate(async () => {
      const { load } = await import("/colibri.js");
      const engine = await load({ model: "synth", backend: "cpu", ramBytes: 16 << 20 });
      const out = engine.info.prunedVersions;
      engine.terminate();
      return out;
    });
    assert.deepEqual(pruned, [OLD]);
    const left = await page.evaluate(async () => {
      const root = await navigator.storage.getDirectory();
      const names = async (d) => {
        const out = [];
        for await (const [n] of (await root.getDirectoryHandle(d)).entries()) out.push(n);
        return out.sort();
      };
      return { colibri: await names("colibri"), kv: await names("colibri-kv") };
    });
    // The conversation caches go with it, the WebGPU ones (one per adapter) too.
    const gpuKv = (n) => `${n}.webgpu-0123456789abcdef.kv`;
    assert.ok(!left.colibri.includes(OLD) && !left.kv.includes(`${OLD}.kv`) && !left.kv.includes(gpuKv(OLD)), JSON.stringify(left));
    assert.ok(left.colibri.includes(BUSY) && left.kv.includes(`${BUSY}.kv`) && left.kv.includes(gpuKv(BUSY)), `a version in use was removed: ${JSON.stringify(left)}`);
    assert.ok(left.colibri.includes(OTHER) && left.kv.includes(`${OTHER}.kv`) && left.kv.includes(gpuKv(OTHER)), `another model's storage was removed: ${JSON.stringify(left)}`);
    assert.ok(left.colibri.some((n) => /^synth-[0-9a-f]{16}$/.test(n) && ![OLD, BUSY].includes(n)), "the loaded version's storage is missing");
  } finally {
    await browser.close();
  }
});
