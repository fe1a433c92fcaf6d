#!/usr/bin/env python3
"""Generate the tiny Hugging Face MoE test fixtures under tests/fixtures/.

    python3 tools/make_fixtures.py            # (re)write every case
    python3 tools/make_fixtures.py mixtral    # only some cases

For each case this writes a real, randomly initialised (but deliberately far from
trivial) Hugging Face checkpoint saved with `save_pretrained`, a copy of one shared
byte-level BPE tokenizer (trained here with the `tokenizers` library, with a ChatML
chat template), and reference outputs computed with Hugging Face `transformers`:

  * logits.bin      raw little-endian f32, row-major [len(ids), vocab_size]: the
                    teacher-forced logits of reference.json's `ids`;
  * reference.json  ids, greedy continuation, tokenizer encodings, rendered chat.

The reference is computed from the checkpoint as LOADED BACK from disk in float32
(bf16/f16 weights upcast), with eager attention, so it corresponds exactly to the
bytes on disk.

Everything is seeded; re-running with the same python / torch / transformers /
tokenizers versions reproduces the same bytes. The seed of a case is bumped
(deterministically) until the model is "comfortable": no near-tie in the greedy
continuation, no near-tie in the router top-k selection, non-degenerate outputs.

Requires torch, transformers (5.x) and tokenizers; CI never runs this script.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import importlib
import io
import json
import math
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

import fixtures_dsa
import fixtures_gpt_oss
import fixtures_qwen3_5_moe
import fixtures_qwen3_next
from fixtures_probes import Probes, first_moe_layer, n_experts, name_patterns, safetensors_names, sanity_checks

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_VOCAB = 398  # 256 byte symbols + 142 merges; + 3 added special tokens = 401 (prime)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS_MODULES = [
    "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fnmatch",
    "fractions", "functools", "getopt", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac",
    "html", "http", "imaplib", "inspect", "io", "ipaddress", "json", "locale", "logging", "mailbox",
    "numbers", "operator", "optparse", "os", "pathlib", "pickle", "pprint", "queue", "quopri",
    "random", "re", "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socket",
    "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "timeit", "token", "tokenize", "traceback", "types", "typing", "unittest", "uuid", "warnings",
    "wave", "weakref", "zipfile",
]

# A few fixed lines so that digits and multi-byte UTF-8 sequences also get merges.
EXTRA_CORPUS = [
    "Café, crème brûlée, déjà vu, naïve façade, résumé, über, smörgåsbord, El Niño.",
    "Le café est très bon. Où est la bibliothèque? Élève, été, école, père, mère.",
    "日本語のテキスト。日本は島国です。東京、大阪、京都。日本語を勉強しています。",
    "Emoji: 🦀 🚀 🙂 🎉 👍 ❤️ — and a rocket 🚀 next to a crab 🦀.",
    "In 2024 there were 365 days; 12 months, 52 weeks, 24 hours, 60 minutes, 3.14159.",
    "Version 1.2.3 was released on 2023-11-05 at 10:45; 1000 users, 250 bugs, 42 answers.",
]


def tokenizer_corpus() -> list[str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        this = importlib.import_module("this")
    lines = codecs.decode(this.s, "rot13").splitlines()
    for name in CORPUS_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:  # pragma: no cover - platform specific modules
            continue
        doc = mod.__doc__ or ""
        lines.extend(doc.splitlines())
    lines.extend(EXTRA_CORPUS * 4)
    return [ln for ln in lines if ln.strip()]


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def make_hf_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


TOKENIZER_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,\ta tab\nand a newline\n\n    then four spaces of indent",
    "Café déjà vu — naïve façade; 日本語のテキスト 🦀🚀 emoji!",
    "Numbers: 0 7 42 123 4096 65535 3.14159 2024-06-01 +1 -273.15",
    "def square(x):\n    return x ** 2  # comment\n",
    "<|im_start|>user\nspecial tokens inline<|im_end|>\n",
]

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2? Réponds en français, s'il te plaît 🙂"},
]

# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------

SEQ_LEN = 48
PROMPT_LEN = 8
NEW_TOKENS = 24
GAP_REL = 2e-2          # greedy: top1 - top2 >= GAP_REL * logits_std at every step
ROUTER_GAP_MIN = 1e-2   # router: (k-th - (k+1)-th) router logit >= this, every token, every layer
# Sigmoid routers (deepseek_v3) select on sigmoid(logit) + bias, whose slope is at most
# 1/4: a score margin of 2e-4 is a logit margin of at least 8e-4, still ~50x the f32
# error of a router logit here.
ROUTER_SCORE_GAP_MIN = 2e-4
MAX_SEED_TRIES = 200

CASES = {
    "mixtral": dict(
        model_type="mixtral",
        dtype=torch.float32,
        base_seed=1000,
        vocab_extra=0,
        shard=None,
        config=dict(
            hidden_size=88,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=56,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            sliding_window=24,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        dtype=torch.float32,
        base_seed=2000,
        vocab_extra=13,
        shard="350KB",
        config=dict(
            hidden_size=80,
            num_attention_heads=5,
            num_key_value_heads=1,
            num_hidden_layers=3,
            mlp_only_layers=[1],
            intermediate_size=48,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            norm_topk_prob=False,
            qkv_bias=True,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        dtype=torch.bfloat16,
        base_seed=3000,
        vocab_extra=0,
        shard=None,
        config=dict(
            hidden_size=96,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=20,
            num_hidden_layers=2,
            num_experts=32,
            num_experts_per_tok=2,
            moe_intermediate_size=36,
            norm_topk_prob=True,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            tie_word_embeddings=False,
        ),
    ),
    "olmoe": dict(
        model_type="olmoe",
        dtype=torch.float16,
        base_seed=4000,
        vocab_extra=0,
        shard=None,
        config=dict(
            hidden_size=72,
            num_attention_heads=6,
            num_key_value_heads=3,
            num_hidden_layers=2,
            num_experts=24,
            num_experts_per_tok=3,
            intermediate_size=40,
            norm_topk_prob=False,
            clip_qkv=1.75,  # exactly representable; clips roughly 5-10% of q/k/v entries
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        ),
    ),
    # DeepSeek-V3 / Kimi-K2: MLA with a q LoRA, YaRN with mscale != mscale_all_dim (so both
    # the cos/sin attention factor and the softmax-scale mscale differ from 1), interleaved
    # rope, sigmoid router with a random e_score_correction_bias, 4 groups of which 2 are
    # kept, routed_scaling_factor, two shared experts, one dense first layer, 4 shards.
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        # The reference loop over experts (index_add_ in ascending expert order): the
        # default grouped_mm kernel on CPU refuses rows whose stride is not 16 bytes.
        load_kw=dict(experts_implementation="eager"),
        dtype=torch.bfloat16,
        base_seed=5000,
        vocab_extra=7,
        shard="300KB",
        config=dict(
            hidden_size=84,
            num_attention_heads=3,
            num_key_value_heads=3,
            q_lora_rank=44,
            kv_lora_rank=28,
            qk_nope_head_dim=12,
            qk_rope_head_dim=10,
            v_head_dim=14,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            intermediate_size=52,
            n_routed_experts=16,
            n_shared_experts=2,
            moe_intermediate_size=20,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "mscale": 1.0,
                "mscale_all_dim": 0.7,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
            rope_interleave=True,
            num_mtp_layers=0,
            tie_word_embeddings=False,
        ),
    ),
    # The other MLA variant: plain q_proj (q_lora_rank null), rotate-half rope without
    # scaling, one group (no group limit, as Kimi-K2), no renormalisation, every layer MoE,
    # one shared expert, tied embeddings, f16 on disk.
    "deepseek_v3_noqlora": dict(
        model_type="deepseek_v3",
        # The reference loop over experts (index_add_ in ascending expert order): the
        # default grouped_mm kernel on CPU refuses rows whose stride is not 16 bytes.
        load_kw=dict(experts_implementation="eager"),
        dtype=torch.float16,
        base_seed=6000,
        vocab_extra=0,
        shard=None,
        config=dict(
            hidden_size=60,
            num_attention_heads=5,
            num_key_value_heads=5,
            q_lora_rank=None,
            kv_lora_rank=20,
            qk_nope_head_dim=8,
            qk_rope_head_dim=6,
            v_head_dim=10,
            num_hidden_layers=2,
            first_k_dense_replace=0,
            intermediate_size=44,
            n_routed_experts=12,
            n_shared_experts=1,
            moe_intermediate_size=18,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            rope_interleave=False,
            num_mtp_layers=0,
            tie_word_embeddings=True,
        ),
    ),
    # GLM-4.5's shape: GQA with q/k/v biases and per-head q/k norms, partial rotary (half
    # of each head), the deepseek_v3 sigmoid router with bias (one group, as GLM-4.5),
    # routed_scaling_factor, one shared expert, one dense first layer.
    "glm4_moe": dict(
        model_type="glm4_moe",
        dtype=torch.float32,
        base_seed=7000,
        vocab_extra=3,
        shard=None,
        load_kw=dict(experts_implementation="eager"),
        config=dict(
            hidden_size=76,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=20,
            partial_rotary_factor=0.5,
            attention_bias=True,
            use_qk_norm=True,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            intermediate_size=46,
            n_routed_experts=12,
            n_shared_experts=1,
            moe_intermediate_size=22,
            num_experts_per_tok=3,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=1.8,
            norm_topk_prob=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            num_mtp_layers=0,
            tie_word_embeddings=False,
        ),
    ),
}

CASES.update(fixtures_gpt_oss.CASES)
CASES.update(fixtures_qwen3_next.CASES)
CASES.update(fixtures_qwen3_5_moe.CASES)
CASES.update(fixtures_dsa.CASES)

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# --------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------


def build_config(case: dict, tok_vocab: int, special_ids: dict):
    kw = dict(case["config"])
    kw.update(
        vocab_size=tok_vocab + case["vocab_extra"],
        bos_token_id=None,
        eos_token_id=special_ids["<|im_end|>"],
        pad_token_id=None,
    )
    if case["model_type"] == "qwen3_5_moe":  # multimodal: the text config under text_config
        return fixtures_qwen3_5_moe.build_config(case, kw, tok_vocab)
    return AutoConfig.for_model(case["model_type"], **kw)


def text_config(cfg):
    """The language model's config (a multimodal config's text_config)."""
    return getattr(cfg, "text_config", None) or cfg


def model_class(case: dict):
    return fixtures_qwen3_5_moe.MODEL_CLASS if case["model_type"] == "qwen3_5_moe" else AutoModelForCausalLM


@torch.no_grad()
def reinit_(model, cfg, gen: torch.Generator) -> None:
    """Re-initialise every parameter so that the network is far from trivial."""
    hidden = cfg.hidden_size
    tied = bool(getattr(cfg, "tie_word_embeddings", False))

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        special = {
            "gpt_oss": fixtures_gpt_oss.reinit,
            "qwen3_next": fixtures_qwen3_next.reinit,
            "qwen3_5_moe_text": fixtures_qwen3_5_moe.reinit,
        }.get(
            cfg.model_type, lambda *_: None
        )(name, shape, randn, hidden)
        if special is not None:
            v = special
        elif name.endswith("norm.weight"):  # input/post-attention/final norms, q_norm, k_norm
            v = 1.0 + 0.3 * randn(shape)
        elif name.endswith(".bias"):
            v = 0.1 * randn(shape)
        elif name.endswith("embed_tokens.weight"):
            # Tied case: the embedding is also the LM head; keep the logits O(a few).
            v = (0.35 if tied else 1.0) * randn(shape)
        elif name.endswith("lm_head.weight"):
            v = (2.5 / math.sqrt(hidden)) * randn(shape)
        elif name.endswith("mlp.gate.weight"):  # router [E, H]
            v = (2.5 / math.sqrt(hidden)) * randn(shape)
        elif name.endswith("shared_expert_gate.weight"):  # [1, H]
            v = (1.5 / math.sqrt(hidden)) * randn(shape)
        elif name.endswith("experts.gate_up_proj"):  # [E, 2I, H]
            v = (1.2 / math.sqrt(shape[2])) * randn(shape)
        elif name.endswith("experts.down_proj"):  # [E, H, I]
            v = (1.2 / math.sqrt(shape[2])) * randn(shape)
        elif p.dim() == 2:  # nn.Linear [out, in]
            qk = ("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_b_proj.weight")
            gain = 1.6 if name.endswith(qk) else 1.0
            v = (gain / math.sqrt(shape[1])) * randn(shape)
        else:
            raise RuntimeError(f"don't know how to initialise {name} {shape}")
        p.copy_(v.to(p.dtype))
    for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
        if name.endswith("e_score_correction_bias"):  # deepseek_v3: used for selection only
            b.copy_((0.15 * randn(tuple(b.shape))).to(b.dtype))


# --------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model, cfg, case, ids, prompt, bad_new_ids):
    """Compute the reference quantities; return (results, reasons-for-rejection)."""
    probes = Probes(model)
    try:
        # Teacher-forced.
        probes.reset()
        logits = model(torch.tensor([ids])).logits[0].float()
        router_gap_tf = probes.router_min_gap()
        distinct_l0 = probes.distinct_experts(first_moe_layer(cfg))
        clip_frac = probes.clip_fraction(cfg.clip_qkv) if getattr(cfg, "clip_qkv", None) else None

        # Greedy with the KV cache (what transformers users get).
        probes.reset()
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        new_ids = out.sequences[0, len(prompt):].tolist()
        raw = torch.stack([s[0].float() for s in out.logits])  # [NEW_TOKENS, V], unprocessed
        assert len(new_ids) == NEW_TOKENS, new_ids
        top2 = torch.topk(raw, 2, dim=-1).values
        min_gap = float((top2[:, 0] - top2[:, 1]).min())
        raw_argmax = raw.argmax(-1).tolist()

        # Teacher-forced over prompt+new: the uncached logits of every greedy step, plus the
        # router margins along the whole greedy sequence.
        probes.reset()
        full_logits = model(torch.tensor([prompt + new_ids])).logits[0].float()
        router_gap_greedy = probes.router_min_gap()
        step_logits = full_logits[len(prompt) - 1 : -1]
        cache_diff = float((step_logits - raw).abs().max())
        full_argmax = step_logits.argmax(-1).tolist()
    finally:
        probes.close()

    std = float(logits.std())
    reasons = []
    if not torch.isfinite(logits).all() or not torch.isfinite(raw).all():
        reasons.append("non-finite logits")
    if std < 0.5:
        reasons.append(f"logits std {std:.3g} too small")
    if len(set(logits.argmax(-1).tolist())) < 12:
        reasons.append("teacher-forced argmax degenerate")
    if len(set(new_ids)) < 10:
        reasons.append(f"greedy degenerate ({len(set(new_ids))} distinct)")
    if set(raw_argmax) & bad_new_ids:
        # (min_new_tokens would have masked an EOS; we want seeds where greedy never wants one.)
        reasons.append("greedy argmax hits a special / padding id")
    elif raw_argmax != new_ids:
        reasons.append("generate() tokens differ from argmax of raw logits")
    if cache_diff > 1e-3:
        reasons.append(f"cached vs uncached logits differ by {cache_diff:.3g}")
    if full_argmax != new_ids:
        reasons.append("teacher-forced argmax over greedy sequence differs")
    if min_gap < GAP_REL * std:
        reasons.append(f"greedy near-tie (gap {min_gap:.3g} < {GAP_REL * std:.3g})")
    sigmoid_routers = ("deepseek_v3", "glm4_moe") + fixtures_dsa.MODEL_TYPES
    gap_min = ROUTER_SCORE_GAP_MIN if case["model_type"] in sigmoid_routers else ROUTER_GAP_MIN
    if min(router_gap_tf, router_gap_greedy) < gap_min:
        reasons.append(f"router near-tie ({min(router_gap_tf, router_gap_greedy):.3g})")
    if distinct_l0 < 0.6 * n_experts(cfg):
        reasons.append(f"only {distinct_l0} experts used in layer {first_moe_layer(cfg)}")
    if clip_frac is not None and not (0.01 <= clip_frac <= 0.3):
        reasons.append(f"clip fraction {clip_frac:.3g} out of range")

    dsa = {}
    if case["model_type"] in fixtures_dsa.MODEL_TYPES:
        more, dsa = fixtures_dsa.reasons(model, cfg, [ids, prompt + new_ids])
        reasons += more
    res = dict(
        dsa=dsa,
        logits=logits,
        logits_std=std,
        new_ids=new_ids,
        min_top2_gap=min_gap,
        decode_logits=raw,
        router_min_gap=min(router_gap_tf, router_gap_greedy),
        distinct_experts_layer0=distinct_l0,
        clip_fraction=clip_frac,
        cache_diff=cache_diff,
    )
    return res, reasons


# --------------------------------------------------------------------------------------
# Checks on the saved checkpoint
# --------------------------------------------------------------------------------------


def check_checkpoint(d: Path, case: dict, cfg) -> dict:
    names = safetensors_names(d)
    if case["model_type"] not in ("gpt_oss", "qwen3_5_moe"):  # those are published fused
        assert not any("gate_up_proj" in k or k.endswith("experts.down_proj") for k in names), "fused expert tensors"
    n_exp = n_experts(cfg)
    l0 = first_moe_layer(cfg)
    if case["model_type"] == "gpt_oss":
        fixtures_gpt_oss.check_checkpoint(names, case, cfg)
    elif case["model_type"] == "mixtral":
        assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in names
        assert f"model.layers.0.block_sparse_moe.experts.{n_exp - 1}.w2.weight" in names
    elif case["model_type"] == "qwen3_5_moe":
        fixtures_qwen3_5_moe.check_checkpoint(names, cfg)
    else:
        assert f"model.layers.{l0}.mlp.experts.3.gate_proj.weight" in names
        assert f"model.layers.{l0}.mlp.experts.{n_exp - 1}.down_proj.weight" in names
    want = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[DTYPE_NAMES[case["dtype"]]]
    dtypes = {v[1] for v in names.values()}
    assert dtypes == ({want, "U8"} if case.get("mxfp4") else {want}), dtypes
    shards = sorted(f.name for f in d.glob("*.safetensors"))
    if case["shard"]:
        assert len(shards) >= 3 and (d / "model.safetensors.index.json").exists(), shards
    else:
        assert shards == ["model.safetensors"], shards
    return dict(names=names, shards=shards)


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def make_case(name: str, case: dict, hf_tok_template, tok_vocab: int, special_ids: dict, log) -> dict:
    out_dir = FIXTURES / name
    dtype = case["dtype"]

    g = torch.Generator().manual_seed(case["base_seed"] + 77)
    ids = torch.randint(0, tok_vocab, (case.get("seq_len", SEQ_LEN),), generator=g).tolist()
    prompt = torch.randint(0, tok_vocab, (PROMPT_LEN,), generator=g).tolist()
    bad_new_ids = set(special_ids.values())

    cfg0 = build_config(case, tok_vocab, special_ids)
    bad_new_ids |= set(range(tok_vocab, text_config(cfg0).vocab_size))

    with tempfile.TemporaryDirectory(prefix=f"fixture_{name}_") as tmp:
        tmp = Path(tmp)
        for attempt in range(MAX_SEED_TRIES):
            seed = case["base_seed"] + attempt
            ckpt = tmp / f"seed{seed}"
            torch.manual_seed(seed)
            cfg = build_config(case, tok_vocab, special_ids)
            cls = model_class(case)
            build = cls.from_config if cls is AutoModelForCausalLM else cls._from_config
            model = build(cfg, attn_implementation="eager", **case.get("load_kw", {}))
            reinit_(model, text_config(cfg), torch.Generator().manual_seed(seed))
            if case.get("mxfp4"):
                fixtures_gpt_oss.quantize_experts_(model)
            model = model.to(dtype)
            save_kw = {"max_shard_size": case["shard"]} if case["shard"] else {}
            model.save_pretrained(ckpt, **save_kw)
            del model
            if case.get("mxfp4"):
                fixtures_gpt_oss.write_mxfp4_layout(ckpt)
            if case["model_type"] == "qwen3_5_moe":
                fixtures_qwen3_5_moe.fuse_experts(ckpt)

            loaded = model_class(case).from_pretrained(
                ckpt, dtype=torch.float32, attn_implementation="eager", **case.get("load_kw", {})
            )
            loaded.eval()
            lcfg = text_config(loaded.config)
            res, reasons = evaluate(loaded, lcfg, case, ids, prompt, bad_new_ids)
            if reasons:
                log(f"  {name}: seed {seed} rejected: {'; '.join(reasons)}")
                shutil.rmtree(ckpt)
                continue
            log(f"  {name}: seed {seed} accepted")
            break
        else:
            raise RuntimeError(f"{name}: no acceptable seed in {MAX_SEED_TRIES} tries")

        ck = check_checkpoint(ckpt, case, lcfg)
        extra = sanity_checks(name, loaded, lcfg) if case["model_type"] != "qwen3_5_moe" else {}
        if case["model_type"] == "gpt_oss":
            extra.update(fixtures_gpt_oss.sanity_checks(name, loaded, lcfg, ids))
        if case["model_type"] == "qwen3_next":
            extra.update(fixtures_qwen3_next.sanity_checks(name, loaded, lcfg, ids))
        if case["model_type"] == "qwen3_5_moe":
            extra.update(fixtures_qwen3_5_moe.sanity_checks(loaded, lcfg, ids))

        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(ckpt, out_dir)

    # Tokenizer: save, reload through transformers, and compare against the raw tokenizers lib.
    hf_tok_template.save_pretrained(out_dir, save_jinja_files=False)
    tok = AutoTokenizer.from_pretrained(out_dir)
    raw_tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tok_refs = []
    for text in TOKENIZER_TEXTS:
        enc = tok.encode(text, add_special_tokens=False)
        assert enc == raw_tok.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(enc) == text, (text, tok.decode(enc))
        tok_refs.append({"text": text, "ids": enc})
    rendered = tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
    chat_ids = tok.encode(rendered, add_special_tokens=False)
    assert chat_ids == raw_tok.encode(rendered, add_special_tokens=False).ids
    tmpl_ids = tok.apply_chat_template(CHAT_MESSAGES, tokenize=True, add_generation_prompt=True)
    if isinstance(tmpl_ids, dict) or hasattr(tmpl_ids, "keys"):
        tmpl_ids = tmpl_ids["input_ids"]
    assert list(tmpl_ids) == chat_ids, (tmpl_ids, chat_ids)
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in CHAT_MESSAGES)
    assert rendered == expected + "<|im_start|>assistant\n", rendered

    logits = res["logits"]
    assert tuple(logits.shape) == (len(ids), lcfg.vocab_size)
    (out_dir / "logits.bin").write_bytes(logits.contiguous().numpy().astype("<f4").tobytes())
    greedy = {"prompt_ids": prompt, "new_ids": res["new_ids"], "min_top2_gap": res["min_top2_gap"]}
    if case.get("decode_logits"):
        # transformers' logits of every greedy step through its cache: row i predicts new_ids[i].
        dec = res["decode_logits"]
        assert tuple(dec.shape) == (NEW_TOKENS, lcfg.vocab_size)
        (out_dir / "decode_logits.bin").write_bytes(dec.contiguous().numpy().astype("<f4").tobytes())
        greedy["logits_file"] = "decode_logits.bin"

    reference = {
        "model_type": case["model_type"],
        "dtype_on_disk": DTYPE_NAMES[dtype],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "vocab_size": lcfg.vocab_size,
        "ids": ids,
        "logits_file": "logits.bin",
        "logits_std": res["logits_std"],
        "greedy": greedy,
        "tokenizer": tok_refs,
        "chat": {"messages": CHAT_MESSAGES, "rendered": rendered, "ids": chat_ids},
        "diagnostics": {
            "seed": seed,
            "router_min_topk_logit_gap": res["router_min_gap"],
            f"distinct_experts_layer{first_moe_layer(lcfg)}": res["distinct_experts_layer0"],
            "num_experts": n_experts(lcfg),
            "qkv_clip_fraction": res["clip_fraction"],
            "hf_cached_vs_uncached_max_abs_logit_diff": res["cache_diff"],
            **res["dsa"],
            "tokenizer_vocab_size": tok_vocab,
            "python_version": platform.python_version(),
            "tokenizers_version": tokenizers.__version__,
            **extra,
        },
    }
    (out_dir / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())}
    return dict(
        name=name,
        seed=seed,
        files=files,
        total=sum(files.values()),
        logits_std=res["logits_std"],
        min_top2_gap=res["min_top2_gap"],
        router_min_gap=res["router_min_gap"],
        distinct=res["distinct_experts_layer0"],
        num_experts=n_experts(lcfg),
        clip_fraction=res["clip_fraction"],
        patterns=name_patterns(ck["names"]),
        shards=ck["shards"],
        config_keys=sorted(json.loads((out_dir / "config.json").read_text()).keys()),
        new_ids=res["new_ids"],
        extra=extra,
    )


@torch.no_grad()
def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass

    wanted = argv or list(CASES)
    for w in wanted:
        if w not in CASES:
            print(f"unknown case {w!r}; choose from {list(CASES)}", file=sys.stderr)
            return 2

    tok = train_tokenizer()
    again = train_tokenizer()
    assert tok.to_str() == again.to_str(), "BPE training is not deterministic"
    tok_vocab = tok.get_vocab_size()
    special_ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    hf_tok = make_hf_tokenizer(tok)

    FIXTURES.mkdir(parents=True, exist_ok=True)
    summaries = []
    for name in wanted:
        print(f"[{name}]", flush=True)
        summaries.append(make_case(name, CASES[name], hf_tok, tok_vocab, special_ids, lambda s: print(s, flush=True)))

    print()
    print(f"tokenizer: vocab {tok_vocab} (BPE {BPE_VOCAB} + specials {special_ids})")
    for s in summaries:
        print(f"== {s['name']} (seed {s['seed']}) total {s['total']} bytes")
        for fn, sz in s["files"].items():
            h = hashlib.sha256((FIXTURES / s["name"] / fn).read_bytes()).hexdigest()[:12]
            print(f"   {sz:>9}  {fn}  {h}")
        print(f"   logits_std {s['logits_std']:.4f}  min_top2_gap {s['min_top2_gap']:.4f} "
              f"(rel {s['min_top2_gap'] / s['logits_std']:.4f})  router_min_gap {s['router_min_gap']:.4f}")
        print(f"   distinct experts layer0: {s['distinct']}/{s['num_experts']}"
              + (f"  qkv clip fraction {s['clip_fraction']:.4f}" if s["clip_fraction"] is not None else ""))
        print(f"   greedy new_ids {s['new_ids']}")
        print(f"   shards {s['shards']}")
        print("   tensor patterns:")
        for p in s["patterns"]:
            print(f"     {p}")
        print(f"   config keys: {s['config_keys']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
