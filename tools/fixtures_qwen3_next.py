"""qwen3_next fixtures for tools/make_fixtures.py: the cases, their initialisation and the
checks that the hard cases are really exercised.

qwen3_next (transformers' modeling_qwen3_next.py, Qwen3-Next-80B-A3B): a hybrid stack of
Gated DeltaNet linear-attention layers and gated full-attention layers (`layer_types`).

* Norms are zero-centred: the stored weight w scales by (1 + w) (input, post-attention and
  final norms, and the per-head q/k norms of the full-attention layers).
* Full attention: q_proj yields, per head, the query followed by an output gate of the
  same size; per-head q/k norms; partial rotary (`partial_rotary_factor`, default 0.25);
  the attention output is multiplied by sigmoid(gate) before o_proj.
* Gated DeltaNet: in_proj_qkvz / in_proj_ba grouped per key head, a depthwise causal
  conv1d (kernel `linear_conv_kernel_dim`, SiLU) over q|k|v, L2-normalised q and k,
  beta = sigmoid(b), decay g = -exp(A_log) * softplus(a + dt_bias), the delta-rule state
  (per value head, key_dim x value_dim) updated token by token, a gated RMSNorm (plain
  weight, times silu(z)) per value head, out_proj. The state and the conv window replace
  the KV cache on those layers.
* MoE: softmax router (norm_topk_prob, default true), routed experts, a shared expert
  scaled by sigmoid(shared_expert_gate x).

The reference also records transformers' logits of every greedy decode step
(`decode_logits.bin`): its prefill runs the chunked delta rule, its decode steps the
recurrent one, so the engine's state is checked across both.
"""

from __future__ import annotations

import math

import torch

CASES = {
    # bf16, 3+ shards; linear layers around one full-attention layer (the last layer is
    # linear), a dense MLP on a linear layer, 3 value heads per key head, partial rotary
    # 0.25 of head_dim 24 (6 dims rotated), odd sizes everywhere.
    "qwen3_next": dict(
        model_type="qwen3_next",
        dtype=torch.bfloat16,
        base_seed=9000,
        vocab_extra=3,
        shard="200KB",
        load_kw=dict(experts_implementation="eager"),
        decode_logits=True,
        config=dict(
            hidden_size=72,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            mlp_only_layers=[2],
            intermediate_size=36,
            linear_num_key_heads=2,
            linear_num_value_heads=6,
            linear_key_head_dim=12,
            linear_value_head_dim=10,
            linear_conv_kernel_dim=4,
            num_experts=12,
            num_experts_per_tok=3,
            moe_intermediate_size=20,
            shared_expert_intermediate_size=28,
            norm_topk_prob=True,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            tie_word_embeddings=False,
        ),
    ),
    # f32, one file: full attention first, one value head per key head, conv kernel 2,
    # attention biases (q/gate, k, v, o), no top-k renormalisation, tied embeddings,
    # rms_norm_eps 1e-5, partial rotary 0.5.
    "qwen3_next_f32": dict(
        model_type="qwen3_next",
        dtype=torch.float32,
        base_seed=9500,
        vocab_extra=0,
        shard=None,
        load_kw=dict(experts_implementation="eager"),
        decode_logits=True,
        config=dict(
            hidden_size=40,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            num_hidden_layers=3,
            layer_types=["full_attention", "linear_attention", "linear_attention"],
            attention_bias=True,
            linear_num_key_heads=3,
            linear_num_value_heads=3,
            linear_key_head_dim=8,
            linear_value_head_dim=14,
            linear_conv_kernel_dim=2,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            norm_topk_prob=False,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            tie_word_embeddings=True,
        ),
    ),
}

# Qwen3NextRMSNorm (zero-centred, scale 1 + w): every norm but the linear layers' gated one.
_ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")


def reinit(name: str, shape: tuple, randn, hidden: int):
    """qwen3_next parameters the generic initialisation does not know; None for the others."""
    if name.endswith(_ZERO_CENTRED):  # effective scale 1 + 0.3 randn
        return 0.3 * randn(shape)
    if name.endswith("linear_attn.norm.weight"):  # the gated RMSNorm's plain weight
        return 1.0 + 0.3 * randn(shape)
    if name.endswith("mlp.gate.weight"):  # router [E, H]: strong, so top-k choices have clear margins
        return (7.0 / math.sqrt(hidden)) * randn(shape)
    if name.endswith("linear_attn.A_log"):  # A = exp(A_log) around 0.37: decays of 0.3-0.95 per token
        return 0.5 * randn(shape) - 1.0
    if name.endswith("linear_attn.dt_bias"):
        return 0.5 * randn(shape)
    if name.endswith("linear_attn.conv1d.weight"):  # [channels, 1, kernel]
        return (1.0 / math.sqrt(shape[-1])) * randn(shape)
    return None


@torch.no_grad()
def sanity_checks(name: str, model, cfg, ids) -> dict:
    extra = {}
    layers = model.model.layers
    kinds = [type(l.linear_attn if hasattr(l, "linear_attn") else l.self_attn).__name__ for l in layers]
    assert kinds == [
        "Qwen3NextGatedDeltaNet" if t == "linear_attention" else "Qwen3NextAttention" for t in cfg.layer_types
    ], kinds
    assert "Qwen3NextGatedDeltaNet" in kinds and "Qwen3NextAttention" in kinds
    for l in getattr(cfg, "mlp_only_layers", []) or []:
        assert type(layers[l].mlp).__name__ == "Qwen3NextMLP"
    rot = model.model.rotary_emb
    part = cfg.rope_parameters["partial_rotary_factor"]
    assert rot.inv_freq.numel() == int(cfg.head_dim * part) // 2, rot.inv_freq.numel()

    # The decay per token and value head: exp(-exp(A_log) * softplus(a + dt_bias)).
    decays = []

    def hook(mod, inp, out):
        nv, nk = mod.num_v_heads, mod.num_k_heads
        ba = out.view(*out.shape[:-1], nk, 2 * nv // nk)
        a = ba[..., nv // nk :].reshape(*out.shape[:-1], nv)
        g = -mod.A_log.float().exp() * torch.nn.functional.softplus(a.float() + mod.dt_bias)
        decays.append(g.exp().flatten())

    handles = [
        l.linear_attn.in_proj_ba.register_forward_hook(lambda m, i, o, _la=l.linear_attn: hook(_la, i, o))
        for l in layers
        if hasattr(l, "linear_attn")
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

    # The recurrent state matters: the late logits depend on the first tokens.
    moved_ids = list(ids)
    moved_ids[0] = (moved_ids[0] + 1) % 200
    moved = model(torch.tensor([moved_ids])).logits
    extra["late_logit_move_from_token0"] = float((moved[0, -8:] - base[0, -8:]).abs().max())
    assert extra["late_logit_move_from_token0"] > 1e-3, extra

    # The attention output gate matters.
    full = next(l.self_attn for l in layers if hasattr(l, "self_attn"))
    assert full.q_proj.out_features == 2 * cfg.num_attention_heads * cfg.head_dim
    return extra
