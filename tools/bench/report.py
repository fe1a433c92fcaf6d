#!/usr/bin/env python3
"""Records and summary for tools/bench_peers.sh (standard library only).

    report.py weights-colibri DIR/colibri.json        -> {"decode_weight_bytes_per_token", "all_weight_bytes"}
    report.py record ENGINE_JSON_FILE CONTEXT_JSON     -> one JSON line per phase (decode, prefill)
    report.py summary RECORDS.jsonl                    -> a markdown table (medians over repetitions)

Weight bytes per token: decode reads every dense matrix once (attention, router, norms,
output matrix), one embedding row, and top-k of the layer's experts per layer; prefill of
P tokens reads at least every weight once, so its bytes per token are all weights / P (a
lower bound on the traffic: the share of the bandwidth limit it gives is an upper bound
on how close that phase is to the memory limit, prefill being compute-bound anyway).
"""

import json
import statistics
import sys


def fail(msg):
    sys.exit(f"report.py: {msg}")


def weights_colibri(path):
    m = json.load(open(path))
    cfg = m.get("config", {})
    top_k = cfg.get("num_experts_per_tok")
    if not top_k:
        fail(f"{path}: config.num_experts_per_tok missing")
    dense = 0
    embed = 0
    for t in m["dense"]["tensors"]:
        if t["name"].endswith("embed_tokens.weight"):
            embed += t["length"] // t["shape"][0]  # one row per token
        else:
            dense += t["length"]
    per_token_experts = 0
    all_experts = 0
    for layer in m["experts"]["layers"]:
        parts = layer.get("parts")
        one = sum(p["length"] for p in parts) if parts else statistics.mean(e["length"] for e in layer["experts"])
        per_token_experts += top_k * one
        all_experts += one * len(layer["experts"])
    embed_all = sum(t["length"] for t in m["dense"]["tensors"] if t["name"].endswith("embed_tokens.weight"))
    print(
        json.dumps(
            {
                "decode_weight_bytes_per_token": int(dense + embed + per_token_experts),
                "all_weight_bytes": int(dense + embed_all + all_experts),
            }
        )
    )


def normalize(raw):
    """(engine, where, threads, {phase: (tokens, seconds)}, extra) from one engine's JSON."""
    if raw.get("bench") == "decode":  # coli bench
        phases = {
            "prefill": (raw["prompt_tokens"], raw["prompt_tokens"] / raw["prefill_tokens_per_second"]),
            # coli bench --decode-tokens N: the first token comes from the prefill's logits,
            # and its JSON's decode_tokens (N - 1) counts the timed steps.
            "decode": (raw["decode_tokens"], raw["decode_seconds"]),
        }
        threads = None
        cmd = raw.get("command", [])
        if "--threads" in cmd:
            threads = int(cmd[cmd.index("--threads") + 1])
        extra = {"peak_rss_bytes": raw.get("peak_rss_bytes"), "load_seconds": raw.get("load_seconds")}
        return "colibri", "native", threads, phases, extra
    phases = {
        "prefill": (raw["prefill_tokens"], raw["prefill_seconds"]),
        "decode": (raw["decode_tokens"], raw["decode_seconds"]),
    }
    keep = ("build", "cpu_variant", "threads_used", "threads_reason", "wasm_threads", "multithread", "cross_origin_isolated", "load_ms", "context_threads")
    extra = {k: raw[k] for k in keep if k in raw}
    return raw["engine"], raw.get("where", "native"), raw["threads"], phases, extra


def record(engine_file, context_json):
    ctx = json.loads(context_json)
    text = open(engine_file).read().strip().splitlines()
    lines = [l for l in text if l.startswith("{")]
    if not lines:
        fail(f"{engine_file}: no JSON line in the engine's output")
    raw = json.loads(lines[-1])
    engine, where, threads, phases, extra = normalize(raw)
    engine = ctx.get("label") or engine
    threads = threads if threads is not None else ctx.get("threads")
    bw = ctx.get("bandwidth_bytes_per_second")
    for phase in ("decode", "prefill"):
        tokens, seconds = phases[phase]
        tps = tokens / seconds if seconds > 0 else None
        bpt = ctx["decode_weight_bytes_per_token"] if phase == "decode" else ctx["all_weight_bytes"] / max(tokens, 1)
        share = tps * bpt / bw if (tps and bw) else None
        rec = {
            "engine": engine,
            "where": where,
            "threads": threads,
            "phase": phase,
            "tokens_per_second": tps,
            "tokens": tokens,
            "seconds": seconds,
            "model_bytes_per_token": bpt,
            "bandwidth_bytes_per_second": bw,
            "bandwidth_threads": ctx.get("bandwidth_threads"),
            "bandwidth_share": share,
            "rep": ctx.get("rep"),
            "shape": ctx.get("shape"),
            "commit": ctx.get("commit"),
            "load_average": ctx.get("load_average"),
            "cpu_model": ctx.get("cpu_model"),
            "cores": ctx.get("cores"),
            **extra,
        }
        print(json.dumps(rec))


