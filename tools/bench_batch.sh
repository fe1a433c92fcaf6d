#!/usr/bin/env bash
# Continuous batching's engine step, measured (issue #35): N sequences decoded together,
# one forward pass per step (`coli bench --batch N`), on the 64-expert OLMoE shape
# converted with `coli convert`'s defaults, teacher-forced on a text (each sequence its
# own stretch of it), with an expert RAM budget below the experts' size so that experts
# stream. For each N: aggregate decode tok/s, p50/p95 ms per output token (what one
# request sees), expert bytes read per decode token. Each N runs in a fresh process with
# the model's pages evicted first (--cache cold).
#
#   tools/bench_batch.sh [OUT_DIR]
#
# Environment: COLI=target/release/coli  LAYERS=16  EXPERTS=64  TOPK=8  HIDDEN=2048
#   INTERMEDIATE=1024  HEADS=16  VOCAB=50304  RAM=512M  BATCHES="1 2 4 8"  PROMPT=16
#   DECODE=32  TEXT=docs/architecture.md  ROUTING=trained  KEEP=0 (1 keeps the models)
# The documented run (docs/benchmarks.md) used LAYERS=4 RAM=128M (disk room).
set -euo pipefail
cd "$(dirname "$0")/.."
COLI=${COLI:-target/release/coli}
LAYERS=${LAYERS:-16} EXPERTS=${EXPERTS:-64} TOPK=${TOPK:-8} HIDDEN=${HIDDEN:-2048}
INTERMEDIATE=${INTERMEDIATE:-1024} HEADS=${HEADS:-16} VOCAB=${VOCAB:-50304} RAM=${RAM:-512M}
BATCHES=${BATCHES:-"1 2 4 8"} PROMPT=${PROMPT:-16} DECODE=${DECODE:-32}
TEXT=${TEXT:-docs/architecture.md} ROUTING=${ROUTING:-trained} KEEP=${KEEP:-0}
OUT=${1:-/tmp/coli-batch}
say() { echo "== $*" >&2; }
[ -x "$COLI" ] || { say "no $COLI: cargo build --release -p colibri-helper"; exit 1; }
mkdir -p "$OUT"
. tools/bench_model.sh
bench_model
for N in $BATCHES; do
  say "batch $N"
  "$COLI" bench --model "$DST" --batch "$N" --text "$TEXT" --prompt-tokens "$PROMPT" \
    --decode-tokens "$DECODE" --ram "$RAM" --cache cold --probe-bytes 0 > "$OUT/batch-$N.json"
done
python3 - "$OUT" $BATCHES <<'PY'
import json, sys
out, ns = sys.argv[1], sys.argv[2:]
recs = {n: json.load(open(f"{out}/batch-{n}.json")) for n in ns}
one = recs[ns[0]]["batch"]["aggregate_decode_tokens_per_second"]
h = recs[ns[0]]["hardware"]
print(f"cpu: {h['cpu']}, cores {h['cores']}, load at start of batch {ns[0]}: {h['load_average']}")
print("| batch | aggregate decode tok/s | x one | p50 ms/token | p95 ms/token | expert bytes read / decode token |")
print("|---|---|---|---|---|---|")
for n in ns:
    b = recs[n]["batch"]
    t = b["aggregate_decode_tokens_per_second"]
    p = b["per_request_ms_per_token"]
    print(f"| {n} | {t:.2f} | {t / one:.2f}x | {p['p50']:.1f} | {p['p95']:.1f} | {b['bytes_read_per_decode_token'] / 1e6:.2f} MB |")
print(json.dumps({n: {k: recs[n]["batch"][k] for k in ("aggregate_decode_tokens_per_second", "per_request_ms_per_token", "bytes_read_per_decode_token")} for n in ns}))
PY
[ "$KEEP" = 1 ] || rm -rf "$DST"
