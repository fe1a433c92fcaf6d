"""DeepSeek-V4 fixture (tests/fixtures/deepseek_v4) from transformers 5.23's modeling_deepseek_v4.py.

    python3 tools/fixtures_v4.py

A tiny random DeepSeek-V4 saved by `save_pretrained` (bf16 on disk, the names transformers
writes), its teacher-forced logits over 48 ids, and a greedy continuation (8 prompt ids +
24 new ones) through transformers' own cache. It covers:

- every attention type of `layer_types`: sliding_attention, compressed_sparse_attention
  (CSA: compression rate 4 with the overlapping two-series windows, lightning indexer
  keeping `index_topk` = 3 of up to 12 compressed entries), heavily_compressed_attention
  (HCA: rate 8, no overlap, no indexer); a sliding window of 6 over 48 positions;
- both MoE types: `hash_moe` layers routed by a random `tid2eid` table (distinct experts
  per token), `moe` layers by the sqrtsoftplus router with a random correction bias;
- `hc_mult` 3 hyper-connection streams with random `fn`, `base` and `scale` (Sinkhorn-
  Knopp over 20 iterations), the final hyper-head;
- q-LoRA, the grouped low-rank output projection (2 groups), partial rotary (8 of 16 dims,
  interleaved pairs), attention sinks, YaRN on the compressed branches' rope
  (`compress_rope_theta`), the clamped SwiGLU (`swiglu_limit` 1.5) in routed and shared
  experts.

The tokenizer files and the reference's `tokenizer` / `chat` entries are the shared ones of
tests/fixtures/deepseek_v3 (make_fixtures.py's tokenizer), copied as they are.

A seed is rejected when a greedy step's top-2 gap is below 2% of the logits' std, when a
learned router's k-th and (k+1)-th selection scores are closer than 2e-4, or when an indexer's
kept and first dropped compressed entry score closer than 2e-5 of the largest: the engine
sums in another float order than torch and a near-tie could flip a decision.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NAME = "deepseek_v4"
TOKENIZER_FROM = "deepseek_v3"
SEQ_LEN, PROMPT_LEN, NEW_TOKENS = 48, 8, 24
GAP_REL = 2e-2
ROUTER_SCORE_GAP_MIN = 2e-4
SELECT_GAP_MIN = 2e-5
BASE_SEED = 3300
MAX_SEED_TRIES = 60

CONFIG = dict(
    hidden_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    partial_rotary_factor=0.5,
    q_lora_rank=24,
    o_groups=2,
    o_lora_rank=12,
    moe_intermediate_size=16,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=1.5,
    layer_types=[
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    sliding_window=6,
    index_n_heads=8,
    index_head_dim=12,
    index_topk=3,
    hc_mult=3,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=40000.0,
    rope_parameters={
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
    max_position_embeddings=256,
    num_nextn_predict_layers=0,
    tie_word_embeddings=False,
)


def build_config(vocab: int, eos: int):
    return AutoConfig.for_model(
        "deepseek_v4", vocab_size=vocab, bos_token_id=None, eos_token_id=eos, pad_token_id=None, **CONFIG
    )


@torch.no_grad()
def reinit_(model, cfg, gen: torch.Generator) -> None:
    """Every parameter random and far from trivial (hyper-connection bases and scales too)."""
    hidden = cfg.hidden_size

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            v = 1.0 + 0.3 * randn(shape)
        elif name.endswith("embed_tokens.weight"):
            v = randn(shape)
        elif name.endswith("lm_head.weight"):
            v = (2.5 / math.sqrt(hidden)) * randn(shape)
        elif name.endswith("sinks"):
            v = randn(shape)
        elif name.endswith("position_bias"):
            v = 0.7 * randn(shape)
        elif name.endswith(("attn_hc.fn", "ffn_hc.fn", "hc_head.hc_fn")):
            v = (1.5 / math.sqrt(shape[1])) * randn(shape)
        elif name.endswith(("attn_hc.base", "ffn_hc.base", "hc_head.hc_base")):
            v = 0.5 * randn(shape)
        elif name.endswith(("attn_hc.scale", "ffn_hc.scale", "hc_head.hc_scale")):
            v = 1.0 + 0.3 * randn(shape)
        elif name.endswith("mlp.gate.weight"):
            v = (2.5 / math.sqrt(hidden)) * randn(shape)
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            v = (1.2 / math.sqrt(shape[2])) * randn(shape)
        elif p.dim() == 2:
            v = (1.0 / math.sqrt(shape[1])) * randn(shape)
        else:
            raise RuntimeError(f"don't know how to initialise {name} {shape}")
        p.copy_(v.to(p.dtype))
    n_exp, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
        if name.endswith("e_score_correction_bias"):
            b.copy_((0.15 * randn(tuple(b.shape))).to(b.dtype))
        elif name.endswith("tid2eid"):
            rows = [torch.randperm(n_exp, generator=gen)[:k] for _ in range(b.shape[0])]
            b.copy_(torch.stack(rows).to(b.dtype))


class Probes:
    """The smallest learned-router and indexer decision margins of the forward passes."""

    def __init__(self, model):
        self.router_gaps, self.select_gaps, self.handles = [math.inf], [], []
        for _name, mod in model.named_modules():
            kind = type(mod).__name__
            if kind == "DeepseekV4TopKRouter":
                self.handles.append(mod.register_forward_hook(self._router))
            elif kind == "DeepseekV4IndexerScorer":
                self.handles.append(mod.register_forward_hook(self._scorer))

    def _router(self, mod, args, _out):
        flat = args[0].reshape(-1, mod.hidden_dim).double()
        scores = mod.score_fn(flat @ mod.weight.double().T) + mod.e_score_correction_bias.double()
        top = torch.sort(scores, dim=-1, descending=True).values
        self.router_gaps.append(float((top[:, mod.top_k - 1] - top[:, mod.top_k]).min()))

    def _scorer(self, _mod, _args, out):
        # out: [B, S, T] index scores before the causal mask; only rows with more entries than
        # index_topk decide anything; the causal mask is applied by the indexer afterwards,
        # so look at the entries each query may see: those < (pos + 1) // rate.
        self.select_gaps.append(out.detach())

    def close(self):
        for h in self.handles:
            h.remove()


def select_gap(score_rows, rate: int, topk: int, pos0: int) -> float:
    gaps = [math.inf]
    for rows in score_rows:
        s = rows[0]
        for i in range(s.shape[0]):
            visible = (pos0 + i + 1) // rate if s.shape[0] > 1 else s.shape[1]
            visible = min(visible, s.shape[1])
            if visible <= topk:
                continue
            row = torch.sort(s[i, :visible].double(), descending=True).values
            spread = float(row.abs().max()) or 1.0
            gaps.append(float(row[topk - 1] - row[topk]) / spread)
    return min(gaps)


@torch.no_grad()
def evaluate(model, cfg, ids, prompt, bad_ids):
    probes = Probes(model)
    try:
        logits = model(torch.tensor([ids])).logits[0].float()
        gap_tf = select_gap(probes.select_gaps, 4, cfg.index_topk, 0)
        probes.select_gaps = []
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        probes.select_gaps = []
        new_ids = out.sequences[0, len(prompt):].tolist()
        raw = torch.stack([s[0].float() for s in out.logits])
        full = model(torch.tensor([prompt + new_ids])).logits[0].float()
        gap_greedy = select_gap(probes.select_gaps, 4, cfg.index_topk, 0)
        router_gap = min(probes.router_gaps)
    finally:
        probes.close()
    step = full[len(prompt) - 1 : -1]
    top2 = torch.topk(raw, 2, dim=-1).values
    min_gap = float((top2[:, 0] - top2[:, 1]).min())
    std = float(logits.std())
    reasons = []
    if not torch.isfinite(logits).all():
        reasons.append("non-finite logits")
    if std < 0.5:
        reasons.append(f"logits std {std:.3g} too small")
    if len(set(new_ids)) < 10:
        reasons.append("greedy degenerate")
    if set(raw.argmax(-1).tolist()) & bad_ids:
        reasons.append("greedy argmax hits a special / padding id")
    if step.argmax(-1).tolist() != new_ids:
        reasons.append("teacher-forced argmax over the greedy sequence differs")
    if min_gap < GAP_REL * std:
        reasons.append(f"greedy near-tie ({min_gap:.3g})")
    if router_gap < ROUTER_SCORE_GAP_MIN:
        reasons.append(f"router near-tie ({router_gap:.3g})")
    if min(gap_tf, gap_greedy) < SELECT_GAP_MIN:
        reasons.append(f"indexer near-tie ({min(gap_tf, gap_greedy):.3g})")
    res = dict(
        logits=logits,
        std=std,
        new_ids=new_ids,
        min_gap=min_gap,
        decode=raw,
        cache_diff=float((step - raw).abs().max()),
        router_gap=router_gap,
        select_gap=min(gap_tf, gap_greedy),
    )
    return res, reasons


def make_reference(name, dtype_on_disk, vocab, ids, prompt, res, ref0, seed, tok_vocab) -> dict:
    """reference.json of a V4 fixture: the logits and greedy run of `res` (evaluate's
    result), the tokenizer and chat checks of `ref0`, and the seed's diagnostics."""
    return {
        "model_type": name,
        "dtype_on_disk": dtype_on_disk,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "vocab_size": vocab,
        "ids": ids,
        "logits_file": "logits.bin",
        "logits_std": res["std"],
        "greedy": {
            "prompt_ids": prompt,
            "new_ids": res["new_ids"],
            "min_top2_gap": res["min_gap"],
            "logits_file": "decode_logits.bin",
        },
        "tokenizer": ref0["tokenizer"],
        "chat": ref0["chat"],
        "diagnostics": {
            "seed": seed,
            "router_min_selection_score_gap": res["router_gap"],
            "indexer_min_selection_gap": res["select_gap"],
            "hf_cached_vs_uncached_max_abs_logit_diff": res["cache_diff"],
            "tokenizer_vocab_size": tok_vocab,
            "python_version": platform.python_version(),
        },
    }


