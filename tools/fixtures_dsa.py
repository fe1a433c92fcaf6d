"""DeepSeek Sparse Attention fixtures for tools/make_fixtures.py: deepseek_v32 (DeepSeek-V3.2)
and glm_moe_dsa (GLM-5), transformers 5.23's modeling_deepseek_v32.py / modeling_glm_moe_dsa.py.

Both are DeepSeek-V3 (MLA, sigmoid router, shared experts, dense first layers) plus a
lightning indexer per attention layer that keeps `index_topk` positions per query. Here
`index_topk` is 6 and the sequences are 48 (teacher-forced) and 8 + 24 (greedy) ids long,
so most queries see more positions than they keep: the sparse path decides the logits.
deepseek_v32 rotates the indexer's rope slice as two halves, glm_moe_dsa as interleaved
pairs, and glm_moe_dsa's middle layer is "shared" (no indexer of its own: it reuses layer
0's selection).

A seed is rejected when a selection is nearly tied (the kept and the first dropped score
closer than SELECT_GAP_MIN = 2e-5 of the largest score: a hundred times the float error of the
sums), since the engine sums in
another float order than torch and a near-tie could flip which position is kept.
"""

from __future__ import annotations

import math

import torch

SELECT_GAP_MIN = 2e-5

_COMMON = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=32,
    kv_lora_rank=24,
    qk_nope_head_dim=12,
    qk_rope_head_dim=8,
    v_head_dim=10,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    intermediate_size=48,
    n_routed_experts=8,
    n_shared_experts=1,
    moe_intermediate_size=16,
    num_experts_per_tok=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    index_topk=6,
    index_head_dim=16,
    index_n_heads=8,
    num_mtp_layers=0,
    tie_word_embeddings=False,
)

CASES = {
    # 2 groups of 4 experts, one kept; the indexer's rope slice as halves.
    "deepseek_v32": dict(
        model_type="deepseek_v32",
        load_kw=dict(experts_implementation="eager"),
        dtype=torch.bfloat16,
        base_seed=8300,
        vocab_extra=3,
        shard="150KB",
        config=dict(_COMMON, n_group=2, topk_group=1),
    ),
    # One group (GLM-5), the indexer's rope slice as interleaved pairs, layer 1 shares
    # layer 0's selection.
    "glm_moe_dsa": dict(
        model_type="glm_moe_dsa",
        load_kw=dict(experts_implementation="eager"),
        dtype=torch.bfloat16,
        base_seed=8400,
        vocab_extra=3,
        shard="150KB",
        config=dict(_COMMON, n_group=1, topk_group=1, indexer_types=["full", "shared", "full"]),
    ),
}

MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """RoPE of the last dim of `x` (its rope slice), as transformers applies it, in float64."""
    if interleave:
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


@torch.no_grad()
def selection_gap(model, cfg, ids: list[int]) -> float:
    """The smallest relative margin, over every full indexer layer and every query that
    sees more than index_topk positions, between the index_topk-th score and the next
    one, recomputed in float64 from the layer's inputs of a teacher-forced pass."""
    gaps = [math.inf]
    handles = []
    interleave = cfg.model_type == "glm_moe_dsa"

    def hook(mod, args, kwargs, _out):
        x, q_resid, (cos, sin) = args[0], args[1], args[2]
        dr, hd, nh, k = mod.qk_rope_head_dim, mod.head_dim, mod.n_heads, mod.index_topk
        x, q_resid = x[0].double(), q_resid[0].double()
        cos, sin = cos[0].double(), sin[0].double()
        q = (q_resid @ mod.wq_b.weight.double().T).view(-1, nh, hd)
        kk = torch.nn.functional.layer_norm(
            x @ mod.wk.weight.double().T, (hd,), mod.k_norm.weight.double(), mod.k_norm.bias.double(), 1e-6
        )
        qr = _rotate(q[..., :dr], cos[:, None, :], sin[:, None, :], interleave)
        kr = _rotate(kk[..., :dr], cos, sin, interleave)
        q = torch.cat([qr, q[..., dr:]], dim=-1)
        kk = torch.cat([kr, kk[..., dr:]], dim=-1)
        w = (x @ mod.weights_proj.weight.double().T) * nh**-0.5
        scores = torch.relu(torch.einsum("shd,td->sht", q, kk) * hd**-0.5)
        index = torch.einsum("sh,sht->st", w, scores)
        n = index.shape[0]
        for s in range(k, n):
            row = torch.sort(index[s, : s + 1], descending=True).values
            spread = float(row.abs().max()) or 1.0
            gaps.append(float(row[k - 1] - row[k]) / spread)

    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("Indexer"):
            handles.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return min(gaps)


def reasons(model, cfg, sequences: list[list[int]]) -> tuple[list[str], dict]:
    """Rejection reasons for a DSA seed, and its diagnostics."""
    gap = min(selection_gap(model, cfg, ids) for ids in sequences)
    out = [] if gap >= SELECT_GAP_MIN else [f"indexer near-tie (relative gap {gap:.3g})"]
    return out, {"dsa_min_selection_gap": gap}
