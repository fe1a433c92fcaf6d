#!/usr/bin/env python3
"""How specialised did the demo model's experts become? Routing statistics per layer.

    python3 tools/demo_routing_stats.py [--model models/demo-hf] [--n 60] [--json out.json]

For each task type (held-out questions of each synthetic task, with their reference
answers, plus English text), runs the conversation through transformers with
`output_router_logits=True` and records the top-k experts the router picks for every
token of the assistant's answer (for English text: every token; stories from the
grammar of train_demo.py, and paragraphs of the King James Bible and of The Devil's
Dictionary, which need the Debian packages bible-kjv and dict-devil). Prints, per layer:

  * per task: the share of routing slots that go to each expert, the two most used
    experts, and the entropy of that usage (bits; log2(n_experts) = perfectly uniform);
  * the mutual information I(task; expert) (bits): 0 when every task uses the experts
    in the same proportions, higher when experts specialise by task;
  * per token class (digit / letter-word / punctuation / special): the same entropy.

Requires torch and transformers; uses the task generators of tools/train_demo.py.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_demo as td  # noqa: E402


def entropy(counts) -> float:
    tot = sum(counts)
    return -sum(c / tot * math.log2(c / tot) for c in counts if c) if tot else 0.0


def token_class(tok: str) -> str:
    t = tok.replace("Ġ", "").replace("Ċ", "")
    if tok.startswith("<|"):
        return "special"
    if t.isdigit():
        return "digit"
    if t.isalpha():
        return "word"
    return "punct/space"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(td.DEFAULT_OUT))
    ap.add_argument("--n", type=int, default=60, help="conversations per task")
    ap.add_argument("--seed", type=int, default=td.SEED)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    cfg = model.config
    n_exp, top_k, n_layers = cfg.num_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers

    tasks = td.Tasks(args.seed)
    held = tasks.held_out(args.n, args.seed)
    rng = random.Random(args.seed + 99)
    groups: dict[str, list[tuple[str, list[tuple[int, int]]]]] = {}
    for task, items in held.items():
        if task == "backwards (real words)":
            continue
        groups[task] = [td.render_with_spans([{"role": "user", "content": q}, {"role": "assistant", "content": a}])
                        for q, a, _ in items]
    groups["small talk"] = []
    for qs, ans in td.SMALL_TALK:
        for q in qs:
            groups["small talk"].append(td.render_with_spans([{"role": "user", "content": q},
                                                              {"role": "assistant", "content": rng.choice(ans)}]))
    stories = [td.story(rng) for _ in range(args.n)]
    groups["English (stories)"] = [(s, [(0, len(s))]) for s in stories]
    for name, paras in (("English (KJV Bible)", td.kjv_paragraphs()), ("English (Devil's Dictionary)", td.devil_paragraphs())):
        groups[name] = [(d, [(0, len(d))]) for d in rng.sample(paras, min(args.n, len(paras)))]

    # counts[layer][group][expert]
    counts = [defaultdict(lambda: [0] * n_exp) for _ in range(n_layers)]
    cls_counts = [defaultdict(lambda: [0] * n_exp) for _ in range(n_layers)]
    n_tokens = defaultdict(int)
    for g, convs in groups.items():
        for text, spans in convs:
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = enc["input_ids"]
            keep = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
            with torch.no_grad():
                out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
            toks = tok.convert_ids_to_tokens(ids)
            for layer, rl in enumerate(out.router_logits):
                top = torch.topk(rl.float().softmax(-1), top_k, dim=-1).indices.tolist()
                for i, experts in enumerate(top):
                    if not keep[i]:
                        continue
                    for e in experts:
                        counts[layer][g][e] += 1
                        cls_counts[layer][token_class(toks[i])][e] += 1
            n_tokens[g] += sum(keep)

    report = {"model": args.model, "n_experts": n_exp, "top_k": top_k, "tokens": dict(n_tokens), "layers": []}
    max_h = math.log2(n_exp)
    for layer in range(n_layers):
        per = {}
        tot = [0] * n_exp
        for g, c in counts[layer].items():
            s = sum(c)
            shares = [x / s for x in c]
            top2 = sorted(range(n_exp), key=lambda e: -c[e])[:2]
            per[g] = {"entropy_bits": round(entropy(c), 3), "top": [[e, round(shares[e], 3)] for e in top2],
                      "shares": [round(x, 4) for x in shares]}
            tot = [a + b for a, b in zip(tot, c)]
        # I(task; expert) with tasks weighted equally.
        groups_c = list(counts[layer].values())
        p_e = [sum(c[e] / sum(c) for c in groups_c) / len(groups_c) for e in range(n_exp)]
        mi = entropy([p * 1e6 for p in p_e]) - sum(entropy(c) for c in groups_c) / len(groups_c)
        cls = {k: {"entropy_bits": round(entropy(c), 3),
                   "top": [[e, round(c[e] / sum(c), 3)] for e in sorted(range(n_exp), key=lambda e: -c[e])[:2]]}
               for k, c in cls_counts[layer].items()}
        report["layers"].append({"layer": layer, "mutual_information_task_expert_bits": round(mi, 3),
                                 "overall_entropy_bits": round(entropy(tot), 3), "tasks": per,
                                 "token_classes": cls})

    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        print(f"Experts: {n_exp}, top-{top_k}; uniform usage = {max_h:.2f} bits of entropy.\n")
        for L in report["layers"]:
            print(f"#### Layer {L['layer']}: I(task; expert) = {L['mutual_information_task_expert_bits']:.2f} bits, "
                  f"overall entropy {L['overall_entropy_bits']:.2f} bits\n")
            print("| task | tokens | entropy (bits) | most used experts (share of slots) |")
            print("|---|---:|---:|---|")
            for g, v in L["tasks"].items():
                tops = ", ".join(f"#{e} {s:.0%}" for e, s in v["top"])
                print(f"| {g} | {n_tokens[g]} | {v['entropy_bits']:.2f} | {tops} |")
            print("\n| token class | entropy (bits) | most used experts |")
            print("|---|---:|---|")
            for k, v in sorted(L["token_classes"].items()):
                tops = ", ".join(f"#{e} {s:.0%}" for e, s in v["top"])
                print(f"| {k} | {v['entropy_bits']:.2f} | {tops} |")
            print()
    else:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
