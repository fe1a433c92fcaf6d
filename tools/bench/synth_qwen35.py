#!/usr/bin/env python3
"""A seeded random Qwen3.5-MoE checkpoint (Gated DeltaNet and full-attention layers) of a
chosen size, in the Hugging Face layout, for benchmarks of what its recurrent state
costs (tools/bench_recurrent_reuse.sh). Standard library only: the weights are random
bf16 (|w| in [2^-7, 2^-5), norms 1), the tokenizer and chat template those of
tests/fixtures/qwen3_5_moe (a 406-id vocabulary), so the text is noise and the timings
are the point.

    python3 tools/bench/synth_qwen35.py OUT [--hidden 1024] [--layers 8] [--experts 16]
        [--intermediate 512] [--seed 0]

Every fourth layer is full attention (as the releases), the others Gated DeltaNet.
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "qwen3_5_moe")
# High byte of a bf16: sign kept, exponent 120-121 with the low byte's top bit.
HIGH = bytes((b & 0x80) | 0x3C for b in range(256))


def tensors(a):
    h, nk, nv, dk, dv = a.hidden, a.key_heads, a.value_heads, 128, 128
    heads, kv_heads, hd = a.heads, max(1, a.heads // 4), 128
    conv = 2 * nk * dk + nv * dv
    out = [("lm_head.weight", [406, h]), ("model.language_model.embed_tokens.weight", [406, h]),
           ("model.language_model.norm.weight", [h])]
    for l in range(a.layers):
        p = f"model.language_model.layers.{l}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
        if l % 4 == 3:
            out += [(p + "self_attn.q_proj.weight", [2 * heads * hd, h]),
                    (p + "self_attn.k_proj.weight", [kv_heads * hd, h]),
                    (p + "self_attn.v_proj.weight", [kv_heads * hd, h]),
                    (p + "self_attn.o_proj.weight", [h, heads * hd]),
                    (p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
        else:
            q = p + "linear_attn."
            out += [(q + "A_log", [nv]), (q + "dt_bias", [nv]), (q + "conv1d.weight", [conv, 1, 4]),
                    (q + "in_proj_qkv.weight", [conv, h]), (q + "in_proj_z.weight", [nv * dv, h]),
                    (q + "in_proj_a.weight", [nv, h]), (q + "in_proj_b.weight", [nv, h]),
                    (q + "norm.weight", [dv]), (q + "out_proj.weight", [h, nv * dv])]
        m = p + "mlp."
        e, i = a.experts, a.intermediate
        out += [(m + "gate.weight", [e, h]), (m + "experts.gate_up_proj", [e, 2 * i, h]),
                (m + "experts.down_proj", [e, h, i]), (m + "shared_expert.gate_proj.weight", [i, h]),
                (m + "shared_expert.up_proj.weight", [i, h]), (m + "shared_expert.down_proj.weight", [h, i]),
                (m + "shared_expert_gate.weight", [1, h])]
    return out


def values(name, count, rng):
    if name.endswith("norm.weight"):
        return b"\x80\x3f" * count  # 1.0
    raw = bytearray(rng.randbytes(2 * count))
    raw[1::2] = bytes(raw[1::2]).translate(HIGH)
    return bytes(raw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--key-heads", type=int, default=8)
    ap.add_argument("--value-heads", type=int, default=16)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if os.path.exists(os.path.join(a.out, "config.json")):
        sys.exit(f"{a.out} holds a model already")
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    cfg = json.load(open(os.path.join(FIXTURE, "config.json")))
    t = cfg["text_config"]
    t.update(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
             num_key_value_heads=max(1, a.heads // 4), head_dim=128, linear_num_key_heads=a.key_heads,
             linear_num_value_heads=a.value_heads, linear_key_head_dim=128, linear_value_head_dim=128,
             num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.intermediate,
             shared_expert_intermediate_size=a.intermediate, max_position_embeddings=8192,
             layer_types=["full_attention" if l % 4 == 3 else "linear_attention" for l in range(a.layers)])
    cfg.pop("vision_config", None)
    cfg["architectures"] = ["Qwen3_5MoeForCausalLM"]
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(FIXTURE, f), a.out)
    specs = tensors(a)
    header, offset = {}, 0
    for name, shape in specs:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for name, shape in specs:
            n = 1
            for d in shape:
                n *= d
            f.write(values(name, n, rng))
    print(f"{a.out}: {offset / 2**20:.0f} MiB of bf16, {len(specs)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
