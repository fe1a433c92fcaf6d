// Ollama's own JavaScript client (npm `ollama`) against a real `coli serve` on loopback:
// the model list, show, chat and generate (streamed and not) on the built-in demo model,
// the same answers as the OpenAI endpoints give, options honoured or refused by name, ps,
// version, and a pull with progress from a stand-in for the Hugging Face hub, then a chat
// with the pulled model. No browser.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { Ollama } from "ollama";
import { ROOT, freePort, startHelper, startHub } from "./harness.mjs";

const DEMO = join(ROOT, "models/demo");
// The demo model as a Hugging Face checkpoint (what tools/train_demo.py wrote before conversion).
const DEMO_HF = join(ROOT, "models/demo-hf");

async function openai(url, path, body) {
  const r = await fetch(`${url}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  assert.equal(r.status, 200);
  return r.json();
}

async function collect(iterator) {
  const parts = [];
  for await (const part of iterator) parts.push(part);
  return parts;
}

test("the ollama client: list, show, chat, generate, options, ps, version, pull", async () => {
  const modelsDir = mkdtempSync(join(tmpdir(), "colibri-e2e-models-"));
  const hub = await startHub("acme/demo-hf", DEMO_HF);
  const helper = await startHelper({ modelsDir, port: await freePort(), extra: ["--model", DEMO], env: { HF_ENDPOINT: hub.url } });
  const ollama = new Ollama({ host: helper.url });
  try {
    const list = await ollama.list();
    assert.deepEqual(list.models.map((m) => m.name), ["demo"]);
    assert.equal(list.models[0].details.family, "qwen3_moe");
    assert.ok(list.models[0].size > 1e6 && /^[0-9a-f]{64}$/.test(list.models[0].digest), JSON.stringify(list.models[0]));
    const shown = await ollama.show({ model: "demo:latest" });
    assert.ok(shown.template.includes("<|im_start|>"), shown.template);
    assert.ok(shown.model_info["qwen3_moe.context_length"] > 0, JSON.stringify(shown.model_info));
    assert.match((await ollama.version()).version, /^\d+\.\d+\.\d+/);

    // Chat: the OpenAI endpoint's answer, whole or in pieces.
    const messages = [{ role: "user", content: "What is 23 + 45?" }];
    const want = (await openai(helper.url, "/v1/chat/completions", { model: "demo", messages, temperature: 0, max_tokens: 40 })).choices[0].message.content;
    const whole = await ollama.chat({ model: "demo", messages, options: { temperature: 0, num_predict: 40 } });
    assert.equal(whole.message.content, want);
    assert.equal(whole.message.role, "assistant");
    assert.equal(whole.done, true);
    assert.ok(whole.eval_count > 0 && whole.prompt_eval_count > 0 && whole.total_duration > 0, JSON.stringify(whole));
    assert.ok(["stop", "length"].includes(whole.done_reason));
    const parts = await collect(await ollama.chat({ model: "demo", messages, stream: true, options: { temperature: 0, num_predict: 40 } }));
    assert.ok(parts.length > 2, `${parts.length} parts`);
    assert.equal(parts.map((p) => p.message.content).join(""), want);
    assert.ok(parts.slice(0, -1).every((p) => p.done === false));
    assert.equal(parts.at(-1).done, true);
    assert.equal(parts.at(-1).eval_count, whole.eval_count);

    // Generate: the prompt as a user turn (the chat answer), or raw (the completions answer).
    const gen = await ollama.generate({ model: "demo", prompt: "What is 23 + 45?", options: { temperature: 0, num_predict: 40 } });
    assert.equal(gen.response, want);
    const genParts = await collect(await ollama.generate({ model: "demo", prompt: "What is 23 + 45?", stream: true, options: { temperature: 0, num_predict: 40 } }));
    assert.equal(genParts.map((p) => p.response).join(""), want);
    const rawWant = (await openai(helper.url, "/v1/completions", { model: "demo", prompt: "Once upon a time", temperature: 0, max_tokens: 12 })).choices[0].text;
    const raw = await ollama.generate({ model: "demo", prompt: "Once upon a time", raw: true, options: { temperature: 0, num_predict: 12 } });
    assert.equal(raw.response, rawWant);
    assert.equal(raw.done_reason, "length");
    assert.equal(raw.eval_count, 12);

    // Options reach the sampler: a seed repeats a draw, another seed or a penalty (presence,
    // frequency, repeat) changes it, and stop cuts the answer.
    const story = [{ role: "user", content: "Tell me a story." }];
    const draw = async (options) => (await ollama.chat({ model: "demo", messages: story, options: { num_predict: 30, temperature: 0.9, ...options } })).message.content;
    const seeded = await draw({ seed: 7 });
    assert.equal(await draw({ seed: 7 }), seeded);
    assert.notEqual(await draw({ seed: 8 }), seeded);
    assert.notEqual(await draw({ seed: 7, presence_penalty: 2 }), seeded);
    assert.notEqual(await draw({ seed: 7, frequency_penalty: 2 }), seeded);
    assert.notEqual(await draw({ seed: 7, repeat_penalty: 1.5 }), seeded);
    assert.notEqual(await draw({ seed: 7, top_k: 1 }), seeded);
    const stopped = await ollama.chat({ model: "demo", messages, options: { temperature: 0, stop: [" ="] } });
    assert.ok(want.includes(" =") && !stopped.message.content.includes(" ="), stopped.message.content);
    assert.ok(want.startsWith(stopped.message.content));

    // What cannot be honoured is refused by name, with the client's ResponseError.
    for (const [options, name] of [[{ min_p: 0.1 }, "min_p"], [{ mirostat: 2 }, "mirostat"], [{ num_keep: 5 }, "num_keep"]]) {
      await assert.rejects(ollama.chat({ model: "demo", messages, options }), (e) => e.status_code === 400 && e.error.includes(name));
    }
    await assert.rejects(ollama.chat({ model: "nope", messages }), (e) => e.status_code === 404 && e.error.includes("nope"));

    const ps = await ollama.ps();
    assert.deepEqual(ps.models.map((m) => m.name), ["demo"]);

    // Pull: progress lines for each file, then success; the pulled model answers.
    const progress = await collect(await ollama.pull({ model: "hf.co/acme/demo-hf", stream: true }));
    assert.equal(progress.at(-1).status, "success");
    const weights = progress.filter((p) => p.status === "pulling model.safetensors");
    const size = readFileSync(join(DEMO_HF, "model.safetensors")).length;
    assert.ok(weights.length >= 1 && weights.every((p) => p.total === size && p.digest.startsWith("sha256:")), JSON.stringify(weights));
    assert.equal(weights.at(-1).completed, size);
    assert.deepEqual((await ollama.list()).models.map((m) => m.name).sort(), ["acme/demo-hf", "demo"]);
    const pulled = await ollama.chat({ model: "hf.co/acme/demo-hf:latest", messages, options: { temperature: 0, num_predict: 8 } });
    assert.ok(pulled.message.content.length > 0 && pulled.eval_count > 0, JSON.stringify(pulled));
    // Pulling an installed model succeeds at once.
    assert.equal((await ollama.pull({ model: "acme/demo-hf" })).status, "success");
  } finally {
    await helper.stop();
    await hub.stop();
    rmSync(modelsDir, { recursive: true, force: true });
  }
});
