#!/usr/bin/env bash
# colibri side by side with llama.cpp (native CPU) and wllama (llama.cpp in wasm, in the same
# headless Chromium), on the OLMoE-1B-7B shape with 16 experts (hidden 2048, 16 layers, 16
# experts, top-8, intermediate 1024, vocab 50304, 16 heads), random weights on both sides:
#   colibri, three models of the same shape (the first and last from one bf16 checkpoint):
#     "colibri default": `coli synth --experts 16` then plain `coli convert` (what `coli pull` and
#                        `coli convert` give users: experts int4/g32, attention/dense/output
#                        int8/g128)
#     "colibri gguf-import": `coli convert model.gguf` of the peers' Q4_0 GGUF (the same
#                        integers llama.cpp runs: the comparison is exact)
#     "colibri gguf-q4km": `coli convert model-q4km.gguf` of a Q4_K_M GGUF of the same shape made
#                        by llama.cpp's own quantizer (tools/bench/quantize_gguf.py, from an
#                        f16 GGUF): the mix people download (Q4_K, and Q6_K for the output,
#                        half of attn_v and ffn_down), against "llama.cpp Q4_K_M" on that file
#     "colibri gguf-q4k": `coli convert model-q4k.gguf` of a GGUF whose every matrix is Q4_K
#                        (make_gguf.py --type q4_k; kept as q4_k), against "llama.cpp Q4_K"
#     "colibri": `coli convert --quant int4 --attn int4 --lm-head int4` (g32: 4.5 bits like Q4_0)
#     "colibri bf16": the bf16 checkpoint read directly (`coli chat --model HF_DIR`, what a
#                        first-time user runs), against "llama.cpp f16" on an f16 GGUF of the
#                        same shape (random weights of their own: two bytes per weight on both sides)
#   peers:   a Q4_0 GGUF of the same shape (tools/bench/make_gguf.py, the `gguf` PyPI package),
#            and the Q4_K_M / Q4_K ones when gguf-q4km / gguf-q4k are among --colibri-models
# and the memory read bandwidth (tools/bench/membw.c), all in one run, interleaved, several
# repetitions. Not a test: nothing is asserted, timings are reported.
#
#   tools/bench_peers.sh [--quick] [--reps N] [--threads "1 2"] [--work DIR] [--out DIR]
#                        [--no-build] [--no-browser] [--colibri-browser-threads "1"]
#                        [--colibri-models "default gguf-import gguf-q4km int4"] [--colibri-browser-models "default int4"]
#
#   --quick     2 layers instead of 16, 32 prompt / 16 decode tokens, 1 repetition (a few
#               minutes once the models exist; for developing this script)
#   --reps N    repetitions (default 3); each one runs every engine at every thread count
#   --work DIR  where the models, the Python venv and the membw binary live (default
#               $COLIBRI_BENCH_WORK or /work/tmp-models/bench; never inside git). Models
#               are made once and reused: ~4 GB bf16 checkpoint, ~1.1 GB int4 container,
#               ~1.2 GB GGUF for the full shape. A container that this coli refuses (a
#               format bump) is converted again.
#   --out DIR   results (default WORK/results-UTC-TIMESTAMP): records.jsonl, summary.md, logs
#   --no-build  use target/release/coli (or $COLI) as it is (default: tools/build-web.sh when web/pkg is
#               missing, then cargo build --release -p colibri-helper)
#   --colibri-models LIST  which native colibri rows to run: default, gguf-import, gguf-q4km,
#               gguf-q5km (llama.cpp's Q5_K_M mix, made the same way) and gguf-q4k (each with
#               its llama.cpp row on the same file), int4, bf16 (with "llama.cpp f16"; default
#               "default gguf-import gguf-q4km int4")
#   --colibri-browser-models LIST  which models colibri's browser engine (wasm CPU backend)
#               runs, of the same ones (a K-quant one named in --colibri-models too;
#               default "default int4": what users get, then the
#               tuned one); each row's "vs colibri native" is against the native row of the
#               same model
#   --colibri-browser-threads  thread counts for colibri's browser engine (default: those of
#               --threads; more than one runs web/pkg-threads, the wasm-threads build)
#   --browser-prompt N, --browser-decode N  prompt and decode tokens of the browser runs
#               (default 32 and 16: wllama does well under 1 token/s on 2 busy cores)
#
# Per repetition and thread count T: membw T, `coli bench --ram all --cache warm --warmup --threads T`
# of each colibri model (--colibri-models "default gguf-import int4" picks them; default all three),
# llama.cpp T (node-llama-cpp's prebuilt CPU binaries), wllama T, colibri browser (cpu).
# Each engine run prefills P pseudo-random prompt ids in one batch (P = 128 native, 32 in the
# browser) and then decodes D tokens greedily after them (64 native, 16 in the browser); it prints two JSON records (phase "prefill" and
# "decode") on stdout and appends them to records.jsonl: engine, where, threads, phase,
# tokens_per_second, model_bytes_per_token, bandwidth_bytes_per_second (measured with T
# threads in the same repetition), bandwidth_share (= tok/s x bytes/token / bandwidth),
# commit, load_average, cpu_model. summary.md has the medians (the table of
# docs/benchmarks.md). On a shared machine the load average in every record says how much
# to trust it.
#
# Installs what it needs from the package registries only: a venv with gguf + numpy (PyPI),
# tools/bench/node_modules (npm install: node-llama-cpp 3.22.1 with its linux-x64 prebuilt
# binaries, @wllama/wllama, playwright-core). Needs python3, node >= 20, npm, cc, cargo,
# and Debian's chromium (CHROMIUM=/path overrides /usr/bin/chromium).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="$ROOT/tools/bench"

