#!/usr/bin/env bash
# choose vs generating the answer on the demo model (median of N runs; model load excluded:
# choose's elapsed_ms, generate's ttft_ms + decode time).
cd "$(dirname "$0")/.."
C=${COLI:-target/debug/coli}; N=${N:-11}
R=$'<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n'
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
g=$(for i in $(seq $N); do $C generate --model models/demo --prompt "$R" --max-new-tokens 64 --temperature 0 --json | python3 -c "import json,sys; v=json.load(sys.stdin); n=len(v['ids']); print(v['ttft_ms']+((n-1)/v['decode_tokens_per_second']*1e3 if v['decode_tokens_per_second'] else 0))"; done | med)
a=$(for i in $(seq $N); do $C choose --model models/demo --prompt "What is the capital of Japan?" --options "The capital of Japan is Tokyo.|The capital of Japan is Kyoto.|The capital of Japan is Paris." --json | python3 -c "import json,sys; print(json.load(sys.stdin)['elapsed_ms'])"; done | med)
b=$(for i in $(seq $N); do $C choose --model models/demo --raw --prompt "${R}The capital of Japan is" --options " Tokyo.| Kyoto.| Paris." --json | python3 -c "import json,sys; print(json.load(sys.stdin)['elapsed_ms'])"; done | med)
echo "generate (12 tokens): $g ms; choose, 3 whole-answer options: $a ms; choose, 3 short options after the answer's start (raw): $b ms"
uptime