def main() -> int:
    src = FIXTURES / TOKENIZER_FROM
    ref0 = json.loads((src / "reference.json").read_text())
    tok_vocab = ref0["diagnostics"]["tokenizer_vocab_size"]
    eos = json.loads((src / "config.json").read_text())["eos_token_id"]
    vocab = tok_vocab + 5
    g = torch.Generator().manual_seed(BASE_SEED + 77)
    ids = torch.randint(0, tok_vocab, (SEQ_LEN,), generator=g).tolist()
    prompt = torch.randint(0, tok_vocab, (PROMPT_LEN,), generator=g).tolist()
    bad = set(range(tok_vocab - 3, vocab))
    out_dir = FIXTURES / NAME
    with tempfile.TemporaryDirectory(prefix="fixture_v4_") as tmp:
        for attempt in range(MAX_SEED_TRIES):
            seed = BASE_SEED + attempt
            torch.manual_seed(seed)
            cfg = build_config(vocab, eos)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
            reinit_(model, cfg, torch.Generator().manual_seed(seed))
            model = model.to(torch.bfloat16)
            ckpt = Path(tmp) / f"seed{seed}"
            model.save_pretrained(ckpt)
            loaded = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
            loaded.eval()
            res, reasons = evaluate(loaded, loaded.config, ids, prompt, bad)
            if reasons:
                print(f"seed {seed} rejected: {'; '.join(reasons)}", flush=True)
                continue
            print(f"seed {seed} accepted", flush=True)
            break
        else:
            raise RuntimeError("no acceptable seed")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(ckpt, out_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, out_dir / f)
    (out_dir / "logits.bin").write_bytes(res["logits"].contiguous().numpy().astype("<f4").tobytes())
    (out_dir / "decode_logits.bin").write_bytes(res["decode"].contiguous().numpy().astype("<f4").tobytes())
    reference = make_reference(NAME, "bfloat16", vocab, ids, prompt, res, ref0, seed, tok_vocab)
    (out_dir / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    for p in sorted(out_dir.iterdir()):
        print(f"  {p.name}: {p.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