def summary(path):
    recs = [json.loads(l) for l in open(path) if l.startswith("{")]
    runs = [r for r in recs if r.get("phase") in ("decode", "prefill")]
    bws = [r for r in recs if r.get("kind") == "membw"]
    if not runs:
        fail(f"{path}: no engine records")
    groups = {}
    for r in runs:
        groups.setdefault((r["where"], r["engine"], r["threads"], r["phase"]), []).append(r)
    # Each row against llama.cpp on the same file: the K-quant GGUFs' rows against "llama.cpp
    # Q4_K" / "llama.cpp Q4_K_M", the bf16 directory read directly against llama.cpp on the f16
    # GGUF of the same weights' shape, the others against llama.cpp on the Q4_0 GGUF.
    peers = {"colibri gguf-q4k": "llama.cpp Q4_K", "colibri gguf-q4km": "llama.cpp Q4_K_M",
             "colibri gguf-q5km": "llama.cpp Q5_K_M", "colibri bf16": "llama.cpp f16"}
    peer = lambda engine: peers.get(engine, engine if engine.startswith("llama.cpp") else "llama.cpp")
    ref = {}
    for (where, engine, threads, phase), rs in groups.items():
        if engine.startswith("llama.cpp"):
            ref[(engine, threads, phase)] = statistics.median(x["tokens_per_second"] for x in rs)
    wref, cref = {}, {}
    for (where, engine, threads, phase), rs in groups.items():
        if engine == "wllama":
            wref[(threads, phase)] = statistics.median(x["tokens_per_second"] for x in rs)
        if engine.startswith("colibri") and where == "native":
            cref[(engine, threads, phase)] = statistics.median(x["tokens_per_second"] for x in rs)
    loads = [float(r["load_average"].split()[0]) for r in runs if r.get("load_average")]
    first = runs[0]
    out = []
    out.append(
        f"Shape {first.get('shape')}, commit {first.get('commit')}, {first.get('cpu_model')} "
        f"({first.get('cores')} cores), {len(set(r['rep'] for r in runs))} repetitions, "
        f"1-minute load average {min(loads):.2f}-{max(loads):.2f} during the runs."
    )
    out.append("")
    for t in sorted(set(b["threads"] for b in bws)):
        v = [b["read_bytes_per_second"] / 1e9 for b in bws if b["threads"] == t]
        out.append(f"- memory read bandwidth, {t} thread(s): median {statistics.median(v):.1f} GB/s (range {min(v):.1f}-{max(v):.1f})")
    out.append("")
    out.append(
        "| where | engine | threads | phase | tok/s median | range | vs llama.cpp | vs wllama | vs colibri native | MB/token | share of bandwidth limit |"
    )
    out.append("|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
    order = {"native": 0, "browser": 1}
    eorder = {"llama.cpp": 0, "colibri default": 1, "colibri gguf-import": 2, "colibri": 3,
              "llama.cpp Q4_K_M": 4, "colibri gguf-q4km": 5, "llama.cpp Q5_K_M": 6, "colibri gguf-q5km": 7,
              "llama.cpp Q4_K": 8, "colibri gguf-q4k": 9, "llama.cpp f16": 10, "colibri bf16": 11, "wllama": 12}
    for key in sorted(groups, key=lambda k: (k[3] != "decode", order.get(k[0], 9), k[2], eorder.get(k[1], 9))):
        where, engine, threads, phase = key
        rs = groups[key]
        v = [x["tokens_per_second"] for x in rs]
        med = statistics.median(v)
        r = ref.get((peer(engine), threads, phase))
        w = wref.get((threads, phase))
        # A browser row against the native row of the same model ("colibri default" in
        # the tab against "colibri default" natively).
        c = cref.get((engine, threads, phase))
        shares = [x["bandwidth_share"] for x in rs if x.get("bandwidth_share") is not None]
        used = sorted(set(x.get("threads_used", threads) for x in rs))
        if used != [threads]:
            engine = f"{engine} (ran on {'/'.join(map(str, used))} threads)"
        out.append(
            f"| {where} | {engine} | {threads} | {phase} | {med:.2f} | {min(v):.2f}-{max(v):.2f} | "
            f"{f'{med / r:.2f}x' if r else '-'} | {f'{med / w:.2f}x' if w else '-'} | {f'{med / c:.2f}x' if c else '-'} | "
            f"{rs[0]['model_bytes_per_token'] / 1e6:.0f} | "
            f"{f'{statistics.median(shares) * 100:.0f}%' if shares else '-'} |"
        )
    print("\n".join(out))


def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    cmd = sys.argv[1]
    if cmd == "weights-colibri":
        weights_colibri(sys.argv[2])
    elif cmd == "record" and len(sys.argv) == 4:
        record(sys.argv[2], sys.argv[3])
    elif cmd == "summary":
        summary(sys.argv[2])
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
