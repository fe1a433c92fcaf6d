#!/usr/bin/env bash
# Starts colibri from a fresh clone: builds the browser engine (wasm) and `coli`, then
# runs the helper with the built-in demo model and prints the URL to open.
# Extra arguments go to `coli serve` (e.g. --port 8080, --model DIR, --allow-origin URL).
#
# Each step prints a banner, then its time and a one-line summary of what it built. The
# compilers' output goes to target/start/build.log (printed from its end if a step fails);
# COLIBRI_VERBOSE=1 shows it as it comes instead.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR=${CARGO_TARGET_DIR:-target}
mkdir -p "$TARGET_DIR/start"
LOG="$TARGET_DIR/start/build.log"
: >"$LOG"
START=$SECONDS
STEPS=2
[ -f models/demo/config.json ] || STEPS=3

# "12 s" / "3 min 05 s"
elapsed() {
  local s=$1
  if [ "$s" -lt 60 ]; then echo "${s} s"; else printf '%d min %02d s' $((s / 60)) $((s % 60)); fi
}

# A file's size in MB with one decimal.
size_mb() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }

# step N TITLE COMMAND...: runs COMMAND with its output appended to the log.
STEP_START=0
step() {
  local n=$1 title=$2
  shift 2
  STEP_START=$SECONDS
  echo "== [$n/$STEPS] $title"
  echo "=== [$n/$STEPS] $title: $*" >>"$LOG"
  local status=0
  if [ "${COLIBRI_VERBOSE:-0}" = 1 ]; then
    "$@" 2>&1 | tee -a "$LOG" || status=$?
  else
    "$@" >>"$LOG" 2>&1 || status=$?
  fi
  if [ "$status" != 0 ]; then
    echo "!! [$n/$STEPS] $title failed after $(elapsed $((SECONDS - STEP_START))) (exit $status)." >&2
    echo "!! The last 40 lines of $LOG:" >&2
    tail -n 40 "$LOG" | sed 's/^/   /' >&2
    exit "$status"
  fi
}

# done_step SUMMARY: the step's time and what it built.
done_step() {
  echo "   done in $(elapsed $((SECONDS - STEP_START))): $1"
}

# Crates cargo compiled in the last step ("up to date" when none).
compiled() {
  local n
  n=$(awk '/^=== /{n=0} /^ *Compiling /{n++} END{print n+0}' "$LOG")
  case $n in
  0) echo "up to date" ;;
  1) echo "1 crate compiled" ;;
  *) echo "$n crates compiled" ;;
  esac
}

echo "colibri: building, then starting the helper (compiler output: $LOG)"
[ -x "$TARGET_DIR/release/coli" ] || echo "   a first build takes about 10 minutes on 2 cores; follow it with: tail -f $LOG"

step 1 "browser engine: Rust -> wasm32 (tools/build-web.sh)" ./tools/build-web.sh
engine="web/pkg/colibri_wasm_bg.wasm $(size_mb web/pkg/colibri_wasm_bg.wasm)"
if [ -f web/pkg-threads/colibri_wasm_bg.wasm ]; then
  engine="$engine, threaded web/pkg-threads/colibri_wasm_bg.wasm $(size_mb web/pkg-threads/colibri_wasm_bg.wasm)"
else
  engine="$engine (no threaded build: COLIBRI_WEB_THREADS=0)"
fi
done_step "$engine, $(compiled)"

step 2 "the helper: coli (cargo build --release)" cargo build --release -p colibri-helper
COLI="$TARGET_DIR/release/coli"
done_step "$COLI $(size_mb "$COLI") with the web app embedded, $(compiled)"

if [ -f models/demo/config.json ]; then
  MODEL=demo
else
  # The browser engine reads converted models; convert a (random) test model once.
  MODEL="$TARGET_DIR/start/qwen3_moe"
  step 3 "models/demo is not in this checkout: converting a random test model instead" \
    bash -c "[ -f '$MODEL/colibri.json' ] || '$COLI' convert tests/fixtures/qwen3_moe -o '$MODEL' --quant f32"
  done_step "$MODEL"
fi

echo "== built in $(elapsed $((SECONDS - START))); starting the helper (Ctrl-C stops it)"
exec "$COLI" serve --model "$MODEL" "$@"
