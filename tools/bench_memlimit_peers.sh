#!/usr/bin/env bash
# Issue #34's headline scenario beside llama.cpp: the same OLMoE-layout shape as
# tools/bench_memlimit.sh (LAYERS x EXPERTS experts of INTERMEDIATE, top-TOPK) written as a
# Q4_0 GGUF (tools/bench/make_gguf.py, the `gguf` PyPI package), then, inside one memory
# cgroup (tools/cgroup.sh), cold page cache before each run:
#   1. llama.cpp (node-llama-cpp's prebuilt CPU binaries, default mmap) at LIMIT;
#   2. llama.cpp at growing limits (LIMIT x 2, x 3, ...) until it completes: the smallest
#      limit a user of it would need, to that step;
#   3. colibri on the same weights: the GGUF imported with `coli convert model.gguf`, at
#      LIMIT (`coli bench`, its defaults: the budget from the cgroup's limit).
# Both decode greedily after a prompt of the same pseudo-random ids (the ids `coli bench`
# and tools/bench/llama_native.mjs use). Prints a Markdown table and one JSON record.
#
#   tools/bench_memlimit_peers.sh [OUT_DIR]
#
# Environment: COLI=target/release/coli  LAYERS=48  EXPERTS=128  TOPK=8  HIDDEN=2048
#   INTERMEDIATE=768  HEADS=16  VOCAB=151936  LIMIT=4G  PROMPT=16  DECODE=32  THREADS=2
#   MAX_STEPS=8 (llama.cpp limits tried)  KEEP=0 (1 keeps the GGUF and the import)
# Needs python3 with `gguf` and `numpy` (pip install gguf), node >= 20 and
# tools/bench/node_modules (cd tools/bench && npm install --omit=optional --ignore-scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
COLI=${COLI:-target/release/coli}
LAYERS=${LAYERS:-48} EXPERTS=${EXPERTS:-128} TOPK=${TOPK:-8} HIDDEN=${HIDDEN:-2048}
INTERMEDIATE=${INTERMEDIATE:-768} HEADS=${HEADS:-16} VOCAB=${VOCAB:-151936}
LIMIT=${LIMIT:-4G} PROMPT=${PROMPT:-16} DECODE=${DECODE:-32} THREADS=${THREADS:-2}
MAX_STEPS=${MAX_STEPS:-8} KEEP=${KEEP:-0}
OUT=${1:-/tmp/coli-memlimit-peers}
say() { echo "== $*" >&2; }
[ -x "$COLI" ] || { say "no $COLI: cargo build --release -p colibri-helper"; exit 1; }
[ -d tools/bench/node_modules/node-llama-cpp ] || { say "no tools/bench/node_modules: see the header"; exit 1; }
. tools/cgroup.sh
LIMIT_B=$(bytes "$LIMIT")
cgroup_make bench-memlimit-peers
mkdir -p "$OUT"
GGUF="$OUT/q4_0-L$LAYERS-E$EXPERTS-I$INTERMEDIATE-V$VOCAB.gguf" IMPORT="$OUT/gguf-L$LAYERS-E$EXPERTS-I$INTERMEDIATE-V$VOCAB"
if [ ! -f "$GGUF" ]; then
  say "Q4_0 GGUF (make_gguf.py: $LAYERS layers, $EXPERTS experts of $INTERMEDIATE, top-$TOPK, vocab $VOCAB)"
  python3 tools/bench/make_gguf.py "$GGUF.part" --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" \
    --hidden "$HIDDEN" --intermediate "$INTERMEDIATE" --heads "$HEADS" --vocab "$VOCAB" >&2
  mv "$GGUF.part" "$GGUF"
fi
if [ ! -f "$IMPORT/colibri.json" ]; then
  say "coli convert $GGUF (the import a user runs)"
  "$COLI" convert "$GGUF" -o "$IMPORT" >/dev/null
fi
evict() { python3 -c 'import os,sys
for p in sys.argv[1:]:
    for root, _, fs in os.walk(p) if os.path.isdir(p) else [(os.path.dirname(p), 0, [os.path.basename(p)])]:
        for f in fs:
            fd = os.open(os.path.join(root, f), os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
llama() { # limit-bytes -> prints the JSON line or "oom"/"failed RC"
  cgroup_limit "$1"
  evict "$GGUF"
  set +e
  cgroup_run node tools/bench/llama_native.mjs --gguf "$GGUF" --threads "$THREADS" \
    --prompt-tokens "$PROMPT" --decode-tokens "$DECODE" > "$OUT/llama.json" 2> "$OUT/llama.err"
  local rc=$?
  set -e
  say "llama.cpp at $1 bytes: exit $rc; cgroup $(cgroup_report)"
  if [ $rc = 0 ]; then cat "$OUT/llama.json"; elif [ $rc = 137 ]; then echo oom; else echo "failed $rc"; fi
}
RESULTS="$OUT/results.txt"
: > "$RESULTS"
at_limit=$(llama "$LIMIT_B" | tail -1)
echo "llama $LIMIT_B $at_limit" >> "$RESULTS"
step=2
needed=""
while [ "${at_limit:0:1}" != "{" ] && [ $step -le "$MAX_STEPS" ]; do
  l=$((LIMIT_B * step))
  r=$(llama "$l" | tail -1)
  echo "llama $l $r" >> "$RESULTS"
  if [ "${r:0:1}" = "{" ]; then needed=$l; break; fi
  step=$((step + 1))
done
say "colibri on the imported GGUF at $LIMIT ($(du -sh "$IMPORT" | cut -f1))"
cgroup_limit "$LIMIT_B"
# The page cache llama.cpp's runs left is charged to this cgroup: drop it first, so that
# colibri starts in the same empty cgroup llama.cpp did.
evict "$GGUF" "$IMPORT"
set +e
cgroup_run "$COLI" bench --model "$IMPORT" --prompt-tokens "$PROMPT" --decode-tokens "$DECODE" \
  --threads "$THREADS" --cache cold > "$OUT/coli.json"
rc=$?
set -e
say "colibri: exit $rc; cgroup $(cgroup_report)"
if [ $rc = 0 ]; then echo "coli $LIMIT_B $(tr -d '\n' < "$OUT/coli.json")" >> "$RESULTS"; else echo "coli $LIMIT_B exit-$rc" >> "$RESULTS"; fi
python3 - "$RESULTS" "$LIMIT_B" "$(nproc)" <<'PY'
import json, sys
rows, limit = [l.split(" ", 2) for l in open(sys.argv[1]).read().splitlines()], int(sys.argv[2])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"cpu: {cpu}, {sys.argv[3]} cores")
print("| engine | memory limit | result | decode tok/s |")
print("|---|---|---|---|")
out = []
for who, lim, r in rows:
    lim = int(lim)
    if r.startswith("{"):
        j = json.loads(r)
        if who == "llama":
            tps = j["decode_tokens"] / j["decode_seconds"]
        else:
            tps = j["decode_tokens_per_second"]
        res = "completed"
    else:
        tps, res = None, ("OOM-killed" if r in ("oom", "exit-137") else r)
    name = "llama.cpp (Q4_0 GGUF, mmap)" if who == "llama" else "colibri (the same GGUF, imported)"
    print(f"| {name} | {lim / 2**30:.2f} GiB | {res} | {'' if tps is None else f'{tps:.2f}'} |")
    out.append({"engine": who, "limit_bytes": lim, "result": res, "decode_tokens_per_second": tps})
print(json.dumps({"cpu": cpu, "runs": out}))
PY
[ "$KEEP" = 1 ] || rm -rf "$GGUF" "$IMPORT"
