"""gpt_oss fixtures for tools/make_fixtures.py: the cases, their initialisation, the MXFP4
checkpoint layout and the checks that the hard cases are really exercised.

gpt_oss (transformers' modeling_gpt_oss.py): GQA with biases on q/k/v/o and a learned
attention sink per head (an extra logit in each softmax denominator), sliding window on
the layers `layer_types` marks "sliding_attention", YaRN rope (truncate false), a router
with a bias whose top-k logits are softmaxed, experts with biases and the clamped SwiGLU
(gate clamped above at `swiglu_limit`, up clamped to +-limit, (up + 1) * gate *
sigmoid(alpha * gate)), gate and up interleaved in the columns of `gate_up_proj`.

The `gpt_oss_mxfp4` case stores the routed experts as the released checkpoints do:
`*_blocks` [E, out, in/32, 16] u8 (two e2m1 values per byte, low nibble first) and
`*_scales` [E, out, in/32] u8 (e8m0: 2^(s - 127)), with `quantization_config.quant_method
== "mxfp4"`. Its experts are quantized before the reference runs, and the reference is
transformers loading that checkpoint (it dequantizes MXFP4 on a CPU), so the logits are
those of the bytes on disk.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

# Rope as the released config (yarn, truncate false), scaled down to the fixture's context.
_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}

# hidden and intermediate are multiples of 32 (MXFP4 blocks run along them), with an odd
# number of blocks along hidden (3); heads, head_dim and vocab are not powers of two.
_CONFIG = dict(
    hidden_size=96,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=14,
    num_hidden_layers=3,
    num_local_experts=8,
    num_experts_per_tok=3,
    intermediate_size=32,
    sliding_window=7,  # smaller than the 48-token test sequence and the 32-token greedy run
    swiglu_limit=2.0,  # small enough that a share of gate/up values is clamped
    max_position_embeddings=256,
    rope_parameters=_ROPE,
    tie_word_embeddings=False,
)

CASES = {
    # bf16, fused experts as save_pretrained writes them (gate_up_proj [E, H, 2I], columns
    # gate/up interleaved; down_proj [E, I, H]), 3 shards.
    "gpt_oss": dict(
        model_type="gpt_oss",
        dtype=torch.bfloat16,
        base_seed=8000,
        vocab_extra=5,
        shard="250KB",
        load_kw=dict(experts_implementation="eager"),
        config=_CONFIG,
    ),
    # The released layout: experts as MXFP4 blocks + e8m0 scales, the rest bf16, 2 shards.
    "gpt_oss_mxfp4": dict(
        model_type="gpt_oss",
        dtype=torch.bfloat16,
        base_seed=8500,
        vocab_extra=5,
        shard="200KB",
        load_kw=dict(experts_implementation="eager"),
        mxfp4=True,
        config=_CONFIG,
    ),
}

# e2m1 values by nibble (transformers' FP4_VALUES).
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def reinit(name: str, shape: tuple, randn, hidden: int):
    """gpt_oss parameters the generic initialisation does not know; None for the others."""
    if name.endswith("self_attn.sinks"):  # [heads]: comparable to the attention logits
        return 0.5 + 1.0 * randn(shape)
    if name.endswith("mlp.router.weight"):  # [E, H]
        return (2.5 / math.sqrt(hidden)) * randn(shape)
    if name.endswith("mlp.router.bias"):
        return 0.5 * randn(shape)
    if name.endswith("experts.gate_up_proj"):  # [E, H, 2I]: fan-in H
        return (1.4 / math.sqrt(shape[1])) * randn(shape)
    if name.endswith("experts.down_proj"):  # [E, I, H]: fan-in I
        return (1.2 / math.sqrt(shape[1])) * randn(shape)
    if name.endswith("experts.gate_up_proj_bias") or name.endswith("experts.down_proj_bias"):
        return 0.2 * randn(shape)
    return None


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP4 of `w` [R, C] along its rows (C a multiple of 32): the scale of each block of
    32 is the smallest power of two 2^e with max|block| / 2^e <= 6, each value the nearest
    e2m1 value (ties to the lower nibble). Returns (blocks [R, C/32, 16] u8, scales [R, C/32]
    u8 = e + 127, the dequantized values [R, C] in float32)."""
    r, c = w.shape
    assert c % 32 == 0, c
    b = w.float().reshape(r, c // 32, 32)
    amax = b.abs().amax(-1)
    e = torch.ceil(torch.log2(amax.clamp(min=2.0**-100) / 6.0)).clamp(-120, 120).to(torch.int32)
    scale = torch.pow(torch.tensor(2.0, dtype=torch.float64), e.double()).float()
    vals = torch.tensor(FP4_VALUES)
    idx = (b / scale[..., None])[..., None].sub(vals).abs().argmin(-1).to(torch.uint8)
    blocks = idx[..., 0::2] | (idx[..., 1::2] << 4)
    deq = (vals[idx.long()] * scale[..., None]).reshape(r, c)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous(), deq


@torch.no_grad()
def quantize_experts_(model) -> None:
    """Replaces every routed expert weight by its MXFP4 value (what the checkpoint will hold)."""
    for layer in model.model.layers:
        ex = layer.mlp.experts
        for p in (ex.gate_up_proj, ex.down_proj):  # [E, in, out]
            for e in range(p.shape[0]):
                _, _, deq = quantize_rows(p[e].T.float())
                p[e].copy_(deq.T.to(p.dtype))


def write_mxfp4_layout(ckpt: Path) -> None:
    """Rewrites a saved checkpoint's fused expert weights as MXFP4 blocks + scales (the
    values are already MXFP4, so this loses nothing), shard by shard, and marks the config."""
    from safetensors.torch import load_file, save_file

    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    for f in sorted(ckpt.glob("*.safetensors")):
        sd = load_file(str(f))
        out = {}
        for k, v in sd.items():
            if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
                parts = [quantize_rows(v[e].T.float()) for e in range(v.shape[0])]
                for e, (_, _, deq) in enumerate(parts):
                    assert torch.equal(deq, v[e].T.float()), f"{k}[{e}] is not MXFP4-exact"
                out[k + "_blocks"] = torch.stack([p[0] for p in parts])
                out[k + "_scales"] = torch.stack([p[1] for p in parts])
                if index is not None:
                    del index["weight_map"][k]
                    index["weight_map"][k + "_blocks"] = f.name
                    index["weight_map"][k + "_scales"] = f.name
            else:
                out[k] = v
        save_file(out, str(f), metadata={"format": "pt"})
    if index is not None:
        index["weight_map"] = dict(sorted(index["weight_map"].items()))
        index_path.write_text(json.dumps(index, indent=2) + "\n")
    cfg_path = ckpt / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def check_checkpoint(names: dict, case: dict, cfg) -> None:
    e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    base = "model.layers.0.mlp.experts."
    if case.get("mxfp4"):
        assert names[base + "gate_up_proj_blocks"][:2] == ((e, 2 * i, h // 32, 16), "U8"), names[base + "gate_up_proj_blocks"]
        assert names[base + "gate_up_proj_scales"][:2] == ((e, 2 * i, h // 32), "U8")
        assert names[base + "down_proj_blocks"][:2] == ((e, h, i // 32, 16), "U8")
        assert names[base + "down_proj_scales"][:2] == ((e, h, i // 32), "U8")
        assert not any(k.endswith("experts.gate_up_proj") for k in names)
    else:
        assert names[base + "gate_up_proj"][0] == (e, h, 2 * i), names[base + "gate_up_proj"]
        assert names[base + "down_proj"][0] == (e, i, h)
    assert names[base + "gate_up_proj_bias"][0] == (e, 2 * i)
    assert "model.layers.0.self_attn.sinks" in names and "model.layers.0.mlp.router.bias" in names


class ClampProbe:
    """Counts how many gate and up values the experts clamp (forward hooks on _apply_gate)."""

    def __init__(self, model):
        self.total = self.clamped = 0
        self.originals = []
        for layer in model.model.layers:
            ex = layer.mlp.experts
            orig = ex._apply_gate

            def wrapped(gate_up, _orig=orig, _lim=ex.limit):
                g, u = gate_up[..., ::2], gate_up[..., 1::2]
                self.total += g.numel() + u.numel()
                self.clamped += int((g > _lim).sum()) + int((u.abs() > _lim).sum())
                return _orig(gate_up)

            ex._apply_gate = wrapped
            self.originals.append((ex, orig))

    def close(self):
        for ex, orig in self.originals:
            ex._apply_gate = orig


@torch.no_grad()
def sanity_checks(name: str, model, cfg, ids) -> dict:
    extra = {}
    rot = model.model.rotary_emb
    assert rot.rope_type == "yarn" and cfg.rope_parameters["truncate"] is False
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"], cfg.layer_types
    attn = model.model.layers[0].self_attn
    assert attn.sliding_window == cfg.sliding_window < len(ids)
    assert model.model.layers[1].self_attn.sliding_window is None
    assert attn.o_proj.bias is not None and float(attn.sinks.abs().max()) > 0.5
    # The sinks matter: zeroing them moves the logits.
    base = model(torch.tensor([ids])).logits
    saved = [l.self_attn.sinks.clone() for l in model.model.layers]
    for l in model.model.layers:
        l.self_attn.sinks.fill_(-1e4)
    moved = float((model(torch.tensor([ids])).logits - base).abs().max())
    for l, s in zip(model.model.layers, saved):
        l.self_attn.sinks.copy_(s)
    assert moved > 0.1, f"sinks do not matter ({moved})"
    # The sliding window matters: full attention on layer 0 moves the late positions.
    for l in model.model.layers:
        l.self_attn.sliding_window = None
    model.config.layer_types = ["full_attention"] * cfg.num_hidden_layers
    full = model(torch.tensor([ids])).logits
    model.config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    for k, l in enumerate(model.model.layers):
        l.self_attn.sliding_window = cfg.sliding_window if k % 2 == 0 else None
    w = cfg.sliding_window
    assert float((full[0, :w] - base[0, :w]).abs().max()) < 1e-4
    assert float((full[0, w:] - base[0, w:]).abs().max()) > 0.1, "sliding window does not matter"
    if name.endswith("mxfp4"):
        # transformers dequantized the blocks on load: every expert weight is an MXFP4 value.
        ex = model.model.layers[0].mlp.experts
        assert type(ex).__name__ == "GptOssExperts", type(ex)
        for e in range(ex.gate_up_proj.shape[0]):
            w = ex.gate_up_proj[e].T.float()
            assert torch.equal(quantize_rows(w)[2], w), "loaded experts are not MXFP4 values"
    probe = ClampProbe(model)
    try:
        model(torch.tensor([ids]))
    finally:
        probe.close()
    frac = probe.clamped / max(probe.total, 1)
    assert 0.01 <= frac <= 0.3, f"clamp fraction {frac}"
    extra["swiglu_clamp_fraction"] = frac
    extra["sinks_max_logit_move"] = moved
    extra["yarn_attention_scaling"] = float(rot.attention_scaling)
    return extra