QUICK=0 REPS="" THREADS="1 2" BPROMPT="" BDECODE="" CB_THREADS="" CMODELS="default gguf-import gguf-q4km int4" CBMODELS="default int4" WORK="${COLIBRI_BENCH_WORK:-/work/tmp-models/bench}" OUT="" BUILD=1 BROWSER=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --reps) REPS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --work) WORK="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --no-browser) BROWSER=0 ;;
    --colibri-browser-threads) CB_THREADS="$2"; shift ;;
    --colibri-models) CMODELS="$2"; shift ;;
    --colibri-browser-models) CBMODELS="$2"; shift ;;
    --browser-prompt) BPROMPT="$2"; shift ;;
    --browser-decode) BDECODE="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_peers.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "bench_peers.sh: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }

LAYERS=16 EXPERTS=16 TOPK=8 HIDDEN=2048 INTER=1024 HEADS=16 VOCAB=50304 PROMPT=128 DECODE=64
BPROMPT_D=32 BDECODE_D=16
if [ "$QUICK" = 1 ]; then LAYERS=2 PROMPT=32 DECODE=16 BPROMPT_D=16 BDECODE_D=8 REPS="${REPS:-1}"; fi
REPS="${REPS:-3}" BPROMPT="${BPROMPT:-$BPROMPT_D}" BDECODE="${BDECODE:-$BDECODE_D}" CB_THREADS="${CB_THREADS:-$THREADS}"
SHAPE="olmoe-h${HIDDEN}-l${LAYERS}-e${EXPERTS}-k${TOPK}-i${INTER}-v${VOCAB}"
MDIR="$WORK/$SHAPE"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

