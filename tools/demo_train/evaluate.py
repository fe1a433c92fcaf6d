"""Held-out evaluation (transformers or coli), samples, and coli vs transformers token
for token."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from .common import *  # noqa: F401,F403
from .tasks import *  # noqa: F401,F403


def check(task: str, expected_key, text: str) -> bool:
    text = text.strip()
    if task == "new phrasings (all tasks)":
        return check(expected_key[0], expected_key[1], text)
    if task == "out of scope (unseen questions)":
        return text.startswith("I am a tiny demo model")
    if task in ("addition", "subtraction"):
        m = re.findall(r"=\s*(-?\d+)\.?$", text)
        return bool(m) and m[-1] == expected_key
    if task in ("count letters",):
        m = re.search(r"has (\d+) letters", text)
        return bool(m) and m.group(1) == expected_key
    if task == "count items":
        m = re.search(r"There (?:is|are) (\d+)\.", text)
        return bool(m) and m.group(1) == expected_key
    if task in ("spell backwards", "backwards (real words)"):
        m = re.search(r"Backwards it is ([a-z-]+?)\.?$", text)
        return bool(m) and m.group(1) == expected_key
    if task == "spell":
        m = re.search(r"is spelled ([a-z-]+?)\.?$", text)
        return bool(m) and m.group(1) == expected_key
    if task == "facts":
        return re.search(r"\b" + re.escape(expected_key) + r"\b", text) is not None
    raise ValueError(task)


def hf_generate(model, tok, prompts: list[str], max_new_tokens: int = 64, batch: int = 50) -> list[list[int]]:
    import torch
    outs = []
    tok.padding_side = "left"
    for i in range(0, len(prompts), batch):
        enc = tok(prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            g = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                               eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                               pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
        for row in g[:, enc["input_ids"].shape[1]:].tolist():
            eos = tok.convert_tokens_to_ids("<|im_end|>")
            pad = tok.convert_tokens_to_ids("<|endoftext|>")
            r = []
            for t in row:
                r.append(t)
                if t == eos:
                    break
            outs.append([t for t in r if t != pad])
    return outs


def quick_eval(model, tok, tasks: Tasks, n: int, seed: int, only=None) -> dict[str, float]:
    held = tasks.held_out(n, seed)
    res = {}
    for task, items in held.items():
        if only and task not in only:
            continue
        prompts = [render([{"role": "user", "content": q}], True) for q, _, _ in items]
        gens = hf_generate(model, tok, prompts)
        texts = tok.batch_decode(gens, skip_special_tokens=True)
        res[task] = sum(check(task, key, t) for (_, _, key), t in zip(items, texts)) / len(items)
    return res


def coli_bin() -> str:
    return os.environ.get("COLI", str(ROOT / "target" / "release" / "coli"))


def coli_generate(model_dir: str, prompt: str, max_new_tokens: int = 64) -> dict:
    r = subprocess.run([coli_bin(), "generate", "--model", model_dir, "--prompt", prompt,
                        "--max-new-tokens", str(max_new_tokens), "--temperature", "0", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def eval_prompts(tasks: Tasks, task: str, items: list, turn: int, seed: int) -> list[str]:
    """The held-out questions of `task`, each asked as turn `turn` of a conversation whose
    earlier turns are training-distribution questions with their correct answers (seeded)."""
    if turn == 1:
        return [render([{"role": "user", "content": q}], True) for q, _, _ in items]
    rng = random.Random(f"{seed}/{task}/{turn}")
    kinds, weights = zip(*CONV_TASK_MIX)
    out = []
    for q, _, _ in items:
        msgs = []
        for _ in range(turn - 1):
            hq, ha = chat_turn(rng, tasks, rng.choices(kinds, weights)[0], 0.5)
            msgs += [{"role": "user", "content": hq}, {"role": "assistant", "content": ha}]
        out.append(render(msgs + [{"role": "user", "content": q}], True))
    return out


def cmd_eval(args):
    tasks = Tasks(args.seed)
    held = tasks.held_out(args.n, args.seed, extra=args.extra)
    turns = [int(t) for t in args.turns.split(",")]
    if args.engine == "hf":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        torch.set_num_threads(args.threads)
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model.eval()
    results = {}
    failures = {}
    for turn in turns:
        for task, items in held.items():
            name = task if len(turns) == 1 else f"{task} @ turn {turn}"
            prompts = eval_prompts(tasks, task, items, turn, args.seed)
            if args.engine == "hf":
                texts = tok.batch_decode(hf_generate(model, tok, prompts), skip_special_tokens=True)
            else:
                texts = [coli_generate(args.model, p)["text"] for p in prompts]
            ok = [check(task, key, t) for (_, _, key), t in zip(items, texts)]
            results[name] = {"n": len(items), "correct": sum(ok), "accuracy": round(sum(ok) / len(items), 4)}
            failures[name] = [{"q": q, "expected": a, "got": t} for (q, a, _), t, k in zip(items, texts, ok) if not k][:5]
            log(f"{name}: {sum(ok)}/{len(items)} = {sum(ok) / len(items):.3f}")
    report = {"engine": args.engine, "model": args.model, "n_per_task": args.n, "seed": args.seed,
              "turns": turns, "results": results, "failures": failures}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(results, indent=2))


SAMPLE_PROMPTS = [
    "Hello!", "Who are you?", "What is 47 + 38?", "What is 91 minus 46?", "Add 29 and 64.",
    'How many letters are in "elephant"?', 'Spell "garden" backwards.', "What is the capital of Japan?",
    "What sound does a duck make?", "What colour is the sky?", 'What is the opposite of "fast"?',
    "How many items are in this list: apple, pear, plum, fig?", "Tell me a story.", "Tell me a fact.",
    "Spell river backwards.", "What is the weather like today?",
]


def cmd_samples(args):
    for p in SAMPLE_PROMPTS:
        rendered = render([{"role": "user", "content": p}], True)
        if args.engine == "coli":
            text = coli_generate(args.model, rendered, 160)["text"]
        else:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            tok = AutoTokenizer.from_pretrained(args.model)
            model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
            text = tok.decode(hf_generate(model, tok, [rendered], 160)[0], skip_special_tokens=True)
        print(f"> {p}\n{text}\n")
    for p in ["Once upon a time", "The capital of France", "In the beginning", "Marriage, n."]:
        r = subprocess.run([coli_bin(), "generate", "--model", args.model, "--prompt", p, "--max-new-tokens", "60",
                            "--temperature", "0", "--json"], capture_output=True, text=True, check=True)
        print(f"[completion] {p}{json.loads(r.stdout)['text']}\n")


def cmd_compare(args):
    """coli generate vs transformers' greedy generate, token for token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    prompts = [render([{"role": "user", "content": p}], True) for p in SAMPLE_PROMPTS]
    prompts += ["Once upon a time", "In the beginning"]
    bad = 0
    for p in prompts:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                               eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))[0, len(ids):].tolist()
        c = coli_generate(args.model, p, args.max_new_tokens)
        same = c["ids"] == g and c["prompt_ids"] == ids
        bad += not same
        print(f"{'same' if same else 'DIFFERENT'} ({len(g)} tokens): {p!r}")
        if not same:
            print("  hf:  ", g, "\n  coli:", c["ids"])
    print(f"{len(prompts) - bad}/{len(prompts)} prompts: identical greedy tokens")
    sys.exit(1 if bad else 0)
