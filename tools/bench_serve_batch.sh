#!/usr/bin/env bash
# Continuous batching in `coli serve`, measured from outside (issue #35): 1, 2, 4, 8
# concurrent streaming clients against a fresh `coli serve --parallel 8` on the 64-expert
# OLMoE shape converted with `coli convert`'s defaults, with an expert RAM budget below
# the experts' size so that experts stream. For each N: aggregate decode tok/s, p50/p95 ms
# per output token, time to first token, expert bytes read per generated token, and the
# engine's mean batch (tools/bench/serve_clients.py; each N in a fresh server, the model's
# pages evicted first; each client samples at temperature 1 with its own seed, so routing
# does not collapse into a loop).
#
#   tools/bench_serve_batch.sh [OUT_DIR]
#
# Environment: COLI=target/release/coli  LAYERS=16  EXPERTS=64  TOPK=8  HIDDEN=2048
#   INTERMEDIATE=1024  HEADS=16  VOCAB=50304  RAM=512M  CLIENTS="1 2 4 8"  DECODE=32
#   PARALLEL=8  ROUTING=trained  KEEP=0 (1 keeps the models)
# The documented run (docs/benchmarks.md) used LAYERS=4 RAM=128M (disk room).
set -euo pipefail
cd "$(dirname "$0")/.."
COLI=${COLI:-target/release/coli}
LAYERS=${LAYERS:-16} EXPERTS=${EXPERTS:-64} TOPK=${TOPK:-8} HIDDEN=${HIDDEN:-2048}
INTERMEDIATE=${INTERMEDIATE:-1024} HEADS=${HEADS:-16} VOCAB=${VOCAB:-50304} RAM=${RAM:-512M}
CLIENTS=${CLIENTS:-"1 2 4 8"} DECODE=${DECODE:-32} PARALLEL=${PARALLEL:-8}
ROUTING=${ROUTING:-trained} KEEP=${KEEP:-0}
OUT=${1:-/tmp/coli-serve-batch}
say() { echo "== $*" >&2; }
[ -x "$COLI" ] || { say "no $COLI: cargo build --release -p colibri-helper"; exit 1; }
mkdir -p "$OUT"
. tools/bench_model.sh
bench_model
python3 tools/bench/serve_clients.py --coli "$COLI" --model "$DST" --clients "$CLIENTS" \
  --parallel "$PARALLEL" --ram "$RAM" --decode "$DECODE" --out "$OUT"
[ "$KEEP" = 1 ] || rm -rf "$DST"
