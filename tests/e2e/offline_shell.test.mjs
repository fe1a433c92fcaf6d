// The service worker's app shell (web/offline.js SHELL) holds every module the chat page
// loads: app.js's imports, theirs in turn, and the engine's worker (a module missing from
// it leaves the page blank when the helper is down). No browser needed: the imports are
// read from the files.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "./harness.mjs";

const WEB = join(ROOT, "web");

function imports(file) {
  const src = readFileSync(join(WEB, file), "utf8");
  const found = [...src.matchAll(/^\s*import\s[^;]*?from\s+"\.\/([\w.-]+\.js)"/gms)].map((m) => m[1]);
  // Modules started by URL (the engine's worker); not the service worker itself.
  for (const m of src.matchAll(/new URL\("(?:\.\/)?([\w.-]+\.js)",/g)) if (m[1] !== "sw.js") found.push(m[1]);
  return found;
}

test("the offline app shell lists every module the chat page loads", () => {
  const shell = readFileSync(join(WEB, "offline.js"), "utf8");
  const seen = new Set();
  const todo = ["app.js"];
  while (todo.length) {
    const f = todo.pop();
    if (seen.has(f)) continue;
    seen.add(f);
    todo.push(...imports(f));
  }
  assert.ok(seen.size > 8, `found only ${[...seen]}`);
  const missing = [...seen].filter((f) => !shell.includes(`"/${f}"`));
  assert.deepEqual(missing, [], `web/offline.js SHELL lacks ${missing.join(", ")}`);
});
