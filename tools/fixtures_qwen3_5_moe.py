"""qwen3_5_moe fixtures for tools/make_fixtures.py: the case, how its multimodal model is
built, initialised and checked.

qwen3_5_moe (transformers' modeling_qwen3_5_moe.py, Qwen3.5-35B-A3B / 397B-A17B) is published
as an image-text model (`Qwen3_5MoeForConditionalGeneration`): config.json holds the language
model's shape under `text_config` (model_type `qwen3_5_moe_text`) and a `vision_config`; the
weights sit under `model.language_model.*` (the text tower), `model.visual.*` (the vision
tower) and `lm_head.weight`. Its text tower is qwen3_next's hybrid stack with these
differences:

* Gated DeltaNet projections are separate and not grouped per key head: `in_proj_qkv`
  (q of every key head, then k, then v of every value head: the conv's channel order),
  `in_proj_z` (value-head order), `in_proj_b`, `in_proj_a` (one row per value head),
  instead of qwen3_next's `in_proj_qkvz` / `in_proj_ba` grouped per key head.
* Every layer's FFN is a routed MoE block (no `mlp_only_layers`, no `decoder_sparse_step`);
  the router always renormalises its top-k (no `norm_topk_prob`).
* RoPE is interleaved M-RoPE (`mrope_section`, `mrope_interleaved`) over the partial rotary
  dims; for text the three position streams are equal, so it is plain partial RoPE.
* The routed experts are stored fused, as transformers holds them in memory:
  `mlp.experts.gate_up_proj` [E, 2 * moe_intermediate, hidden] and `mlp.experts.down_proj`
  [E, hidden, moe_intermediate] (no `.weight`); `fuse_experts` rewrites the per-expert
  tensors `save_pretrained` writes into that layout before the reference is computed.
* `mtp.*` (multi-token prediction) weights, which transformers ignores.

The vision tower here is the smallest transformers builds (one block); the text path is what
the reference exercises (text-only inputs), and the sequence (80 ids) is longer than
transformers' 64-token chunk of the delta rule, so its prefill runs two chunks.
"""

from __future__ import annotations

import math

import torch
from transformers import AutoConfig, Qwen3_5MoeForConditionalGeneration

import fixtures_qwen3_next

MODEL_TYPE = "qwen3_5_moe"

CASES = {
    # bf16, sharded like the release; linear, linear, full, linear (the release's
    # full_attention_interval 4), 2 value heads per key head, conv kernel 4, partial rotary
    # 0.25 of head_dim 24 with an M-RoPE section, a shared expert with its sigmoid gate.
    "qwen3_5_moe": dict(
        model_type=MODEL_TYPE,
        dtype=torch.bfloat16,
        base_seed=9700,
        vocab_extra=5,
        shard="200KB",
        seq_len=80,
        load_kw=dict(experts_implementation="eager"),
        decode_logits=True,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=12,
            linear_value_head_dim=10,
            linear_conv_kernel_dim=4,
            num_experts=10,
            num_experts_per_tok=3,
            moe_intermediate_size=20,
            shared_expert_intermediate_size=28,
            max_position_embeddings=256,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 1],
                "mrope_interleaved": True,
            },
            tie_word_embeddings=False,
        ),
    ),
}


def build_config(case: dict, text_kw: dict, tok_vocab: int):
    """The composite config: `text_kw` (the case's text config with vocab and token ids) under
    `text_config`, a one-block vision tower, and the image/video token ids in the padding
    past the tokenizer (never produced by it)."""
    vision = dict(
        depth=1,
        hidden_size=16,
        num_heads=2,
        intermediate_size=20,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
        out_hidden_size=text_kw["hidden_size"],
        num_position_embeddings=16,
    )
    return AutoConfig.for_model(
        MODEL_TYPE,
        text_config=dict(text_kw),
        vision_config=vision,
        image_token_id=tok_vocab,
        video_token_id=tok_vocab + 1,
        vision_start_token_id=tok_vocab + 2,
        vision_end_token_id=tok_vocab + 3,
        tie_word_embeddings=text_kw.get("tie_word_embeddings", False),
    )


MODEL_CLASS = Qwen3_5MoeForConditionalGeneration


def reinit(name: str, shape: tuple, randn, hidden: int):
    """Parameters the generic initialisation does not know; None for the others."""
    if name.startswith("model.visual."):  # never runs on text inputs; small and finite
        return 0.02 * randn(shape)
    if name.endswith(("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight")):
        return (1.0 / math.sqrt(shape[1])) * randn(shape)
    return fixtures_qwen3_next.reinit(name, shape, randn, hidden)


