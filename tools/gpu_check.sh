#!/usr/bin/env bash
# The real-GPU check: what CI's lavapipe cannot show, run on a machine with a GPU and a
# Vulkan driver, from binaries built elsewhere (the GPU machine needs no Rust toolchain).
#
#   cargo build --release -p colibri-helper
#   cargo build --release -p colibri-engine --features wgpu --example gpu_bench --tests
#   mkdir -p BIN && cp target/release/coli target/release/examples/gpu_bench BIN/
#   cp "$(ls -t target/release/deps/it-* | grep -v '\.d$' | head -1)" BIN/it
#   tools/gpu_check.sh BIN OUT        # on the GPU machine, from the repository's root
#
# It writes, under OUT:
#   gpu_tests.log     the engine's GPU tests (every kernel against its CPU function, every
#                     fixture's logits at 0 ULP, the built-ins' disagreement counts of
#                     gpu_arith) with COLIBRI_REQUIRE_GPU=1;
#   gpu_bench.jsonl   per fixture: ULP distance of 48 teacher-forced positions' logits,
#                     greedy agreement, decode tok/s on the CPU and on the GPU;
#   bench.jsonl       `coli bench` records on an OLMoE-shaped model (4 layers, 16 experts,
#                     top-8, converted with the defaults): the CPU at 2 and at all threads,
#                     the GPU with hybrid placement off / on / auto, with the whole model in
#                     the GPU pool and with a 32 MB pool (about 9 experts: it thrashes).
# Every step has a time limit, so a hung driver ends the step, not the run.
set -uo pipefail
BIN=$(realpath "$1") OUT=$(realpath -m "$2")
mkdir -p "$OUT"
say() { echo "== $*"; }
T=${GPU_CHECK_STEP_TIMEOUT:-150}

say "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

say "GPU tests (COLIBRI_REQUIRE_GPU=1)"
# Integration tests find their fixtures through the crate's directory, as cargo runs them.
(cd engine && COLIBRI_REQUIRE_GPU=1 timeout "$T" "$BIN/it" gpu_ --test-threads 4 --nocapture) >"$OUT/gpu_tests.log" 2>&1
echo "rc=$?"
grep -E -A6 "^test result|FAILED|panicked|built-ins vs" "$OUT/gpu_tests.log" | grep -v "^test .* ok$" | head -40

say "fixtures: ULP and decode tok/s, CPU and GPU"
timeout "$T" "$BIN/gpu_bench" >"$OUT/gpu_bench.jsonl" 2>"$OUT/gpu_bench.err"
echo "rc=$?"
cat "$OUT/gpu_bench.err"

M=/tmp/gpu_check
say "OLMoE-shaped model: 4 layers, 16 experts, top-8, the default conversion"
"$BIN/coli" synth -o "$M/bf16" --layers 4 --experts 16 --top-k 8 --tokenizer models/demo >/dev/null &&
  "$BIN/coli" convert "$M/bf16" -o "$M/default" >/dev/null || exit 1
bench() {
  timeout "$T" "$BIN/coli" bench --model "$M/default" --prompt-tokens 8 --decode-tokens 32 \
    --warmup --ram all --cache warm --probe-bytes 0 "$@" >>"$OUT/bench.jsonl" 2>>"$OUT/bench.err"
  echo "rc=$? $*"
}
bench --backend cpu --threads 2
bench --backend cpu
for pool in "" "--gpu-pool 32000000"; do
  for mode in off on auto; do
    # shellcheck disable=SC2086
    bench --backend wgpu --hybrid "$mode" $pool
  done
done

say "summary (decode and prefill tok/s; the same ids as the CPU's?)"
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
want = next((r.get("generated_ids") for r in rows if r.get("backend", "cpu") == "cpu"), None)
for r in rows:
    h = r.get("hybrid") or {}
    print(json.dumps({
        "backend": r.get("backend", "cpu"), "adapter": r.get("adapter"),
        "threads": r["command"][r["command"].index("--threads") + 1] if "--threads" in r["command"] else "all",
        "hybrid": h.get("mode"), "gpu_pool": (r.get("gpu_pool") or {}).get("budget"),
        "decode_tok_s": round(r["decode_tokens_per_second"], 2),
        "prefill_tok_s": round(r["prefill_tokens_per_second"], 2),
        "decode_cpu_gpu_experts": [h["decode"]["cpu_experts"], h["decode"]["gpu_experts"]] if "decode" in h else None,
        "same_ids_as_cpu": r.get("generated_ids") == want,
    }))
PY
