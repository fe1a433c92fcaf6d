#!/usr/bin/env python3
"""What a model with a recurrent state (Gated DeltaNet: Qwen3.5/3.6-MoE, Qwen3-Next) feeds
again when requests share a prefix, measured from outside against a real `coli serve`.

Two scenes, each in a fresh server (`--kv-cache` default, one model):
  visitors    a widget's visitors: one system prompt (--system-words words), each visitor
              one different question, one after another;
  regenerate  one conversation (the same system prompt and a question), then the same
              request again (the app's Regenerate), --repeats times.
Per request: wall time (max_tokens 1 by default, so nearly all of it is the prompt's
prefill), prompt tokens and `usage.prompt_tokens_details.cached_tokens`. Prints one JSON
record and a Markdown table. --speculate N serves with prompt-lookup speculation (give
--max-tokens too, greedy: the answers' verify passes take snapshots of their own).

    python3 tools/bench/recurrent_reuse.py --coli target/release/coli --model DIR
        [--visitors 5] [--repeats 3] [--system-words 400] [--threads N]
        [--speculate N] [--max-tokens N]
"""

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    ms = (time.monotonic() - t0) * 1000
    if r.status != 200:
        sys.exit(f"request failed: {r.status} {data}")
    u = data["usage"]
    return {"ms": round(ms, 1), "prompt_tokens": u["prompt_tokens"],
            "cached_tokens": u["prompt_tokens_details"]["cached_tokens"]}


def serve(a, data_dir):
    port = free_port()
    cmd = [a.coli, "serve", "--port", str(port), "--model", a.model]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if a.speculate:
        cmd += ["--speculate", str(a.speculate)]
    env = {"XDG_DATA_HOME": data_dir, "PATH": "/usr/bin:/bin"}
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            time.sleep(0.1)
    p.kill()
    sys.exit("the server did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--model", required=True)
    ap.add_argument("--visitors", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--system-words", type=int, default=400)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--speculate", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=1)
    a = ap.parse_args()
    words = ["kind", "brief", "polite", "exact", "calm", "clear", "warm", "honest"]
    system = " ".join(f"{words[i % len(words)]}{i % 10}" for i in range(a.system_words))
    questions = ["Where do birds sleep?", "Why do cats purr?", "How far can a fox run?",
                 "What do whales eat?", "Can owls see colors?", "Do ants ever rest?",
                 "How old do turtles get?", "Why are flamingos pink?"]

    def body(q):
        return {"model": a.model.rstrip("/").split("/")[-1], "max_tokens": a.max_tokens, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]}

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.machine())
    record = {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "model": a.model,
              "system_words": a.system_words, "speculate": a.speculate, "max_tokens": a.max_tokens,
              "scenes": {}}
    for scene in ("visitors", "regenerate"):
        with tempfile.TemporaryDirectory() as d:
            p, port = serve(a, d)
            try:
                # Loads the model (a prompt of another system text, shares nothing).
                post(port, {"model": body("")["model"], "max_tokens": 1,
                            "messages": [{"role": "user", "content": "load"}]})
                if scene == "visitors":
                    runs = [post(port, body(questions[i % len(questions)])) for i in range(a.visitors)]
                else:
                    runs = [post(port, body(questions[0])) for _ in range(1 + a.repeats)]
            finally:
                p.terminate()
                p.wait()
        record["scenes"][scene] = runs
    print(json.dumps(record))
    print("| scene | request | prompt tokens | cached tokens | ms |")
    print("|---|---|---|---|---|")
    for scene, runs in record["scenes"].items():
        for i, r in enumerate(runs):
            print(f"| {scene} | {i + 1} | {r['prompt_tokens']} | {r['cached_tokens']} | {r['ms']} |")


if __name__ == "__main__":
    main()
