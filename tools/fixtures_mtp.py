"""MTP fixtures: `deepseek_v3_mtp`, `glm4_moe_mtp` and `glm_moe_dsa_mtp` are the
`deepseek_v3`, `glm4_moe` and `glm_moe_dsa` fixture checkpoints (same main weights, same
reference.json) plus one
multi-token-prediction layer (`num_nextn_predict_layers: 1`, tensors
`model.layers.{n}.*` as DeepSeek-V3 and GLM-4.5 ship them) and a torch reference of that
layer, `mtp_logits.bin`.

The MTP block (DeepSeek-V3 report section 2.2; vLLM's deepseek_mtp.py; transformers has
no MTP), for position i with the main model's last hidden state h_i *after* its final
norm and the next token t_{i+1}:

    x      = eh_proj(cat(enorm(embed(t_{i+1})), hnorm(h_i)))
    x      = decoder_layer(x)     # the family's own layer (transformers' class), causal
    logits = head(shared_head.norm(x))     # shared_head.head, else the model's lm_head

`mtp_logits.bin`: raw little-endian f32 [len(ids) - 1, vocab]: row i is the MTP logits at
position i of reference.json's `ids` (h_i from the main model, t_{i+1} = ids[i + 1]), the
MTP layer attending causally over positions 0..i at RoPE positions 0..i.

The MTP layer is random, so its drafts are (nearly) never accepted: these fixtures check
the arithmetic and that speculation with them changes no token. (Fitting it to the random
main model's greedy continuations for a few hundred Adam steps reached 1-2% held-out
top-1: a random network's next-next token is no pattern to learn.)

deepseek_v3_mtp carries its own `embed_tokens` and `shared_head.head` (as DeepSeek-V3
does); glm4_moe_mtp and glm_moe_dsa_mtp leave both out, so the engine falls back to the
model's embedding and lm_head.

glm_moe_dsa_mtp (GLM-5's layout: the MTP layer is a DSA decoder layer with its own
indexer, `model.layers.3.self_attn.indexer.*`): colibri's MTP layer attends densely (the
drafts are verified by the main model, whose sparse attention decides every token; see
ModelConfig's `indexer_at`), so its reference is transformers' GlmMoeDsaDecoderLayer with
the indexer keeping every position (index_topk past the sequence). The main model's
sequences are longer than its index_topk (6): the sparse path decides the tokens that
speculation must reproduce.

    python3 tools/fixtures_mtp.py     # after tools/make_fixtures.py deepseek_v3 glm4_moe glm_moe_dsa
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaDecoderLayer

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
CASES = {
    "deepseek_v3": dict(layer=DeepseekV3DecoderLayer, seed=4242, own_head=True),
    "glm4_moe": dict(layer=Glm4MoeDecoderLayer, seed=4343, own_head=False),
    "glm_moe_dsa": dict(layer=GlmMoeDsaDecoderLayer, seed=4444, own_head=False),
}


def mtp_config(src: Path):
    """The config the MTP layer (index num_hidden_layers) is built with: a DSA model's
    per-layer lists get one more entry (a full indexer, a MoE block), and its index_topk
    covers any sequence (dense attention, as colibri's MTP layer attends)."""
    cfg = AutoConfig.from_pretrained(src)
    if cfg.model_type == "glm_moe_dsa":
        cfg.indexer_types = list(cfg.indexer_types) + ["full"]
        cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        cfg.index_topk = 1 << 20
    return cfg
KEPT = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "reference.json"]


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def mtp_tensors(cfg, case, dtype) -> dict[str, torch.Tensor]:
    """The MTP layer's tensors under their checkpoint names, random, stored as `dtype`."""
    g = torch.Generator().manual_seed(case["seed"])
    h, n, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size

    def randn(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    cfg._attn_implementation = "eager"
    layer = case["layer"](cfg, n)
    p = f"model.layers.{n}"
    out = {}
    for name, t in sorted(layer.state_dict().items()):
        shape = tuple(t.shape)
        if name.endswith("norm.weight"):
            val = 1.0 + 0.3 * randn(*shape)
        elif name.endswith("e_score_correction_bias"):
            val = 0.15 * randn(*shape)
        elif name.endswith(".bias"):
            val = 0.1 * randn(*shape)
        elif name.endswith("mlp.gate.weight"):
            val = (2.5 / math.sqrt(h)) * randn(*shape)
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            val = (1.2 / math.sqrt(shape[2])) * randn(*shape)
        elif len(shape) == 2:
            qk = ("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_b_proj.weight")
            val = ((1.6 if name.endswith(qk) else 1.0) / math.sqrt(shape[1])) * randn(*shape)
        else:
            raise RuntimeError(f"don't know how to initialise {name} {shape}")
        if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
            i = shape[1] // 2
            for e in range(shape[0]):
                out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = val[e, :i]
                out[f"{p}.mlp.experts.{e}.up_proj.weight"] = val[e, i:]
        elif name.endswith("experts.down_proj"):  # [E, H, I]
            for e in range(shape[0]):
                out[f"{p}.mlp.experts.{e}.down_proj.weight"] = val[e]
        else:
            out[f"{p}.{name}"] = val
    out[f"{p}.enorm.weight"] = 1.0 + 0.3 * randn(h)
    out[f"{p}.hnorm.weight"] = 1.0 + 0.3 * randn(h)
    out[f"{p}.eh_proj.weight"] = (1.0 / math.sqrt(2 * h)) * randn(h, 2 * h)
    out[f"{p}.shared_head.norm.weight"] = 1.0 + 0.3 * randn(h)
    if case["own_head"]:
        out[f"{p}.embed_tokens.weight"] = randn(v, h)
        out[f"{p}.shared_head.head.weight"] = (2.5 / math.sqrt(h)) * randn(v, h)
    return {k: t.to(dtype).contiguous() for k, t in out.items()}


class Mtp(torch.nn.Module):
    """The MTP block over a batch: hid [B, T, H] (the main model's final-normed states),
    nxt [B, T] (the token after each), causal over T at RoPE positions 0..T-1."""

    def __init__(self, model, cfg, w: dict[str, torch.Tensor]):
        super().__init__()
        n = cfg.num_hidden_layers
        self.p, self.eps, self.model = f"model.layers.{n}", cfg.rms_norm_eps, [model]
        cfg._attn_implementation = "eager"
        self.layer = CASES[cfg.model_type]["layer"](cfg, n).float()
        sd = {}
        for k in self.layer.state_dict():
            ne = cfg.n_routed_experts
            if k == "mlp.experts.gate_up_proj":
                gu = [torch.cat([w[f"{self.p}.mlp.experts.{e}.{x}_proj.weight"] for x in ("gate", "up")]) for e in range(ne)]
                sd[k] = torch.stack(gu)
            elif k == "mlp.experts.down_proj":
                sd[k] = torch.stack([w[f"{self.p}.mlp.experts.{e}.down_proj.weight"] for e in range(ne)])
            else:
                sd[k] = w[f"{self.p}.{k}"]
        self.layer.load_state_dict(sd)
        self.w = torch.nn.ParameterDict(
            {k.split(".", 3)[3].replace(".", "_"): torch.nn.Parameter(t.float().clone()) for k, t in w.items()
             if not k.startswith(f"{self.p}.mlp.") and not k.startswith(f"{self.p}.self_attn.")
             and "layernorm" not in k}
        )

    def tensors(self) -> dict[str, torch.Tensor]:  # for fitting experiments
        """The weights under their checkpoint names."""
        out = {}
        for k, t in self.layer.state_dict().items():
            if k == "mlp.experts.gate_up_proj":
                i = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"{self.p}.mlp.experts.{e}.gate_proj.weight"] = t[e, :i]
                    out[f"{self.p}.mlp.experts.{e}.up_proj.weight"] = t[e, i:]
            elif k == "mlp.experts.down_proj":
                for e in range(t.shape[0]):
                    out[f"{self.p}.mlp.experts.{e}.down_proj.weight"] = t[e]
            else:
                out[f"{self.p}.{k}"] = t
        names = {"embed_tokens_weight": "embed_tokens.weight", "enorm_weight": "enorm.weight",
                 "hnorm_weight": "hnorm.weight", "eh_proj_weight": "eh_proj.weight",
                 "shared_head_norm_weight": "shared_head.norm.weight", "shared_head_head_weight": "shared_head.head.weight"}
        for k, t in self.w.items():
            out[f"{self.p}.{names[k]}"] = t
        return {k: t.detach().clone() for k, t in out.items()}

    def forward(self, hid, nxt):
        model, w, eps = self.model[0], self.w, self.eps
        embed = w["embed_tokens_weight"] if "embed_tokens_weight" in w else model.model.embed_tokens.weight
        head = w["shared_head_head_weight"] if "shared_head_head_weight" in w else model.lm_head.weight
        e = rms(embed[nxt], w["enorm_weight"], eps)
        x = torch.cat([e, rms(hid, w["hnorm_weight"], eps)], dim=-1) @ w["eh_proj_weight"].T
        t = x.shape[1]
        pos = torch.arange(t)[None].expand(x.shape[0], t)
        cos, sin = model.model.rotary_emb(x, pos)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        y = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
        y = y[0] if isinstance(y, tuple) else y
        return rms(y, w["shared_head_norm_weight"], eps) @ head.T


