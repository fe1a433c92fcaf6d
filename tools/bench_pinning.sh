#!/usr/bin/env bash
# Learned pinning vs the plain LRU at run time, on a converted chat model (default: the
# demo). Learns usage.json from one set of chats (coli generate records it), then runs
# `coli bench` on other chats with --pin 0 and with the default pin, at two budgets, and
# prints one JSON record per run (hit rates per tier during decode).
#
#   cargo build --release -p colibri-helper
#   tools/bench_pinning.sh [MODEL_DIR] [RAM_A] [RAM_B]      # default: models/demo 800K 1200K
#
# Needs python3 with the `tokenizers` package (to tokenize the prompts).
set -euo pipefail
cd "$(dirname "$0")/.."
C=${COLI:-target/release/coli}
python3 -c 'import tokenizers' 2>/dev/null ||
  { echo "bench_pinning.sh: needs the Python tokenizers package (pip install tokenizers)" >&2; exit 1; }
SRC=${1:-models/demo}
RAMS=("${2:-800K}" "${3:-1200K}")
M=$(mktemp -d)/model
trap 'rm -rf "$(dirname "$M")"' EXIT
cp -r "$SRC" "$M"
rm -f "$M"/usage.json "$M"/usage.json.lock

chat() { python3 -c 'import sys; print("<|im_start|>user\n" + sys.argv[1] + "<|im_end|>\n<|im_start|>assistant\n")' "$1"; }
ids() { python3 -c 'import sys; from tokenizers import Tokenizer; print(",".join(map(str, Tokenizer.from_file(sys.argv[1]).encode(sys.argv[2], add_special_tokens=False).ids)))' "$M/tokenizer.json" "$(chat "$1")"; }

LEARN=("What is 23 + 45?" "Spell the word garden backwards." "Tell me a short story about a cat."
  "What is the capital of France?" "How many letters are in the word window?" "What is 81 - 37?"
  "Count the items: apple, pear, plum." "Tell me about the sea.")
TEST=("What is 52 + 19?" "Tell me a story about a dog and a boat." "Spell the word river backwards." "What is 64 - 28?")

for q in "${LEARN[@]}"; do
  "$C" generate --model "$M" --prompt "$(chat "$q")" --max-new-tokens 48 --ram all --json >/dev/null
done

for q in "${TEST[@]}"; do
  for ram in "${RAMS[@]}"; do
    for pin in 0 default; do
      flag=()
      [ "$pin" = 0 ] && flag=(--pin 0)
      "$C" bench --model "$M" --ids "$(ids "$q")" --decode-tokens 48 --ram "$ram" "${flag[@]}" --cache warm --probe-bytes 0 |
        python3 -c 'import json, sys
d = json.load(sys.stdin)
print(json.dumps({"prompt": sys.argv[1], "ram": sys.argv[2], "pin": sys.argv[3], "cache": d["expert_cache"]["budget_note"],
                  "pinned_experts": d["expert_cache"]["pinned_experts"], "decode_hit_rate": d["decode"]["hit_rate"],
                  "decode_tokens": d["decode_tokens"], "commit": d.get("commit")}))' "$q" "$ram" "$pin"
    done
  done
done
