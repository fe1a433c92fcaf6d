#!/usr/bin/env python3
"""N concurrent clients against a real `coli serve` (issue #35): continuous batching measured
from outside, as a user's clients see it. Run by tools/bench_serve_batch.sh.

For each N in --clients: the model files' pages are evicted (posix_fadvise DONTNEED), a fresh
`coli serve --model DIR --parallel P --ram RAM` starts on a free loopback port, one request
loads the model, then N clients start together, each streaming one completion (its own
stretch of --text as the prompt, temperature 1 with its own seed, ignore_eos, --decode
tokens). Per N it reports:
  aggregate decode tok/s  sum over clients of (tokens - 1) / (last token anywhere - first token anywhere)
  p50 / p95 ms per token  over every client's gaps between streamed tokens
  time to first token     p50 over clients (queueing + prefill)
  expert bytes / token    colibri_expert_bytes_read_total's growth / tokens generated (prompts too)
  mean / max batch        colibri_engine_pass_sequences_total / passes, and the max
  engine decode tok/s     colibri_decode_tokens_total / colibri_decode_seconds_total: the
                          decode passes alone (what the batch itself does)
  passes' share           the passes' time (decode and prefill) / the clients' wall time; the
                          rest is the server's own work between passes (sampling, logprobs,
                          detokenizing, sending) and idle gaps
Prints one JSON record and a Markdown table.
"""

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evict(model_dir):
    for root, _, files in os.walk(model_dir):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
    return out


def stream(port, body, record):
    """One streamed completion; record gets the arrival time of every streamed token."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        record["error"] = f"{r.status} {r.read()[:200]!r}"
        return
    times, usage = [], None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    continue
                ev = json.loads(data)
                if ev.get("usage"):
                    usage = ev["usage"]
                # Every step sends an event with its tokens' logprobs (logprobs: 1), also
                # when a token decodes to no text yet.
                lp = (ev.get("choices") or [{}])[0].get("logprobs") or {}
                now = time.monotonic()
                times.extend([now] * len(lp.get("tokens") or []))
    record["times"] = times
    record["tokens"] = (usage or {}).get("completion_tokens", len(times))


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_n(args, n, words):
    evict(args.model)
    port = free_port()
    cmd = [args.coli, "serve", "--model", args.model, "--port", str(port), "--ram", args.ram,
           "--parallel", str(args.parallel), "--max-queue", str(max(32, n))]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{args.out}/serve-{n}.log", "w"))
    try:
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or srv.poll() is not None:
                raise SystemExit(f"coli serve did not start: see {args.out}/serve-{n}.log")
            time.sleep(0.2)
        model = os.path.basename(os.path.normpath(args.model))
        warm = {}
        stream(port, {"model": model, "prompt": "a", "max_tokens": 1, "stream": True}, warm)
        before = metrics(port)
        records = [{} for _ in range(n)]
        threads = []
        for i in range(n):
            start = (i * 997) % max(1, len(words) - args.prompt_words)
            prompt = " ".join(words[start:start + args.prompt_words])
            body = {"model": model, "prompt": prompt, "max_tokens": args.decode, "temperature": 1.0,
                    "seed": 1000 + i, "ignore_eos": True, "stream": True, "logprobs": 1,
                    "stream_options": {"include_usage": True}, "speculate": False}
            threads.append(threading.Thread(target=stream, args=(port, body, records[i])))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = metrics(port)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        raise SystemExit(f"clients failed: {errors}")
    firsts = [r["times"][0] for r in records if r["times"]]
    lasts = [r["times"][-1] for r in records if r["times"]]
    decode_tokens = sum(max(0, len(r["times"]) - 1) for r in records)
    gaps = [1000 * (b - a) for r in records for a, b in zip(r["times"], r["times"][1:])]
    made = after.get("colibri_tokens_generated_total", 0) - before.get("colibri_tokens_generated_total", 0)
    read = after.get("colibri_expert_bytes_read_total", 0) - before.get("colibri_expert_bytes_read_total", 0)
    passes = after.get("colibri_engine_passes_total", 0) - before.get("colibri_engine_passes_total", 0)
    fed = after.get("colibri_engine_pass_sequences_total", 0) - before.get("colibri_engine_pass_sequences_total", 0)
    d_tokens = after.get("colibri_decode_tokens_total", 0) - before.get("colibri_decode_tokens_total", 0)
    d_secs = after.get("colibri_decode_seconds_total", 0) - before.get("colibri_decode_seconds_total", 0)
    p_secs = after.get("colibri_prefill_seconds_total", 0) - before.get("colibri_prefill_seconds_total", 0)
    wall = max(1e-9, max(lasts) - t0)
    return {
        "clients": n,
        "tokens": sum(r["tokens"] for r in records),
        "aggregate_decode_tokens_per_second": decode_tokens / max(1e-9, max(lasts) - min(firsts)),
        "ms_per_token": {"p50": pct(gaps, 0.5), "p95": pct(gaps, 0.95)},
        "time_to_first_token_ms_p50": pct([1000 * (f - t0) for f in firsts], 0.5),
        "expert_bytes_read_per_token": read / max(1, made),
        "mean_batch": fed / max(1, passes),
        "max_batch": after.get("colibri_engine_pass_sequences_max", 0),
        "engine_decode_tokens_per_second": d_tokens / max(1e-9, d_secs),
        "passes_share_of_wall": (d_secs + p_secs) / wall,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", default="1 2 4 8")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ram", default="128M")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=12)
    ap.add_argument("--text", default="docs/architecture.md")
    ap.add_argument("--out", default="/tmp/coli-serve-batch")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    words = open(args.text, encoding="utf-8").read().split()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    recs = []
    for n in [int(x) for x in args.clients.split()]:
        print(f"== {n} clients", file=sys.stderr)
        rec = run_n(args, n, words)
        rec["load_average"] = os.getloadavg()
        recs.append(rec)
    one = recs[0]["aggregate_decode_tokens_per_second"]
    print(f"cpu: {cpu}, cores {os.cpu_count()}, --parallel {args.parallel} --ram {args.ram}, "
          f"{args.decode} tokens per client")
    print("| clients | aggregate decode tok/s | x one | p50 ms/token | p95 ms/token | TTFT p50 ms "
          "| expert bytes read / token | mean batch | engine decode tok/s | passes' share | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        t = r["aggregate_decode_tokens_per_second"]
        print(f"| {r['clients']} | {t:.2f} | {t / one:.2f}x | {r['ms_per_token']['p50']:.1f} "
              f"| {r['ms_per_token']['p95']:.1f} | {r['time_to_first_token_ms_p50']:.0f} "
              f"| {r['expert_bytes_read_per_token'] / 1e6:.2f} MB | {r['mean_batch']:.2f} "
              f"| {r['engine_decode_tokens_per_second']:.2f} | {100 * r['passes_share_of_wall']:.0f}% "
              f"| {r['load_average'][0]:.1f} |")
    print(json.dumps({"cpu": cpu, "runs": recs}))


if __name__ == "__main__":
    main()
