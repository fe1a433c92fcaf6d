"""Measurements and checks of tools/make_fixtures.py (split out to keep it under 800
lines): forward hooks recording router decisions, the family-specific sanity checks of a
loaded model, and the names of a written checkpoint's tensors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch


class Probes:
    """Forward hooks recording router decisions (and OLMoE pre-clip q/k/v)."""

    def __init__(self, model):
        self.handles = []
        self.router: dict[int, list] = {}
        self.qkv: list = []
        self.sigmoid_gaps: list = []
        for name, mod in model.named_modules():
            m = re.fullmatch(r"model\.(?:language_model\.)?layers\.(\d+)\.mlp\.(?:gate|router)", name)
            if m and type(mod).__name__.endswith("TopKRouter"):
                layer = int(m.group(1))
                self.handles.append(mod.register_forward_hook(self._router_hook(layer, mod.top_k)))
            if m and type(mod).__name__.endswith("TopkRouter") and hasattr(mod, "e_score_correction_bias"):
                layer = int(m.group(1))
                self.handles.append(mod.register_forward_hook(self._sigmoid_router_hook(layer, mod)))
            if re.fullmatch(r"model\.layers\.\d+\.self_attn\.(q_norm|k_norm|v_proj)", name):
                self.handles.append(mod.register_forward_hook(self._qkv_hook))

    def _router_hook(self, layer, top_k):
        def hook(_mod, _inp, out):
            logits, _scores, indices = out
            self.router.setdefault(layer, []).append((logits.detach().clone(), indices.detach().clone(), top_k))

        return hook

    def _sigmoid_router_hook(self, layer, mod):
        """deepseek_v3: the margins of both selections, on the scores they are made on
        (sigmoid + correction bias): the topk_group-th vs the next group score, and the
        top_k-th vs the next expert among the kept groups."""

        def hook(_mod, _inp, out):
            logits, _w, indices = out
            choice = logits.detach().float().sigmoid() + mod.e_score_correction_bias.float()
            ng, tg, k = mod.num_group, mod.topk_group, mod.top_k
            e = choice.shape[-1]
            groups = choice.view(-1, ng, e // ng).topk(2, dim=-1)[0].sum(dim=-1)
            gap = math.inf
            if tg < ng:
                gs = torch.sort(groups, dim=-1, descending=True).values
                gap = min(gap, float((gs[:, tg - 1] - gs[:, tg]).min()))
            keep = torch.zeros_like(groups).scatter_(1, groups.topk(tg, dim=-1)[1], 1)
            keep = keep.unsqueeze(-1).expand(-1, ng, e // ng).reshape(-1, e).bool()
            srt = torch.sort(choice.masked_fill(~keep, -math.inf), dim=-1, descending=True).values
            if k < tg * (e // ng):
                gap = min(gap, float((srt[:, k - 1] - srt[:, k]).min()))
            self.sigmoid_gaps.append(gap)
            self.router.setdefault(layer, []).append((None, indices.detach().clone(), k))

        return hook

    def _qkv_hook(self, _mod, _inp, out):
        # OLMoE clamps these outputs in place afterwards, hence the clone.
        self.qkv.append(out.detach().clone())

    def reset(self):
        self.router = {}
        self.qkv = []
        self.sigmoid_gaps = []

    def router_min_gap(self) -> float:
        gap = min(self.sigmoid_gaps, default=math.inf)
        for recs in self.router.values():
            for logits, _idx, k in recs:
                if logits is None:
                    continue
                srt = torch.sort(logits.float(), dim=-1, descending=True).values
                gap = min(gap, float((srt[:, k - 1] - srt[:, k]).min()))
        return gap

    def distinct_experts(self, layer: int) -> int:
        return len({int(e) for _l, idx, _k in self.router.get(layer, []) for e in idx.flatten()})

    def clip_fraction(self, clip: float) -> float:
        tot = sum(t.numel() for t in self.qkv)
        hit = sum(int((t.abs() > clip).sum()) for t in self.qkv)
        return hit / max(tot, 1)

    def close(self):
        for h in self.handles:
            h.remove()


def n_experts(cfg) -> int:
    return getattr(cfg, "num_experts", None) or cfg.n_routed_experts


def first_moe_layer(cfg) -> int:
    return getattr(cfg, "first_k_dense_replace", 0) or 0


def safetensors_names(d: Path) -> dict[str, tuple]:
    from safetensors import safe_open

    names = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                sl = st.get_slice(k)
                names[k] = (tuple(sl.get_shape()), sl.get_dtype(), f.name)
    return names


def name_patterns(names) -> list[str]:
    pats = {re.sub(r"\.\d+\.", ".{i}.", re.sub(r"layers\.\d+\.", "layers.{L}.", k)) for k in names}
    return sorted(pats)


def sanity_checks(name: str, model, cfg) -> dict:
    """Family-specific checks that the loaded model really exercises what the case is about."""
    extra = {}
    rot = model.model.rotary_emb
    if name == "qwen3_moe":
        assert cfg.rope_parameters["rope_type"] == "yarn", cfg.rope_parameters
        assert rot.rope_type == "yarn"
        hd = cfg.head_dim
        default_inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
        assert not torch.allclose(rot.inv_freq, default_inv), "yarn inv_freq equals default"
        assert abs(rot.attention_scaling - (0.1 * math.log(4.0) + 1.0)) < 1e-9, rot.attention_scaling
        assert model.model.layers[0].self_attn.head_dim == 20
        extra["yarn_attention_scaling"] = float(rot.attention_scaling)
        extra["yarn_inv_freq"] = [float(x) for x in rot.inv_freq]
    if name == "mixtral":
        assert cfg.sliding_window == 24
    if name in ("qwen3_moe", "olmoe"):
        qn = model.model.layers[0].self_attn.q_norm.weight
        assert float((qn - 1).abs().max()) > 0.1, "q_norm not perturbed"
    if name in ("deepseek_v3", "deepseek_v3_noqlora"):
        attn = model.model.layers[0].self_attn
        qk_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        moe = model.model.layers[first_moe_layer(cfg)].mlp
        assert type(moe).__name__ == "DeepseekV3MoE"
        assert float(moe.gate.e_score_correction_bias.abs().max()) > 0.05, "correction bias not perturbed"
        assert float((attn.kv_a_layernorm.weight - 1).abs().max()) > 0.1, "kv_a_layernorm not perturbed"
        if name == "deepseek_v3":
            assert rot.rope_type == "yarn" and cfg.rope_interleave
            assert type(model.model.layers[0].mlp).__name__ == "DeepseekV3MLP"
            assert attn.q_a_proj is not None and attn.q_proj is None
            m_all = 0.1 * 0.7 * math.log(4.0) + 1.0
            assert abs(attn.scaling - qk_head**-0.5 * m_all * m_all) < 1e-12, attn.scaling
            assert abs(rot.attention_scaling - (0.1 * math.log(4.0) + 1.0) / m_all) < 1e-9, rot.attention_scaling
            extra["yarn_attention_scaling"] = float(rot.attention_scaling)
        else:
            assert attn.q_proj is not None and attn.q_a_proj is None and not cfg.rope_interleave
            assert abs(attn.scaling - qk_head**-0.5) < 1e-12
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        extra["softmax_scale"] = float(attn.scaling)
    if name == "glm4_moe":
        attn = model.model.layers[0].self_attn
        assert attn.use_qk_norm and attn.q_proj.bias is not None and attn.o_proj.bias is None
        assert rot.inv_freq.numel() == cfg.head_dim // 4, "partial rotary: a quarter of head_dim frequencies"
        assert type(model.model.layers[0].mlp).__name__ == "Glm4MoeMLP"
        assert float(model.model.layers[1].mlp.gate.e_score_correction_bias.abs().max()) > 0.05
    if name == "qwen2_moe":
        assert type(model.model.layers[1].mlp).__name__ == "Qwen2MoeMLP"
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return extra