def load_main(src: Path):
    return AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def reference(model, mtp: Mtp, ids: list[int]) -> torch.Tensor:
    """The MTP logits [len(ids) - 1, vocab] in float32."""
    with torch.no_grad():
        t = torch.tensor([ids])
        hid = model.model(input_ids=t).last_hidden_state  # after the final norm
        return mtp(hid[:, :-1], t[:, 1:])[0]


def make(name: str) -> None:
    case = CASES[name]
    src, dst = FIXTURES / name, FIXTURES / f"{name}_mtp"
    cfg = mtp_config(src)
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    dtype = next(iter(tensors.values())).dtype
    ref = json.loads((src / "reference.json").read_text())
    model = load_main(src)
    # Stored as the checkpoint's dtype; the reference runs on the stored values.
    stored = mtp_tensors(cfg, case, dtype)
    mtp = Mtp(model, mtp_config(src), {k: t.float() for k, t in stored.items()}).eval()
    logits = reference(model, mtp, ref["ids"])
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir()
    for f in KEPT:
        shutil.copy(src / f, dst / f)
    c = json.loads((src / "config.json").read_text())
    c["num_nextn_predict_layers"] = 1
    c.pop("num_mtp_layers", None)  # the DSA fixtures' generator's leftover (0)
    (dst / "config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    tensors.update(stored)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "mtp_logits.bin").write_bytes(logits.float().contiguous().numpy().astype("<f4").tobytes())
    print(f"{name}_mtp: {len(stored)} MTP tensors ({dtype}), "
          f"logits std {logits.std():.3f}")


def main(argv: list[str]) -> int:
    for name in argv or list(CASES):
        make(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
