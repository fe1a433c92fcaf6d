"""The tokenizer, the training documents, the model's config, and `train`."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path

from .common import *  # noqa: F401,F403
from .evaluate import quick_eval
from .prose import *  # noqa: F401,F403
from .questions import STAGE3
from .tasks import *  # noqa: F401,F403


def train_tokenizer(texts: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=4096,
                                   clean_up_tokenization_spaces=False)


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


def make_documents(n_docs: int, seed: int, tasks: Tasks, prose: dict[str, list[str]], stage: int = 1,
                   focus: bool = False):
    """(text, trained character spans) for each document; English docs are trained whole.
    `prose` holds the paragraphs of the public-domain texts ("kjv", "devil"). Stage 2 makes
    multi-turn conversations (and draws from another seed than stage 1)."""
    rng = random.Random(seed if stage == 1 else seed * 1000003 + 2 + focus)
    kinds, weights = zip(*ENGLISH_MIX)
    out = []
    for _ in range(n_docs):
        if stage == 2 and rng.random() >= CONV_ENGLISH_SHARE:
            out.append(render_with_spans(conversation(rng, tasks, FOCUS_TASK_MIX if focus else CONV_TASK_MIX)))
        elif stage == 2 or rng.random() < ENGLISH_SHARE:
            kind = rng.choices(kinds, weights)[0]
            if kind == "story":
                t = story(rng)
            elif kind == "facts":
                t = fact_prose(rng)
            else:
                t = rng.choice(prose[kind])
            t = t + "<|endoftext|>"
            out.append((t, [(0, len(t))]))
        else:
            out.append(render_with_spans(chat_example(rng, tasks, TASK_MIX)))
    return out


def tokenize_documents(hf_tok, docs):
    import numpy as np
    enc = hf_tok._tokenizer.encode_batch([t for t, _ in docs], add_special_tokens=False)
    ids, mask, starts = [], [], []
    for (text, spans), e in zip(docs, enc):
        starts.append(len(ids))
        for tid, (s, _e) in zip(e.ids, e.offsets):
            ids.append(tid)
            mask.append(any(a <= s < b for a, b in spans))
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=bool), np.array(starts, dtype=np.int64)


def model_config(vocab_size: int, tok):
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=16, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=True, max_position_embeddings=1024,
        rope_theta=10000.0, rms_norm_eps=1e-6, router_aux_loss_coef=0.01,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )


def cmd_train(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import GenerationConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    import resource

    def cpu_seconds() -> float:
        """CPU time (user + system) of this process, all its threads, and of waited-for children."""
        r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    load_start = os.getloadavg()
    log(f"load average at start: {load_start}; torch threads {torch.get_num_threads()} "
        f"(inter-op {torch.get_num_interop_threads()}), {os.cpu_count()} CPUs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.focus_words and not args.init:
        raise SystemExit("--focus-words is for a later stage: give --init")
    tasks = Tasks(args.seed, real_words=0.7 if args.focus_words else 0.35)
    STAGE3["cannot"] = 0.5 if args.focus_words else 0.0
    prose = {"kjv": kjv_paragraphs(), "devil": devil_paragraphs()}
    for k, v in prose.items():
        log(f"{k}: {len(v)} paragraphs, {sum(map(len, v))} characters")
    n_docs = args.docs
    stage = 2 if args.init else 1
    docs = make_documents(n_docs, args.seed, tasks, prose, stage, args.focus_words)
    if args.init:
        # Stage 2: continue from a stage-1 model, with its tokenizer (copied byte for byte).
        import shutil
        from transformers import AutoTokenizer
        init = Path(args.init)
        hf_tok = AutoTokenizer.from_pretrained(init)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if init.resolve() != out.resolve():
                shutil.copyfile(init / f, out / f)
        vocab = len(hf_tok)
        log(f"stage 2 from {init}: tokenizer of {vocab} tokens")
    else:
        tok_rng = random.Random(args.seed + 5)
        # The tokenizer sees a sample of the documents, plus all of the Devil's Dictionary and
        # 1000 Bible paragraphs, so that its merges cover general English, not only the tasks.
        docs_en = prose["devil"] + tok_rng.sample(prose["kjv"], 1000)
        tok_texts = [t for t, _ in tok_rng.sample(docs, min(30000, len(docs)))] + docs_en
        tok_texts = [t.replace("<|endoftext|>", "").replace("<|im_start|>", "").replace("<|im_end|>", "") for t in tok_texts]
        hf_tok = train_tokenizer(tok_texts)
        vocab = len(hf_tok)
        log(f"tokenizer: {vocab} tokens ({time.time() - t0:.0f}s)")
        hf_tok.save_pretrained(out, save_jinja_files=False)  # now, before any evaluation sets padding
    ids, mask, starts_np = tokenize_documents(hf_tok, docs)
    log(f"{n_docs} documents -> {len(ids)} tokens, {mask.mean():.2f} of them trained on ({time.time() - t0:.0f}s)")

    if args.init:
        model = Qwen3MoeForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        cfg = model.config
        init_meta = json.loads((Path(args.init) / "training.json").read_text()) \
            if (Path(args.init) / "training.json").exists() else None
    else:
        cfg = model_config(vocab, hf_tok)
        model = Qwen3MoeForCausalLM(cfg)
        init_meta = None
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters")

    T, B = args.seq, args.batch
    steps = args.steps
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    # Warmup-stable-decay: warm up for the first 100 steps, hold, then decay (cosine) over
    # the last 20% of the steps. Up to 80% of the steps the run does not depend on --steps,
    # so a checkpoint taken then can be resumed with another --steps (see --resume) and
    # gives exactly what a fresh run with that --steps gives.
    warm = args.warmup
    decay_from = int(steps * 0.8)

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        if s < decay_from:
            return args.lr
        p = (s - decay_from) / max(1, steps - decay_from)
        return args.lr * (0.03 + 0.97 * 0.5 * (1 + math.cos(math.pi * p)))

    g = torch.Generator().manual_seed(args.seed)
    ids_t = torch.from_numpy(ids)
    mask_t = torch.from_numpy(mask)
    # Rows start at document starts (so that, as at inference, a conversation is seen from
    # position 0), and run on into the following documents.
    doc_starts = torch.from_numpy(starts_np[starts_np + T + 1 <= len(ids)])
    start_step = 0
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    if args.resume:
        st = torch.load(args.resume, weights_only=False)
        if st["step"] > decay_from:
            raise SystemExit(f"checkpoint at step {st['step']} is past the stable phase of --steps {steps}")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        g.set_state(st["gen"])
        torch.set_rng_state(st["torch_rng"])
        start_step = st["step"]
        log(f"resumed from {args.resume} at step {start_step}")
    model.train()
    t_train = time.time()
    cpu_train0 = cpu_seconds()
    load_samples = []
    ema = None
    for step in range(start_step, steps):
        if ckpt and step % 100 == 0 and step <= decay_from and step > start_step:
            torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "gen": g.get_state(),
                        "torch_rng": torch.get_rng_state()}, ckpt)
        starts = doc_starts[torch.randint(len(doc_starts), (B,), generator=g)]
        idx = starts[:, None] + torch.arange(T + 1)[None, :]
        x = ids_t[idx[:, :-1]]
        y = ids_t[idx[:, 1:]].clone()
        y[~mask_t[idx[:, 1:]]] = -100
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        outp = model.model(input_ids=x, output_router_logits=True, use_cache=False)
        sel = y != -100  # logits only where there is a target (saves lm_head work)
        logits = model.lm_head(outp.last_hidden_state[sel])
        ce = F.cross_entropy(logits.float(), y[sel])
        aux = load_balancing_loss_func(outp.router_logits, cfg.num_experts, cfg.num_experts_per_tok, None)
        loss = ce + cfg.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
        if step % 50 == 0 or step == steps - 1:
            load_samples.append(os.getloadavg()[0])
            el = time.time() - t_train
            log(f"step {step}/{steps} loss {ce.item():.3f} (ema {ema:.3f}) aux {aux.item():.3f} "
                f"lr {lr_at(step):.2e} {el:.0f}s, {el / (step + 1 - start_step):.2f}s/step")
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            model.eval()
            acc = quick_eval(model, hf_tok, tasks, 16, args.seed, only=("addition", "subtraction"))
            log("held-out (quick): " + ", ".join(f"{k} {v:.2f}" for k, v in acc.items()))
            model.train()

    model.eval()
    train_s = time.time() - t_train
    train_cpu = cpu_seconds() - cpu_train0
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
        do_sample=False, max_new_tokens=64)
    model.save_pretrained(out, safe_serialization=True)
    meta = {
        "command": " ".join(["python3", "tools/train_demo.py"] + sys.argv[1:]),
        "seed": args.seed, "steps": steps, "batch": B, "seq": T, "lr": args.lr, "documents": n_docs,
        "tokens_in_stream": int(len(ids)), "tokens_seen": steps * B * T, "parameters": n_params,
        "resumed_from_step": start_step,
        "experts_implementation": getattr(cfg, "_experts_implementation", None),
        "stage": stage + bool(args.focus_words), "init": args.init, "previous_stage": init_meta,
        "time": {
            "train_wall_seconds": round(train_s),
            "train_cpu_seconds": round(train_cpu),
            "total_wall_seconds": round(time.time() - t0),
            "total_cpu_seconds": round(cpu_seconds()),
            "idle_2core_estimate_minutes": round(cpu_seconds() / 2 / 60, 1),
            "note": "total = data, tokenizer and training, before the final held-out check; cpu = getrusage "
                    "user+sys of the process (all threads) and its children; idle 2-core estimate = cpu / 2",
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "cpus": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "load_average_1min_during_training": {
                "min": round(min(load_samples), 2), "max": round(max(load_samples), 2),
                "mean": round(sum(load_samples) / len(load_samples), 2), "samples": len(load_samples)},
        },
        "torch": __import__("torch").__version__, "transformers": __import__("transformers").__version__,
        "tokenizers": __import__("tokenizers").__version__, "python": sys.version.split()[0],
    }
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"saved to {out}: {meta}")
    acc = quick_eval(model, hf_tok, tasks, args.final_eval, args.seed)
    log(f"held-out ({args.final_eval} each, transformers): " + ", ".join(f"{k} {v:.3f}" for k, v in acc.items()))
