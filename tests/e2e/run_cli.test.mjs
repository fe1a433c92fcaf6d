// `coli run NAME` as a new user meets it: an empty COLI_HOME, a model on the hub (a
// stand-in serving the demo checkpoint), and a chat on stdin. The fit check refuses before
// any weight is downloaded when the model cannot run here; otherwise run pulls, then
// chats; a second run does not pull again. `coli pull --list` prints the catalog.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { COLI, ROOT, startHub } from "./harness.mjs";

test("coli run pulls a missing model after the fit check, then chats", async () => {
  const home = mkdtempSync(join(tmpdir(), "colibri-e2e-run-"));
  const hub = await startHub("acme/demo-hf", join(ROOT, "models/demo-hf"));
  const env = { ...process.env, COLI_HOME: join(home, "models"), XDG_DATA_HOME: join(home, "data"), HF_ENDPOINT: hub.url };
  // spawnSync would block the stand-in hub's event loop: run coli asynchronously.
  const coli = (args, { input = "", extraEnv = {} } = {}) =>
    new Promise((ok) => {
      const child = spawn(COLI, args, { env: { ...env, ...extraEnv } });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d) => (stdout += d));
      child.stderr.on("data", (d) => (stderr += d));
      child.on("close", (status) => ok({ status, stdout, stderr }));
      child.stdin.end(input);
    });
  try {
    const list = spawnSync(COLI, ["pull", "--list"], { env, encoding: "utf8" });
    assert.equal(list.status, 0, list.stderr);
    assert.match(list.stdout, /^olmoe\s+allenai\/OLMoE-1B-7B-0924\s+olmoe\s+3\.8 GiB/m);

    // Too little memory: refused before a weight is fetched.
    const refused = await coli(["run", "acme/demo-hf"], { extraEnv: { COLI_MEM_LIMIT: "64K" } });
    assert.equal(refused.status, 1, refused.stderr);
    assert.match(refused.stderr, /acme\/demo-hf cannot run here: .* of dense weights/);
    assert.ok(!hub.requests.some((r) => r.startsWith("GET") && r.endsWith("model.safetensors")), hub.requests.join("\n"));
    assert.ok(!existsSync(join(home, "models/acme/demo-hf")));

    const question = "What is 2 + 3?\n";
    const first = await coli(["run", "acme/demo-hf", "--temperature", "0", "--max-new-tokens", "40"], { input: question });
    assert.equal(first.status, 0, first.stderr);
    assert.match(first.stderr, /acme\/demo-hf is not installed: pulling it/);
    assert.ok(existsSync(join(home, "models/acme/demo-hf/config.json")));
    const want = spawnSync(COLI, ["generate", "--model", "acme/demo-hf", "--chat", "--prompt", "What is 2 + 3?", "--temperature", "0", "--max-new-tokens", "40", "--json"], { env, encoding: "utf8" });
    assert.equal(want.status, 0, want.stderr);
    const answer = JSON.parse(want.stdout).text.trim();
    assert.ok(answer.length > 0 && first.stdout.includes(answer), `${first.stdout} vs ${answer}`);

    // Installed now: no second pull.
    const fetched = hub.requests.length;
    const second = await coli(["run", "acme/demo-hf", "--temperature", "0", "--max-new-tokens", "40"], { input: question });
    assert.equal(second.status, 0, second.stderr);
    assert.ok(second.stdout.includes(answer));
    assert.equal(hub.requests.length, fetched);
  } finally {
    await hub.stop();
    rmSync(home, { recursive: true, force: true });
  }
});
