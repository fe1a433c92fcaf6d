// llama.cpp native CPU through the prebuilt binaries of the node-llama-cpp npm package
// (pinned in tools/bench/package.json; build "never", no GPU, nothing downloaded): loads
// a GGUF, prefills a prompt of seeded pseudo-random ids in one batch, then decodes greedily
// one token at a time. Prints one JSON line:
//   {"engine":"llama.cpp","threads":N,"prefill_tokens":P,"prefill_seconds":..,"decode_tokens":D,"decode_seconds":..,"cpu_variant":..}
//
//   node tools/bench/llama_native.mjs --gguf FILE --threads N [--prompt-tokens 128] [--decode-tokens 64]
//
// The prompt ids are the ones `coli bench` uses: ((i * 0x9E3779B97F4A7C15) >> 17) % vocab.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const GGUF = arg("gguf");
const THREADS = Number(arg("threads", 1));
const PROMPT = Number(arg("prompt-tokens", 128));
const DECODE = Number(arg("decode-tokens", 64));
if (!GGUF) {
  console.error("usage: node llama_native.mjs --gguf FILE --threads N [--prompt-tokens 128] [--decode-tokens 64]");
  process.exit(2);
}

const logs = [];
const llama = await getLlama({
  gpu: false,
  build: "never",
  usePrebuiltBinaries: true,
  skipDownload: true,
  progressLogs: false,
  maxThreads: THREADS,
  logLevel: LlamaLogLevel.debug,
  logger: (level, message) => {
    if (/load_backend|error/i.test(message)) logs.push(message);
  },
});
const model = await llama.loadModel({ modelPath: GGUF, gpuLayers: 0, useMmap: true });
const context = await model.createContext({
  contextSize: PROMPT + DECODE + 16,
  batchSize: Math.max(PROMPT, 32),
  threads: THREADS,
  flashAttention: false,
});
const seq = context.getSequence();
const vocab = BigInt(model.fileInfo.metadata.tokenizer.ggml.tokens.length);
const ids = Array.from({ length: PROMPT }, (_, i) => Number((((BigInt(i) * 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn) >> 17n) % vocab));

// Warm-up: the prompt once, untimed (as `coli bench --warmup`), so that the timed batch
// does not pay for the page faults of an mmap-ed file that is already in the page cache.
await seq.evaluateWithoutGeneratingNewTokens(ids);
await seq.clearHistory();

let t = performance.now();
await seq.evaluateWithoutGeneratingNewTokens(ids);
const prefillS = (performance.now() - t) / 1e3;

// evaluate() decodes one token per step: each yield is a sampled token after one
// single-token forward pass. The first yield follows the evaluation of the token we pass
// in; the next DECODE yields are the timed decode steps.
const gen = seq.evaluate([ids[PROMPT - 1]], { temperature: 0 });
const out = [];
await gen.next();
t = performance.now();
for (let i = 0; i < DECODE; i++) {
  const r = await gen.next();
  if (r.done) break;
  out.push(r.value);
}
const decodeS = (performance.now() - t) / 1e3;
await gen.return();

const variant = logs.map((l) => /libggml-cpu-([a-z0-9_]+)\.so/.exec(l)?.[1]).find(Boolean) ?? null;
console.log(
  JSON.stringify({
    engine: "llama.cpp",
    build: "node-llama-cpp 3.22.1 prebuilt, llama.cpp release tag " + (llama.llamaCppRelease?.release ?? "?"),
    threads: THREADS,
    context_threads: context.currentThreads ?? null,
    prefill_tokens: PROMPT,
    prefill_seconds: prefillS,
    decode_tokens: out.length,
    decode_seconds: decodeS,
    cpu_variant: variant,
    generated_ids: out,
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
