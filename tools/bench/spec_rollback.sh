#!/usr/bin/env bash
# One completion with speculative decoding against a fresh `coli serve`: the time of a
# 300-id prompt (a cycle of 37 ids) and 24 greedy tokens, with the server's speculation
# counts. With a draft model that guesses wrong (another seed of the same shape), every
# step's verify pass is rolled back: what that costs a model whose state goes back only
# to snapshots (DeepSeek-V4, Gated DeltaNet). docs/benchmarks.md, "Prompts of a recurrent
# model".
#
#   tools/bench/spec_rollback.sh COLI MODEL_DIR N [DRAFT_DIR]    # N drafts per step (0: none)
set -euo pipefail
COLI=$1 M=$2 SPEC=$3 DRAFT=${4:-}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export XDG_DATA_HOME=$(mktemp -d)
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$XDG_DATA_HOME"' EXIT
"$COLI" serve --port "$PORT" --model "$M" --speculate "$SPEC" ${DRAFT:+--draft "$DRAFT"} >/dev/null 2>&1 &
PID=$!
for _ in $(seq 300); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 0.2; done
python3 - "$PORT" "$(basename "$M")" <<'PY'
import http.client, json, sys, time
port, name = int(sys.argv[1]), sys.argv[2]
def post(body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    d = json.loads(c.getresponse().read())
    if "choices" not in d:
        sys.exit(f"request failed: {d}")
    return d
post({"model": name, "prompt": [1, 2, 3], "max_tokens": 1})  # loads the model
ids = [100 + (i % 37) * 13 for i in range(300)]
t0 = time.monotonic()
d = post({"model": name, "prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
s = time.monotonic() - t0
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/health")
h = json.loads(c.getresponse().read())
print(json.dumps({"seconds": round(s, 2), "completion_tokens": d["usage"]["completion_tokens"],
                  "speculation": h["generations"]["speculation"]}))
PY