def check_checkpoint(names: dict, cfg) -> None:
    """The multimodal layout, as published."""
    lm = "model.language_model."
    assert f"{lm}embed_tokens.weight" in names and f"{lm}norm.weight" in names and "lm_head.weight" in names
    assert any(k.startswith("model.visual.") for k in names), "no vision tower"
    assert not any(k.startswith("model.layers.") for k in names), "text weights outside model.language_model"
    for l, t in enumerate(cfg.layer_types):
        p = f"{lm}layers.{l}."
        gu = names[f"{p}mlp.experts.gate_up_proj"][0]
        assert gu == (cfg.num_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size), gu
        assert names[f"{p}mlp.experts.down_proj"][0] == (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        assert f"{p}mlp.experts.0.gate_proj.weight" not in names, "fused experts, as published"
        assert f"{p}mlp.shared_expert_gate.weight" in names
        if t == "linear_attention":
            for proj in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
                assert f"{p}linear_attn.{proj}.weight" in names, proj
        else:
            assert names[f"{p}self_attn.q_proj.weight"][0][0] == 2 * cfg.num_attention_heads * cfg.head_dim


@torch.no_grad()
def sanity_checks(model, cfg, ids) -> dict:
    """The hard parts are really exercised: DeltaNet decays spread, the recurrent state
    carries information, the vision tower is present but unused."""
    extra = {}
    lm = model.model.language_model
    layers = lm.layers
    kinds = [type(l.linear_attn if hasattr(l, "linear_attn") else l.self_attn).__name__ for l in layers]
    assert kinds == [
        "Qwen3_5MoeGatedDeltaNet" if t == "linear_attention" else "Qwen3_5MoeAttention" for t in cfg.layer_types
    ], kinds
    assert all(type(l.mlp).__name__ == "Qwen3_5MoeSparseMoeBlock" for l in layers)
    rot = lm.rotary_emb
    assert rot.inv_freq.numel() == int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]) // 2

    decays = []

    def hook(mod):
        def f(_m, _i, out):
            g = -mod.A_log.float().exp() * torch.nn.functional.softplus(out.float() + mod.dt_bias)
            decays.append(g.exp().flatten())

        return f

    handles = [
        l.linear_attn.in_proj_a.register_forward_hook(hook(l.linear_attn)) for l in layers if hasattr(l, "linear_attn")
    ]
    try:
        base = model(torch.tensor([ids])).logits
    finally:
        for h in handles:
            h.remove()
    d = torch.cat(decays)
    extra["decay_mean"] = float(d.mean())
    extra["decay_min"] = float(d.min())
    extra["decay_max"] = float(d.max())
    assert 0.2 < extra["decay_mean"] < 0.95, extra

    moved_ids = list(ids)
    moved_ids[0] = (moved_ids[0] + 1) % 200
    moved = model(torch.tensor([moved_ids])).logits
    extra["late_logit_move_from_token0"] = float((moved[0, -8:] - base[0, -8:]).abs().max())
    assert extra["late_logit_move_from_token0"] > 1e-3, extra
    extra["seq_len_over_delta_rule_chunk"] = len(ids) / 64
    assert len(ids) > 64, "the chunked delta rule must run more than one chunk"
    return extra


def fuse_experts(ckpt) -> None:
    """Rewrites the saved checkpoint's routed experts as the release stores them: per layer
    `mlp.experts.gate_up_proj` [E, 2 * moe_intermediate, hidden] (expert e's gate rows, then
    its up rows) and `mlp.experts.down_proj` [E, hidden, moe_intermediate], without `.weight`
    (transformers' own in-memory layout, which it loads as is). `save_pretrained` writes one
    tensor per expert instead; each fused tensor goes to the shard of its expert 0."""
    import json
    import re
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    ckpt = Path(ckpt)
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = {f: load_file(str(ckpt / f)) for f in sorted(set(index["weight_map"].values()))}
    where = {k: f for f, ts in shards.items() for k in ts}
    pat = re.compile(r"(model\.language_model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")
    per_layer: dict[str, dict[int, dict[str, str]]] = {}
    for k in where:
        m = pat.fullmatch(k)
        if m:
            per_layer.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = k
    assert per_layer, "no per-expert tensors to fuse"
    for prefix, experts in per_layer.items():
        n = len(experts)
        assert sorted(experts) == list(range(n)), sorted(experts)
        get = lambda e, part: shards[where[experts[e][part]]].pop(experts[e][part])
        gate_up = torch.stack([torch.cat([get(e, "gate"), get(e, "up")], dim=0) for e in range(n)])
        down = torch.stack([get(e, "down") for e in range(n)])
        home = where[experts[0]["gate"]]
        shards[home][f"{prefix}.gate_up_proj"] = gate_up.contiguous()
        shards[home][f"{prefix}.down_proj"] = down.contiguous()
    weight_map = {}
    for f, ts in shards.items():
        save_file(ts, str(ckpt / f), metadata={"format": "pt"})
        weight_map.update({k: f for k in ts})
    index["weight_map"] = dict(sorted(weight_map.items()))
    index["metadata"]["total_size"] = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