for tool in python3 node npm cc cargo git; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
[ "$BROWSER" = 0 ] || [ -x "$CHROMIUM" ] || die "no Chromium at $CHROMIUM (apt-get install chromium, or --no-browser)"
case "$(realpath -m "$WORK")/" in "$ROOT"/*) die "--work $WORK is inside the repository; put the models elsewhere" ;; esac
mkdir -p "$MDIR"
OUT="${OUT:-$WORK/results-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT/logs"
say "work dir $WORK, results in $OUT"

# ---- peers and tools -------------------------------------------------------------------
if [ ! -x "$WORK/venv/bin/python" ] || ! "$WORK/venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
  say "python venv with gguf + numpy (PyPI)"
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q "gguf==0.19.0" "numpy>=1.26"
fi
if [ ! -f "$BENCH/node_modules/.package-lock.json" ] || [ "$BENCH/package.json" -nt "$BENCH/node_modules/.package-lock.json" ]; then
  say "npm install in tools/bench (node-llama-cpp prebuilt CPU binaries, wllama, playwright-core)"
  # --omit=optional: node-llama-cpp's optional CUDA/Vulkan/other-OS binaries are not
  # wanted; its linux-x64 CPU package is a direct dependency. --ignore-scripts: nothing
  # may download or build llama.cpp at install time. `npm install`, not `npm ci`: the
  # lock cannot list the other-OS optional packages where a registry mirror lacks them,
  # and npm ci refuses such a lock; the versions are pinned in package.json.
  (cd "$BENCH" && npm install --omit=optional --ignore-scripts --no-audit --no-fund >&2)
fi
[ -f "$BENCH/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/llama-addon.node" ] ||
  die "node-llama-cpp's prebuilt linux-x64 binaries are missing from tools/bench/node_modules"
if [ ! -x "$WORK/membw" ] || [ "$BENCH/membw.c" -nt "$WORK/membw" ]; then
  cc -O3 -march=native -pthread -o "$WORK/membw" "$BENCH/membw.c" || die "cannot compile tools/bench/membw.c"
fi

# ---- colibri ---------------------------------------------------------------------------
COLI="${COLI:-$ROOT/target/release/coli}"
if [ "$BUILD" = 1 ]; then
  if [ "$BROWSER" = 1 ] && { [ ! -f "$ROOT/web/pkg/colibri_wasm_bg.wasm" ] || [ ! -f "$ROOT/web/pkg-threads/colibri_wasm_bg.wasm" ]; }; then
    say "building the browser engine (tools/build-web.sh)"
    "$ROOT/tools/build-web.sh" >&2
  fi
  say "cargo build --release -p colibri-helper"
  (cd "$ROOT" && cargo build --release -p colibri-helper >&2)
fi
[ -x "$COLI" ] || die "$COLI is missing (drop --no-build)"

# ---- models (made once, reused) --------------------------------------------------------
BF16="$MDIR/bf16" MODELS="$MDIR/models" INT4="$MDIR/models/int4-g32" GGUF="$MDIR/model.gguf"
if [ ! -f "$BF16/.complete" ]; then
  say "coli synth ($SHAPE, bf16)"
  rm -rf "$BF16"
  "$COLI" synth -o "$BF16" --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" --hidden "$HIDDEN" \
    --intermediate "$INTER" --heads "$HEADS" --vocab "$VOCAB" >&2
  touch "$BF16/.complete"
fi
if [ ! -f "$BF16/tokenizer.json" ]; then
  # coli synth writes no tokenizer; colibri's browser engine loads one (the same
  # synthetic vocabulary as the GGUF's).
  "$WORK/venv/bin/python" "$BENCH/make_gguf.py" --tokenizer-json "$BF16/tokenizer.json" --vocab "$VOCAB"
  rm -f "$INT4/.complete"
fi
if [ ! -f "$INT4/.complete" ] || ! "$COLI" info "$INT4" >/dev/null 2>"$OUT/logs/coli-info.err"; then
  [ -f "$INT4/.complete" ] && say "this coli refuses $INT4 ($(head -1 "$OUT/logs/coli-info.err")): converting again"
  say "coli convert --quant int4 --attn int4 --lm-head int4 (group 32)"
  rm -rf "$INT4"
  mkdir -p "$MODELS"
  # Like for like with the Q4_0 GGUF (4.5 bits per weight everywhere): int4 group 32 for
  # attention and the output projection too (coli convert's default keeps those int8 for
  # quality: about 27% more bytes per token on this shape).
  "$COLI" convert "$BF16" -o "$INT4" --quant int4 --group-size 32 --attn int4 --lm-head int4 >&2
  touch "$INT4/.complete"
fi
if [ ! -f "$GGUF.json" ]; then
  say "Q4_0 GGUF of the same shape (make_gguf.py)"
  "$WORK/venv/bin/python" "$BENCH/make_gguf.py" "$GGUF" --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" \
    --hidden "$HIDDEN" --intermediate "$INTER" --heads "$HEADS" --vocab "$VOCAB" >"$GGUF.json.tmp"
  mv "$GGUF.json.tmp" "$GGUF.json"
fi
# The K-quant GGUFs: gguf-q4k (every matrix Q4_K, make_gguf.py's plain quantizer) and
# gguf-q4km (llama.cpp's own Q4_K_M mix, llama_model_quantize from an f16 GGUF).
declare -A KFILE=([gguf-q4k]="$MDIR/model-q4k.gguf" [gguf-q4km]="$MDIR/model-q4km.gguf" [gguf-q5km]="$MDIR/model-q5km.gguf")
declare -A KPEER=([gguf-q4k]="llama.cpp Q4_K" [gguf-q4km]="llama.cpp Q4_K_M" [gguf-q5km]="llama.cpp Q5_K_M")
declare -A KFTYPE=([gguf-q4km]=q4_k_m [gguf-q5km]=q5_k_m)
KMODELS=""
for k in gguf-q4k gguf-q4km gguf-q5km; do [[ " $CMODELS " == *" $k "* ]] && KMODELS="$KMODELS $k"; done
gguf_shape() { echo --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" --hidden "$HIDDEN" --intermediate "$INTER" \
  --heads "$HEADS" --vocab "$VOCAB"; }
F16="$MDIR/model-f16.gguf"
make_f16() {
  if [ ! -f "$F16.json" ]; then
    say "f16 GGUF of the same shape (make_gguf.py --type f16), for llama.cpp's quantizer and the bf16 row"
    # shellcheck disable=SC2046
    "$WORK/venv/bin/python" "$BENCH/make_gguf.py" "$F16" --type f16 $(gguf_shape) >"$F16.json.tmp"
    mv "$F16.json.tmp" "$F16.json"
  fi
}
F16_W=""
if [[ " $CMODELS " == *" bf16 "* ]]; then
  make_f16
  # Two bytes per weight on both sides: the f16 GGUF's byte counts stand for the bf16 directory's.
  F16_W=$(cat "$F16.json")
fi
for k in $KMODELS; do
  f="${KFILE[$k]}"
  [ ! -f "$f.json" ] || continue
  if [ "$k" = gguf-q4k ]; then
    say "Q4_K GGUF of the same shape (make_gguf.py --type q4_k)"
    # shellcheck disable=SC2046
    "$WORK/venv/bin/python" "$BENCH/make_gguf.py" "$f" --type q4_k $(gguf_shape) >"$f.json.tmp"
  else
    make_f16
    say "${KFTYPE[$k]} GGUF (llama.cpp's llama_model_quantize, tools/bench/quantize_gguf.py)"
    "$WORK/venv/bin/python" "$BENCH/quantize_gguf.py" "$F16" "$f" --ftype "${KFTYPE[$k]}" >"$f.json.tmp" \
      2>"$OUT/logs/quantize-$k.err"
  fi
  mv "$f.json.tmp" "$f.json"
done
DEF="$MDIR/models/default" GIMP="$MDIR/models/gguf-import"
# The default conversion is made again when this coli's defaults differ from the ones it was
# made with (`.complete` holds a checksum of `coli convert --help`, which states them).
DEF_SIG=$("$COLI" convert --help | cksum | cut -d' ' -f1)
if [[ " $CMODELS $CBMODELS " == *" default "* ]] && { [ "$(cat "$DEF/.complete" 2>/dev/null)" != "$DEF_SIG" ] ||
  ! "$COLI" info "$DEF" >/dev/null 2>&1; }; then
  say "coli convert (the defaults: experts int4 group 32, attention/dense/output int8 group 128)"
  rm -rf "$DEF"
  "$COLI" convert "$BF16" -o "$DEF" >&2
  echo "$DEF_SIG" >"$DEF/.complete"
fi
if [[ " $CMODELS $CBMODELS " == *" gguf-import "* ]] && { [ ! -f "$GIMP/.complete" ] || ! "$COLI" info "$GIMP" >/dev/null 2>&1; }; then
  say "coli convert model.gguf (the peers' Q4_0 GGUF imported as it is)"
  rm -rf "$GIMP"
  "$COLI" convert "$GGUF" -o "$GIMP" >&2
  touch "$GIMP/.complete"
fi
declare -A KW KGW
for k in $KMODELS; do
  dir="$MODELS/$k"
  if [ ! -f "$dir/.complete" ] || ! "$COLI" info "$dir" >/dev/null 2>&1; then
    say "coli convert $(basename "${KFILE[$k]}") (imported as it is)"
    rm -rf "$dir"
    "$COLI" convert "${KFILE[$k]}" -o "$dir" >&2
    touch "$dir/.complete"
  fi
  KW[$k]=$(python3 "$BENCH/report.py" weights-colibri "$dir/colibri.json")
  KGW[$k]=$(cat "${KFILE[$k]}.json")
done
COLI_W=$(python3 "$BENCH/report.py" weights-colibri "$INT4/colibri.json")
DEF_W="" GIMP_W=""
[ ! -f "$DEF/colibri.json" ] || DEF_W=$(python3 "$BENCH/report.py" weights-colibri "$DEF/colibri.json")
[ ! -f "$GIMP/colibri.json" ] || GIMP_W=$(python3 "$BENCH/report.py" weights-colibri "$GIMP/colibri.json")
GGUF_W=$(cat "$GGUF.json")
jget() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

# ---- the runs --------------------------------------------------------------------------
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- . ':!tools/bench_peers.sh' ':!tools/bench' || echo -dirty)"
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
CORES=$(nproc)
RECORDS="$OUT/records.jsonl"
: >"$RECORDS"
declare -A BW

context() { # threads weights-json rep [label]
  python3 - "$1" "$2" "$3" "${BW[$1]:-0}" "$SHAPE" "$COMMIT" "$CPU_MODEL" "$CORES" "${4:-}" <<'EOF'
import json, sys
t, w, rep, bw, shape, commit, cpu, cores, label = sys.argv[1:]
w = json.loads(w)
print(json.dumps({"label": label or None, "threads": int(t), "rep": int(rep), "bandwidth_bytes_per_second": float(bw) or None,
  "bandwidth_threads": int(t), "decode_weight_bytes_per_token": w["decode_weight_bytes_per_token"],
  "all_weight_bytes": w["all_weight_bytes"], "shape": shape, "commit": commit, "cpu_model": cpu,
  "cores": int(cores), "load_average": " ".join(open("/proc/loadavg").read().split()[:3])}))
EOF
}

# run NAME THREADS WEIGHTS REP [LABEL] -- command...: runs one engine, records its two phases
# (LABEL, when given, names the row in place of the engine's own name).
run() {
  local name="$1" t="$2" w="$3" rep="$4" label=""
  shift 4
  if [ "$1" != "--" ]; then label="$1"; shift; fi
  shift
  local log="$OUT/logs/$name-t$t-r$rep"
  local ctx
  ctx=$(context "$t" "$w" "$rep" "$label") # load average taken just before the run
  say "rep $rep: $name, $t thread(s) (load $(cut -d' ' -f1-3 /proc/loadavg))"
  if ! "$@" >"$log.out" 2>"$log.err"; then
    echo "bench_peers.sh: $name ($t threads, rep $rep) failed; last lines of $log.err:" >&2
    tail -5 "$log.err" >&2
    return 0
  fi
  python3 "$BENCH/report.py" record "$log.out" "$ctx" | tee -a "$RECORDS" ||
    echo "bench_peers.sh: could not make a record of $log.out" >&2
}

START=$(date +%s)
for rep in $(seq 1 "$REPS"); do
  for t in $THREADS; do
    bw=$("$WORK/membw" "$t" 1024 5)
    BW[$t]=$(jget "$bw" read_bytes_per_second)
    python3 -c "import json,sys; r=json.loads(sys.argv[1]); r.update(kind='membw', rep=int(sys.argv[2]), load_average=sys.argv[3]); print(json.dumps(r))" \
      "$bw" "$rep" "$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RECORDS"
    # The models users get first (README quotes these rows), then the tuned all-int4 one.
    if [ -n "$DEF_W" ] && [[ " $CMODELS " == *" default "* ]]; then
      run colibri-default "$t" "$DEF_W" "$rep" "colibri default" -- "$COLI" bench --model "$DEF" --ram all --cache warm --warmup \
        --threads "$t" --prompt-tokens "$PROMPT" --decode-tokens $((DECODE + 1)) --probe-bytes 0
    fi
    if [ -n "$GIMP_W" ] && [[ " $CMODELS " == *" gguf-import "* ]]; then
      run colibri-gguf-import "$t" "$GIMP_W" "$rep" "colibri gguf-import" -- "$COLI" bench --model "$GIMP" --ram all --cache warm \
        --warmup --threads "$t" --prompt-tokens "$PROMPT" --decode-tokens $((DECODE + 1)) --probe-bytes 0
    fi
    if [[ " $CMODELS " == *" int4 "* ]]; then
      run colibri-native "$t" "$COLI_W" "$rep" -- "$COLI" bench --model "$INT4" --ram all --cache warm --warmup --threads "$t" \
        --prompt-tokens "$PROMPT" --decode-tokens $((DECODE + 1)) --probe-bytes 0
    fi
    run llama.cpp "$t" "$GGUF_W" "$rep" -- node "$BENCH/llama_native.mjs" --gguf "$GGUF" --threads "$t" \
      --prompt-tokens "$PROMPT" --decode-tokens "$DECODE"
    for k in $KMODELS; do
      run "colibri-$k" "$t" "${KW[$k]}" "$rep" "colibri $k" -- "$COLI" bench --model "$MODELS/$k" --ram all \
        --cache warm --warmup --threads "$t" --prompt-tokens "$PROMPT" --decode-tokens $((DECODE + 1)) --probe-bytes 0
      run "llama.cpp-${k#gguf-}" "$t" "${KGW[$k]}" "$rep" "${KPEER[$k]}" -- node "$BENCH/llama_native.mjs" \
        --gguf "${KFILE[$k]}" --threads "$t" --prompt-tokens "$PROMPT" --decode-tokens "$DECODE"
    done
    if [ -n "$F16_W" ]; then
      run colibri-bf16 "$t" "$F16_W" "$rep" "colibri bf16" -- "$COLI" bench --model "$BF16" --ram all --cache warm --warmup \
        --threads "$t" --prompt-tokens "$PROMPT" --decode-tokens $((DECODE + 1)) --probe-bytes 0
      run llama.cpp-f16 "$t" "$F16_W" "$rep" "llama.cpp f16" -- node "$BENCH/llama_native.mjs" --gguf "$F16" --threads "$t" \
        --prompt-tokens "$PROMPT" --decode-tokens "$DECODE"
    fi
    if [ "$BROWSER" = 1 ]; then
      run wllama "$t" "$GGUF_W" "$rep" -- node "$BENCH/browser.mjs" --engine wllama --gguf "$GGUF" --threads "$t" \
        --prompt-tokens "$BPROMPT" --decode-tokens "$BDECODE" --vocab "$VOCAB"
      if [[ " $CB_THREADS " == *" $t "* ]]; then
        for m in $CBMODELS; do
          case "$m" in
            default) dir="$DEF" w="$DEF_W" label="colibri default" ;;
            gguf-import) dir="$GIMP" w="$GIMP_W" label="colibri gguf-import" ;;
            int4) dir="$INT4" w="$COLI_W" label="colibri" ;;
            gguf-q4k | gguf-q4km | gguf-q5km)
              [ -n "${KW[$m]:-}" ] || die "--colibri-browser-models $m: name it in --colibri-models too"
              dir="$MODELS/$m" w="${KW[$m]}" label="colibri $m" ;;
            *) die "--colibri-browser-models: unknown model $m (default, gguf-import, int4, gguf-q4k, gguf-q4km, gguf-q5km)" ;;
          esac
          run "colibri-browser-$m" "$t" "$w" "$rep" "$label" -- node "$BENCH/browser.mjs" --engine colibri --coli "$COLI" \
            --models-dir "$MODELS" --model "$(basename "$dir")" --threads "$t" --prompt-tokens "$BPROMPT" --decode-tokens "$BDECODE" --vocab "$VOCAB"
        done
      fi
    fi
  done
done

python3 "$BENCH/report.py" summary "$RECORDS" >"$OUT/summary.md"
say "done in $(( $(date +%s) - START )) s; records: $RECORDS"
cat "$OUT/summary.md" >&2
