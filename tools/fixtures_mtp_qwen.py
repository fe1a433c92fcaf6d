"""MTP fixture `qwen3_5_moe_mtp`: the `qwen3_5_moe` fixture checkpoint (same main weights,
same reference.json, its multimodal layout) plus one multi-token-prediction layer as
Qwen3.5 and qwen3_next ship it (`mtp_num_hidden_layers: 1`, tensors `mtp.*`, which
transformers ignores), and a torch reference of that layer, `mtp_logits.bin`.

The block is DeepSeek's (tools/fixtures_mtp.py) under other names (vLLM's
qwen3_next_mtp.py / qwen3_5_mtp.py), for position i with the main model's last hidden state
h_i after its final norm and the next token t_{i+1}:

    x      = fc(cat(pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)))
    x      = mtp.layers.0(x)      # a full-attention decoder layer of the family (gated
                                  # attention, q/k norms, partial M-RoPE, routed experts
                                  # fused, the gated shared expert), causal
    logits = lm_head(norm(x))

Every norm is the family's zero-centred RMSNorm (x * rsqrt(mean(x^2) + eps) * (1 + w)).
`mtp_logits.bin`: raw little-endian f32 [len(ids) - 1, vocab], row i the MTP logits at
position i of reference.json's `ids` (RoPE positions 0..i). The layer is random: this
checks the arithmetic and that speculation with it changes no token.

    python3 tools/fixtures_mtp_qwen.py     # after the qwen3_5_moe fixture exists
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, Qwen3_5MoeForConditionalGeneration
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
SRC, DST = FIXTURES / "qwen3_5_moe", FIXTURES / "qwen3_5_moe_mtp"
KEPT = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "reference.json"]
SEED = 4545


def rms(x, w, eps):
    """The family's zero-centred RMSNorm, in float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def layer_config(text_cfg):
    """The text config with one more layer type: the MTP layer is full attention."""
    c = copy.deepcopy(text_cfg)
    c.layer_types = list(text_cfg.layer_types) + ["full_attention"]
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"
    return c


def mtp_tensors(text_cfg) -> dict[str, torch.Tensor]:
    """The MTP module's tensors under their checkpoint names, random, in float32."""
    g = torch.Generator().manual_seed(SEED)
    h, n = text_cfg.hidden_size, text_cfg.num_hidden_layers

    def randn(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    layer = Qwen3_5MoeDecoderLayer(layer_config(text_cfg), n)
    out = {}
    for name, t in sorted(layer.state_dict().items()):
        shape = tuple(t.shape)
        if name.endswith("norm.weight"):  # zero-centred: 1 + w
            val = 0.3 * randn(*shape)
        elif name == "mlp.gate.weight":
            val = (2.5 / math.sqrt(h)) * randn(*shape)
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            val = (1.2 / math.sqrt(shape[2])) * randn(*shape)
        elif len(shape) == 2:
            qk = ("q_proj.weight", "k_proj.weight")
            val = ((1.6 if name.endswith(qk) else 1.0) / math.sqrt(shape[1])) * randn(*shape)
        else:
            raise RuntimeError(f"don't know how to initialise {name} {shape}")
        out[f"mtp.layers.0.{name}"] = val
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{norm}.weight"] = 0.3 * randn(h)
    out["mtp.fc.weight"] = (1.0 / math.sqrt(2 * h)) * randn(h, 2 * h)
    return out


class Mtp(torch.nn.Module):
    """The MTP block over a batch: hid [B, T, H] (the main model's final-normed states),
    nxt [B, T] (the token after each), causal over T at RoPE positions 0..T-1."""

    def __init__(self, model, text_cfg, w: dict[str, torch.Tensor]):
        super().__init__()
        self.model, self.eps, self.w = [model], text_cfg.rms_norm_eps, w
        self.layer = Qwen3_5MoeDecoderLayer(layer_config(text_cfg), text_cfg.num_hidden_layers).float()
        self.layer.load_state_dict({k[len("mtp.layers.0."):]: t for k, t in w.items() if k.startswith("mtp.layers.0.")})

    def forward(self, hid, nxt):
        model, w, eps = self.model[0], self.w, self.eps
        lm = model.model.language_model
        e = rms(lm.embed_tokens.weight[nxt], w["mtp.pre_fc_norm_embedding.weight"], eps)
        x = torch.cat([e, rms(hid, w["mtp.pre_fc_norm_hidden.weight"], eps)], dim=-1) @ w["mtp.fc.weight"].T
        t = x.shape[1]
        pos = torch.arange(t)[None].expand(x.shape[0], t)
        cos, sin = lm.rotary_emb(x, pos)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        y = self.layer(x, position_embeddings=(cos, sin), attention_mask=mask, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        return rms(y, w["mtp.norm.weight"], eps) @ model.lm_head.weight.T


def main() -> int:
    full = AutoConfig.from_pretrained(SRC)
    text_cfg = full.text_config
    tensors = {}
    for f in sorted(SRC.glob("*.safetensors")):
        tensors.update(load_file(f))
    dtype = tensors["lm_head.weight"].dtype
    stored = {k: t.to(dtype).contiguous() for k, t in mtp_tensors(text_cfg).items()}
    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        SRC, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    mtp = Mtp(model, text_cfg, {k: t.float() for k, t in stored.items()}).eval()
    ids = json.loads((SRC / "reference.json").read_text())["ids"]
    with torch.no_grad():
        t = torch.tensor([ids])
        hid = model.model.language_model(input_ids=t).last_hidden_state  # after the final norm
        logits = mtp(hid[:, :-1], t[:, 1:])[0]
    if DST.exists():
        shutil.rmtree(DST)
    DST.mkdir()
    for f in KEPT:
        shutil.copy(SRC / f, DST / f)
    c = json.loads((SRC / "config.json").read_text())
    c["text_config"]["mtp_num_hidden_layers"] = 1
    (DST / "config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    tensors.update(stored)
    save_file(tensors, DST / "model.safetensors", metadata={"format": "pt"})
    (DST / "mtp_logits.bin").write_bytes(logits.float().contiguous().numpy().astype("<f4").tobytes())
    print(f"qwen3_5_moe_mtp: {len(stored)} MTP tensors ({dtype}), logits std {logits.std():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
