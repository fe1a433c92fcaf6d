#!/usr/bin/env python3
"""Independent from-scratch forward pass over the fixtures (no transformers modelling code).

    python3 tools/ref_forward.py [CASE ...]

Reads config.json + *.safetensors of each tests/fixtures/CASE, runs the model in float32
with plain torch ops written from the family's math (the same math the Rust engine has to
implement), and checks it against logits.bin and the greedy continuation in reference.json.
It is a cross-check of the fixtures and a compact executable spec; it needs torch and
safetensors only, and CI never needs it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


# e2m1 values by nibble (MXFP4).
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequant_mxfp4(blocks, scales):
    """[E, out, in/32, 16] nibble bytes (low nibble = even element) and [E, out, in/32]
    e8m0 scales (2^(s-127)) -> the fused x @ W layout [E, in, out]."""
    b = blocks.long()
    vals = torch.stack([FP4[b & 15], FP4[b >> 4]], -1).reshape(*b.shape[:-1], 32)
    vals = vals * torch.pow(2.0, scales.double() - 127).float()[..., None]
    return vals.reshape(b.shape[0], b.shape[1], -1).transpose(1, 2)


def load_weights(d: Path) -> dict[str, torch.Tensor]:
    raw = {}
    for f in sorted(d.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    w = {k: v.float() for k, v in raw.items() if not k.endswith(("_blocks", "_scales"))}
    for k in raw:
        if k.endswith("_blocks"):  # gpt_oss MXFP4 experts
            base = k.removesuffix("_blocks")
            w[base] = dequant_mxfp4(raw[k], raw[base + "_scales"])
    return w


def gpt_oss_attention(cfg, w, a, h, cos, sin, mask):
    """GQA with biases on q/k/v/o and one sink logit per head in the softmax denominator."""
    T, nh, nkv, hd = h.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (h @ w[a + "q_proj.weight"].T + w[a + "q_proj.bias"]).view(T, nh, hd).transpose(0, 1)
    k = (h @ w[a + "k_proj.weight"].T + w[a + "k_proj.bias"]).view(T, nkv, hd).transpose(0, 1)
    v = (h @ w[a + "v_proj.weight"].T + w[a + "v_proj.bias"]).view(T, nkv, hd).transpose(0, 1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    s = q @ k.transpose(1, 2) * hd**-0.5 + mask  # [nh, T, T]
    sink = w[a + "sinks"].view(nh, 1, 1).expand(nh, T, 1)
    p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    o = (p @ v).transpose(0, 1).reshape(T, nh * hd)
    return o @ w[a + "o_proj.weight"].T + w[a + "o_proj.bias"]


def gpt_oss_ffn(cfg, w, p, h):
    """Router with a bias, softmax over the top-k logits; experts with biases and the
    clamped SwiGLU, gate and up in alternate columns of gate_up_proj."""
    m = p + "mlp."
    logits = h @ w[m + "router.weight"].T + w[m + "router.bias"]
    topv, topi = logits.topk(cfg["num_experts_per_tok"], -1)
    topv = torch.softmax(topv, -1)
    alpha, limit = cfg.get("swiglu_alpha", 1.702), cfg.get("swiglu_limit", 7.0)
    gu_w, gu_b = w[m + "experts.gate_up_proj"], w[m + "experts.gate_up_proj_bias"]
    d_w, d_b = w[m + "experts.down_proj"], w[m + "experts.down_proj_bias"]
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(topi.shape[1]):
            e = int(topi[t, j])
            gu = h[t] @ gu_w[e] + gu_b[e]
            gate, up = gu[::2].clamp(max=limit), gu[1::2].clamp(-limit, limit)
            y = ((up + 1) * gate * torch.sigmoid(gate * alpha)) @ d_w[e] + d_b[e]
            out[t] += topv[t, j] * y
    return out


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(cfg, head_dim, n_pos):
    rp = cfg["rope_parameters"]
    base = rp["rope_theta"]
    exps = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv = 1.0 / base**exps
    scale = 1.0
    if rp["rope_type"] == "yarn":
        factor = rp["factor"]
        omax = rp["original_max_position_embeddings"]
        beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def corr_dim(rot):
            return head_dim * math.log(omax / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extra = 1 - ramp  # 1 -> keep original frequency, 0 -> divide by factor
        inv = (inv / factor) * (1 - extra) + inv * extra
        mscale = lambda m: 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0
        if rp.get("attention_factor"):
            scale = rp["attention_factor"]
        elif rp.get("mscale") and rp.get("mscale_all_dim"):  # deepseek_v3
            scale = mscale(rp["mscale"]) / mscale(rp["mscale_all_dim"])
        else:
            scale = mscale(1.0)
    elif rp["rope_type"] != "default":
        raise NotImplementedError(rp["rope_type"])
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)  # [T, head_dim], "rotate_half" layout
    return (ang.cos() * scale).float(), (ang.sin() * scale).float()


def apply_rope(x, cos, sin):  # x [H, T, D]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def swiglu(x, g, u, d):
    return (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T


def deepseek_attention(cfg, w, a, h, cos, sin, mask):
    """Multi-head Latent Attention, expanded (no absorption): per head, keys and values from
    kv_b applied to the normalised latent, plus one rotary key shared by every head."""
    T = h.shape[0]
    nh = cfg["num_attention_heads"]
    dn, dr, dv, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    if cfg.get("q_lora_rank") is None:
        q = h @ w[a + "q_proj.weight"].T
    else:  # the latent norms use 1e-6 whatever rms_norm_eps says
        q = rms_norm(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6) @ w[a + "q_b_proj.weight"].T
    q = q.view(T, nh, dn + dr).transpose(0, 1)
    ckv = h @ w[a + "kv_a_proj_with_mqa.weight"].T
    c = rms_norm(ckv[:, :r], w[a + "kv_a_layernorm.weight"], 1e-6)
    k_rot = ckv[:, r:][None]  # [1, T, dr]
    q_rot = q[..., dn:]
    if cfg.get("rope_interleave", True):  # pairs (0,1), (2,3), ... -> the two halves
        q_rot = torch.cat([q_rot[..., 0::2], q_rot[..., 1::2]], -1)
        k_rot = torch.cat([k_rot[..., 0::2], k_rot[..., 1::2]], -1)
    q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot, cos, sin)
    kv = (c @ w[a + "kv_b_proj.weight"].T).view(T, nh, dn + dv).transpose(0, 1)
    k = torch.cat([kv[..., :dn], k_rot.expand(nh, T, dr)], -1)
    q = torch.cat([q[..., :dn], q_rot], -1)
    scale = (dn + dr) ** -0.5
    rp = cfg.get("rope_parameters") or {}
    if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim"):
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
        scale = scale * m * m
    s = q @ k.transpose(1, 2) * scale + mask
    o = (torch.softmax(s, -1) @ kv[..., dn:]).transpose(0, 1).reshape(T, nh * dv)
    return o @ w[a + "o_proj.weight"].T


def deepseek_route(cfg, w, m, h):
    """Sigmoid scores; selection on scores + e_score_correction_bias within the topk_group
    groups whose two best selection scores sum highest; weights from the unbiased scores."""
    n_exp, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = cfg["n_group"], cfg["topk_group"]
    scores = torch.sigmoid(h @ w[m + "gate.weight"].T)
    choice = scores + w[m + "gate.e_score_correction_bias"]
    groups = choice.view(-1, ng, n_exp // ng).topk(2, -1).values.sum(-1)
    keep = torch.zeros_like(groups).scatter(1, groups.topk(tg, -1).indices, 1.0)
    keep = keep[:, :, None].expand(-1, ng, n_exp // ng).reshape(-1, n_exp).bool()
    topi = choice.masked_fill(~keep, float("-inf")).topk(k, -1).indices
    topv = scores.gather(1, topi)
    if cfg.get("norm_topk_prob", True):
        topv = topv / (topv.sum(-1, keepdim=True) + 1e-20)
    return topv * cfg["routed_scaling_factor"], topi


def deepseek_ffn(cfg, w, p, h):
    m = p + "mlp."
    if m + "gate.weight" not in w:  # the first_k_dense_replace dense layers
        return swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    topv, topi = deepseek_route(cfg, w, m, h)
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(topi.shape[1]):
            e = m + f"experts.{int(topi[t, j])}."
            g, u, d = (w[e + f"{n}_proj.weight"] for n in ("gate", "up", "down"))
            out[t] += topv[t, j] * swiglu(h[t : t + 1], g, u, d)[0]
    se = m + "shared_experts."  # ungated
    return out + swiglu(h, w[se + "gate_proj.weight"], w[se + "up_proj.weight"], w[se + "down_proj.weight"])


def qwen3_next_forward(cfg, w, ids):
    """Qwen3-Next: zero-centred norms (scale 1 + w); Gated DeltaNet layers (causal conv,
    L2-normalised q/k, the delta rule token by token) and gated full-attention layers
    (query + sigmoid output gate per head, per-head q/k norms, partial rotary);
    qwen2_moe's MoE (softmax router, sigmoid-gated shared expert)."""
    T = len(ids)
    H, nh, nkv, hd, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    r = nv // nk
    rot = int(hd * cfg["rope_parameters"].get("partial_rotary_factor", 0.25))
    cos, sin = rope_tables(cfg, rot, T)
    mask = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    norm = lambda x, n: rms_norm(x, 1.0 + w[n], eps)
    l2 = lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for L, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{L}."
        h = norm(x, p + "input_layernorm.weight")
        if kind == "linear_attention":
            a = p + "linear_attn."
            qkvz = (h @ w[a + "in_proj_qkvz.weight"].T).view(T, nk, 2 * dk + 2 * r * dv)
            ba = (h @ w[a + "in_proj_ba.weight"].T).view(T, nk, 2 * r)
            q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], -1)
            b, av = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
            mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)  # [T, C]
            cw = w[a + "conv1d.weight"][:, 0, :]  # [C, K]
            padded = torch.cat([torch.zeros(K - 1, mixed.shape[1]), mixed])
            conv = torch.stack([(padded[t : t + K].T * cw).sum(-1) for t in range(T)])
            mixed = torch.nn.functional.silu(conv)
            q = l2(mixed[:, : nk * dk].view(T, nk, dk)).repeat_interleave(r, 1) * dk**-0.5
            k = l2(mixed[:, nk * dk : 2 * nk * dk].view(T, nk, dk)).repeat_interleave(r, 1)
            v = mixed[:, 2 * nk * dk :].view(T, nv, dv)
            beta = torch.sigmoid(b)
            decay = torch.exp(-w[a + "A_log"].exp() * torch.nn.functional.softplus(av + w[a + "dt_bias"]))
            S = torch.zeros(nv, dk, dv)
            o = torch.zeros(T, nv, dv)
            for t in range(T):
                S = S * decay[t][:, None, None]
                err = (v[t] - torch.einsum("hkv,hk->hv", S, k[t])) * beta[t][:, None]
                S = S + torch.einsum("hk,hv->hkv", k[t], err)
                o[t] = torch.einsum("hkv,hk->hv", S, q[t])
            o = rms_norm(o, w[a + "norm.weight"], eps) * torch.nn.functional.silu(z.reshape(T, nv, dv))
            x = x + o.reshape(T, nv * dv) @ w[a + "out_proj.weight"].T
        else:
            a = p + "self_attn."
            bias = lambda n: w.get(a + n + ".bias", 0.0)
            qg = (h @ w[a + "q_proj.weight"].T + bias("q_proj")).view(T, nh, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
            k = (h @ w[a + "k_proj.weight"].T + bias("k_proj")).view(T, nkv, hd)
            v = (h @ w[a + "v_proj.weight"].T + bias("v_proj")).view(T, nkv, hd).transpose(0, 1)
            q = norm(q, a + "q_norm.weight").transpose(0, 1)
            k = norm(k, a + "k_norm.weight").transpose(0, 1)
            q = torch.cat([apply_rope(q[..., :rot], cos, sin), q[..., rot:]], -1)
            k = torch.cat([apply_rope(k[..., :rot], cos, sin), k[..., rot:]], -1)
            k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
            att = torch.softmax(q @ k.transpose(1, 2) * hd**-0.5 + mask, -1) @ v
            o = att.transpose(0, 1).reshape(T, nh * hd) * torch.sigmoid(gate)
            x = x + o @ w[a + "o_proj.weight"].T + bias("o_proj")
        h = norm(x, p + "post_attention_layernorm.weight")
        m = p + "mlp."
        if m + "gate.weight" not in w:  # dense layer (mlp_only_layers)
            x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
            continue
        topv, topi = torch.softmax(h @ w[m + "gate.weight"].T, -1).topk(cfg["num_experts_per_tok"], -1)
        if cfg.get("norm_topk_prob", True):
            topv = topv / topv.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(T):
            for j in range(topi.shape[1]):
                g, u, d = (w[m + f"experts.{int(topi[t, j])}.{n}_proj.weight"] for n in ("gate", "up", "down"))
                out[t] += topv[t, j] * swiglu(h[t : t + 1], g, u, d)[0]
        se = m + "shared_expert."
        shared = swiglu(h, w[se + "gate_proj.weight"], w[se + "up_proj.weight"], w[se + "down_proj.weight"])
        x = x + out + torch.sigmoid(h @ w[m + "shared_expert_gate.weight"].T) * shared
    x = norm(x, "model.norm.weight")
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def forward(cfg, w, ids):
    mt = cfg["model_type"]
    if mt == "qwen3_next":
        return qwen3_next_forward(cfg, w, ids)
    T = len(ids)
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh  # deepseek_v3: head_dim is qk_rope_head_dim
    eps = cfg["rms_norm_eps"]
    n_exp = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    top_k = cfg["num_experts_per_tok"]
    window = cfg.get("sliding_window") if (mt == "mixtral" or cfg.get("use_sliding_window")) else None
    # Partial rotary (glm4_moe): only the first rotary_dim values of each head turn.
    partial = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or cfg.get("partial_rotary_factor")
    rot_dim = int(hd * (partial or (0.5 if mt == "glm4_moe" else 1.0)))
    cos, sin = rope_tables(cfg, rot_dim, T)

    qi = torch.arange(T)[:, None]
    ki = torch.arange(T)[None, :]

    def causal(window):
        allowed = ki <= qi
        if window:
            allowed &= ki > qi - window
        return torch.zeros(T, T).masked_fill(~allowed, float("-inf"))

    mask = causal(window)

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        a = p + "self_attn."
        if mt == "gpt_oss":  # sliding window on the layers layer_types marks
            sliding = cfg["layer_types"][L] == "sliding_attention"
            x = x + gpt_oss_attention(cfg, w, a, h, cos, sin, causal(cfg["sliding_window"] if sliding else None))
            x = x + gpt_oss_ffn(cfg, w, p, rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
            continue
        if mt == "deepseek_v3":
            x = x + deepseek_attention(cfg, w, a, h, cos, sin, mask)
            x = x + deepseek_ffn(cfg, w, p, rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
            continue
        q = h @ w[a + "q_proj.weight"].T
        k = h @ w[a + "k_proj.weight"].T
        v = h @ w[a + "v_proj.weight"].T
        if a + "q_proj.bias" in w:
            q, k, v = q + w[a + "q_proj.bias"], k + w[a + "k_proj.bias"], v + w[a + "v_proj.bias"]
        if mt == "olmoe":  # full-width norms over all heads, then clip
            q = rms_norm(q, w[a + "q_norm.weight"], eps)
            k = rms_norm(k, w[a + "k_norm.weight"], eps)
            c = cfg.get("clip_qkv")
            if c is not None:
                q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q = q.view(T, nh, hd).transpose(0, 1)
        k = k.view(T, nkv, hd).transpose(0, 1)
        v = v.view(T, nkv, hd).transpose(0, 1)
        if mt in ("qwen3_moe", "glm4_moe") and a + "q_norm.weight" in w:  # per-head norms
            q = rms_norm(q, w[a + "q_norm.weight"], eps)
            k = rms_norm(k, w[a + "k_norm.weight"], eps)
        q = torch.cat([apply_rope(q[..., :rot_dim], cos, sin), q[..., rot_dim:]], -1)
        k = torch.cat([apply_rope(k[..., :rot_dim], cos, sin), k[..., rot_dim:]], -1)
        rep = nh // nkv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        s = q @ k.transpose(1, 2) * hd**-0.5 + mask
        o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(T, nh * hd)
        x = x + o @ w[a + "o_proj.weight"].T

        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if mt == "glm4_moe":  # deepseek_v3's MoE block: sigmoid router, shared experts
            x = x + deepseek_ffn(cfg, w, p, h)
            continue
        if mt == "mixtral":
            m, gname = p + "block_sparse_moe.", "gate.weight"
            proj = lambda e: (m + f"experts.{e}.w1.weight", m + f"experts.{e}.w3.weight", m + f"experts.{e}.w2.weight")
            renorm = True
        else:
            m, gname = p + "mlp.", "gate.weight"
            proj = lambda e: tuple(m + f"experts.{e}.{n}_proj.weight" for n in ("gate", "up", "down"))
            renorm = cfg.get("norm_topk_prob", False)
        if m + gname not in w:  # dense layer (qwen2_moe mlp_only_layers)
            x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
            continue
        probs = torch.softmax(h @ w[m + gname].T, -1)
        topv, topi = probs.topk(top_k, -1)
        if renorm:
            topv = topv / topv.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(T):
            for j in range(top_k):
                g, u, d = (w[n] for n in proj(int(topi[t, j])))
                out[t] += topv[t, j] * swiglu(h[t : t + 1], g, u, d)[0]
        if m + "shared_expert.gate_proj.weight" in w:
            se = m + "shared_expert."
            shared = swiglu(h, w[se + "gate_proj.weight"], w[se + "up_proj.weight"], w[se + "down_proj.weight"])
            out = out + torch.sigmoid(h @ w[m + "shared_expert_gate.weight"].T) * shared
        x = x + out
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    assert n_exp is not None
    return x @ head.T


def check(name: str) -> bool:
    d = FIXTURES / name
    cfg = json.loads((d / "config.json").read_text())
    ref = json.loads((d / "reference.json").read_text())
    w = load_weights(d)
    V = ref["vocab_size"]
    want = torch.frombuffer(bytearray((d / ref["logits_file"]).read_bytes()), dtype=torch.float32).view(-1, V)
    with torch.no_grad():
        got = forward(cfg, w, ref["ids"])
        diff = float((got - want).abs().max())
        seq = list(ref["greedy"]["prompt_ids"])
        for _ in ref["greedy"]["new_ids"]:
            seq.append(int(forward(cfg, w, seq)[-1].argmax()))
    new = seq[len(ref["greedy"]["prompt_ids"]):]
    ok = diff < 1e-3 * ref["logits_std"] and new == ref["greedy"]["new_ids"]
    print(f"{name:10s} max|logits diff| {diff:.3e} (std {ref['logits_std']:.3f})  "
          f"greedy {'match' if new == ref['greedy']['new_ids'] else 'MISMATCH'}  -> {'OK' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    torch.set_num_threads(1)
    names = sys.argv[1:] or sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.json").exists())
    sys.exit(0 if all([check(n) for n in names]) else 1)
