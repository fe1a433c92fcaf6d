#!/usr/bin/env python3
"""Train colibri's built-in demo model from scratch: a tiny `qwen3_moe` chat model.

    nice -n 10 python3 tools/train_demo.py train                 # -> models/demo-hf/
    python3 tools/train_demo.py eval --engine hf   --model models/demo-hf
    python3 tools/train_demo.py eval --engine coli --model models/demo-hf   # native path
    python3 tools/train_demo.py compare --model models/demo-hf   # coli vs transformers, token for token
    python3 tools/train_demo.py samples --engine coli --model models/demo-hf
    python3 tools/train_demo.py fingerprint   # hash of the generated data (31791b0f... for seed 1234)

Everything the model learns from is made here, seeded:

  * chat-formatted synthetic tasks whose answers can be checked: two-digit addition and
    subtraction (several phrasings), counting the letters of a word, counting the items
    of a list, spelling a word forwards and backwards, and simple facts from tables held
    in this file (capitals, animal sounds, colours, opposites), plus small talk;
  * general English: short stories and descriptions generated from a small grammar in
    this file, and public-domain prose from two Debian packages, read from the local
    installation (`apt-get install -y bible-kjv bible-kjv-text dict-devil`):
    the King James Bible (1611; bible-kjv-text, read through the `bible` program of
    bible-kjv) and Ambrose Bierce's The Devil's Dictionary (1911; dict-devil).

Each task has a held-out evaluation split that is never trained on:
  * arithmetic: whole (a, b) operand pairs are held out (no phrasing of them is trained);
  * letters / spelling / reverse: held-out made-up words (random syllables) and a held-out
    part of the real word list;
  * counting items: held-out lists;
  * facts: one (fact, phrasing) combination per fact is held out: the fact is learned
    from the other phrasings, and asked in the held-out phrasing.

The tokenizer is a byte-level BPE trained here (tokenizers library) whose pre-tokenizer
splits digits one by one; it is saved with a ChatML chat template inside
tokenizer_config.json (eos `<|im_end|>`).

Requires torch, transformers (5.x) and tokenizers, and for `train` the Debian packages
above. CI never runs this script; the model it wrote is committed under models/demo-hf/.
`train` records its wall time, CPU time (getrusage) and the load average in training.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The whole generator, re-exported: tools/demo_routing_stats.py and tools/quant_quality.py
# use it as `train_demo.Tasks`, `train_demo.render`, ...
from demo_train.common import *  # noqa: E402,F401,F403
from demo_train.evaluate import *  # noqa: E402,F401,F403
from demo_train.fingerprint import cmd_fingerprint  # noqa: E402
from demo_train.prose import *  # noqa: E402,F401,F403
from demo_train.questions import *  # noqa: E402,F401,F403
from demo_train.tables import *  # noqa: E402,F401,F403
from demo_train.tasks import *  # noqa: E402,F401,F403
from demo_train.train import *  # noqa: E402,F401,F403


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", default=str(DEFAULT_OUT))
    t.add_argument("--seed", type=int, default=SEED)
    t.add_argument("--steps", type=int, default=6000)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=128)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--docs", type=int, default=300000)
    t.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: the committed model; with other jobs on the machine, 2 OpenMP threads "
                        "spin-wait for each other and run several times slower)")
    t.add_argument("--eval-every", type=int, default=2000)
    t.add_argument("--final-eval", type=int, default=50)
    t.add_argument("--checkpoint", help="save a resumable checkpoint here every 100 steps of the stable phase")
    t.add_argument("--resume", help="resume from a --checkpoint file (same seed and data options)")
    t.add_argument("--init", help="stage 2: continue training this stage-1 model (and keep its tokenizer) on "
                                  "multi-turn conversations; see docs/demo-model.md")
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--focus-words", action="store_true",
                   help="stage 3: letter tasks on real words 70%% of the time, more of them and more "
                        "out-of-scope questions")
    e = sub.add_parser("eval")
    e.add_argument("--model", default=str(DEFAULT_OUT))
    e.add_argument("--engine", choices=["hf", "coli"], default="coli")
    e.add_argument("--n", type=int, default=200)
    e.add_argument("--seed", type=int, default=SEED)
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--json")
    e.add_argument("--turns", default="1", help="comma-separated: ask each held-out question as this turn "
                                                "of a conversation (e.g. 1,4,8)")
    e.add_argument("--extra", action="store_true", help="also the new phrasings and unseen out-of-scope questions")
    s = sub.add_parser("samples")
    s.add_argument("--model", default=str(DEFAULT_OUT))
    s.add_argument("--engine", choices=["hf", "coli"], default="coli")
    c = sub.add_parser("compare")
    c.add_argument("--model", default=str(DEFAULT_OUT))
    c.add_argument("--max-new-tokens", type=int, default=48)
    f = sub.add_parser("fingerprint", help="hash of the generated data for a seed (unchanged by refactorings)")
    f.add_argument("--seed", type=int, default=SEED)
    f.add_argument("--docs", type=int, default=3000)
    args = ap.parse_args()
    commands = {"train": cmd_train, "eval": cmd_eval, "samples": cmd_samples, "compare": cmd_compare,
                "fingerprint": cmd_fingerprint}
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
