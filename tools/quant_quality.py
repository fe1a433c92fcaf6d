#!/usr/bin/env python3
"""Quantization quality of `coli convert` on the trained demo model.

Converts models/demo-hf with each setting, runs `coli logits` teacher-forced on held-out
conversations (the held-out splits of tools/train_demo.py, seed 1234 as in
models/demo-hf/training.json: question and answer, chat template), and compares every
position's next-token distribution with the unquantized checkpoint's:

  KL      mean KL(ref || got) in nats over all positions
  top-1   share of positions whose argmax matches the reference's

Prints a markdown table (and one JSON line per setting with --json). Pure standard
library; needs a built `coli` (COLI=target/release/coli, default target/debug/coli).

    python3 tools/quant_quality.py                      # the default settings below
    python3 tools/quant_quality.py --setting "int4 g32:--quant int4 --group-size 32"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import train_demo  # noqa: E402  (the held-out splits and the chat template)

DEFAULT_SETTINGS = [
    "default (int4):",
    "int8:--quant int8",
    "int4 g64, all int4 but embed/lm_head:--quant int4 --group-size 64 --attn int4 --mlp int4",
    "int4 g32:--quant int4 --group-size 32 --attn int4 --mlp int4",
    "int4 g64, attn+mlp int8:--quant int4 --group-size 64 --attn int8 --mlp int8",
    "int4 g32, attn+mlp int8:--quant int4 --group-size 32 --attn int8 --mlp int8",
]


def coli(*args: str) -> str:
    exe = os.environ.get("COLI", str(ROOT / "target" / "debug" / "coli"))
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"coli {' '.join(args[:2])} failed: {r.stderr.strip()}")
    return r.stdout


def held_out_ids(model: str, n: int, max_len: int) -> list[list[int]]:
    """Token ids of held-out conversations, packed into sequences of at most max_len."""
    tasks = train_demo.Tasks(1234)
    texts = []
    for items in tasks.held_out(n, seed=1234).values():
        for q, a, _ in items:
            texts.append(train_demo.render([{"role": "user", "content": q}, {"role": "assistant", "content": a}]))
    seqs, cur = [], []
    for t in texts:
        out = json.loads(coli("generate", "--model", model, "--prompt", t, "--max-new-tokens", "1", "--json"))
        ids = out["prompt_ids"]
        if cur and len(cur) + len(ids) > max_len:
            seqs.append(cur)
            cur = []
        cur = cur + ids[:max_len]
    if cur:
        seqs.append(cur)
    return seqs


def logits(model: str, ids: list[int], vocab: int, tmp: Path) -> list[list[float]]:
    out = tmp / "logits.bin"
    coli("logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", str(out))
    raw = out.read_bytes()
    flat = struct.unpack(f"<{len(raw) // 4}f", raw)
    return [list(flat[i * vocab : (i + 1) * vocab]) for i in range(len(ids))]


def log_softmax(v: list[float]) -> list[float]:
    m = max(v)
    s = math.log(sum(math.exp(x - m) for x in v))
    return [x - m - s for x in v]


def compare(ref: list[list[float]], got: list[list[float]]) -> tuple[float, float]:
    kl, top = 0.0, 0
    for r, g in zip(ref, got):
        lr, lg = log_softmax(r), log_softmax(g)
        kl += sum(math.exp(a) * (a - b) for a, b in zip(lr, lg))
        top += max(range(len(r)), key=r.__getitem__) == max(range(len(g)), key=g.__getitem__)
    return kl / len(ref), top / len(ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(ROOT / "models" / "demo-hf"))
    ap.add_argument("--n", type=int, default=8, help="held-out conversations per task (8 tasks)")
    ap.add_argument("--setting", action="append", help="'label:coli convert flags' (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    settings = a.setting or DEFAULT_SETTINGS
    vocab = json.loads((Path(a.src) / "config.json").read_text())["vocab_size"]
    seqs = held_out_ids(a.src, a.n, 1000)
    positions = sum(len(s) for s in seqs)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        refs = [logits(a.src, s, vocab, tmp) for s in seqs]
        print(f"{positions} held-out positions in {len(seqs)} sequences; reference: {a.src} (unquantized)\n")
        print("| setting | coli convert flags | weights.bin | KL(ref||got) | top-1 agreement |")
        print("|---|---|---|---|---|")
        for s in settings:
            label, _, flags = s.partition(":")
            dst = tmp / "conv"
            coli("convert", a.src, "-o", str(dst), "--force", *flags.split())
            size = (dst / "weights.bin").stat().st_size
            ref_all, got_all = [], []
            for seq, ref in zip(seqs, refs):
                ref_all += ref
                got_all += logits(str(dst), seq, vocab, tmp)
            kl, top = compare(ref_all, got_all)
            print(f"| {label} | `{flags or '(none)'}` | {size / 2**20:.2f} MiB | {kl:.4f} | {top:.3f} |", flush=True)
            if a.json:
                print(json.dumps({"setting": label, "flags": flags, "bytes": size, "kl": kl, "top1": top}))


if __name__ == "__main__":
    main()
