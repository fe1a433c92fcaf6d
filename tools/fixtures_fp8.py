"""The FP8 block-scaled fixture: tests/fixtures/deepseek_v3_fp8.

A tiny deepseek_v3 checkpoint (MLA with q-LoRA, a dense first layer, a MoE layer with
sigmoid group-limited routing and shared experts, YaRN RoPE) laid out as DeepSeek-V3/R1,
Kimi-K2 and GLM-5 are published: every linear weight of the decoder layers is
`float8_e4m3fn` with a `<name>_scale_inv` f32 tensor of shape [ceil(rows/B0), ceil(cols/B1)],
config.json has `quantization_config = {quant_method: "fp8", fmt: "e4m3", weight_block_size:
[B0, B1], activation_scheme: "dynamic"}`, and the embedding, lm_head, norms and router stay
unquantized (bf16, the router's correction bias f32), as in the releases. The routed experts
are stored per expert (the hub layout).

The blocks here are [16, 32] on dims that are not multiples of them (hidden 40, MoE
intermediate 20, the latent's 28 rows...), so the last block of a row and of a column is
partial: the ceil edge is exercised. Block scales are max|w| / 448 per block (the way
DeepSeek's quantizer makes them), the e4m3 bytes torch's round-to-nearest-even cast.

The reference is transformers (f32, eager attention) run on exactly the dequantized weights,
`fp8.float() * scale` per block, put into the model's own parameters (its experts fused as it
holds them in memory): the logits of `IDS` teacher-forced, and the greedy continuation of a
prompt. reference.json also keeps the deepseek_v3 fixture's tokenizer cases (the same
tokenizer files are copied), which tests/tokenizer_fixtures.rs checks for every fixture.

Run from the repository root: python3 tools/fixtures_fp8.py (needs torch and transformers
5.23 or later; not needed by the tests, which read the committed files).
"""

from __future__ import annotations

import json
import math
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests/fixtures/deepseek_v3")  # tokenizer files and cases
OUT = os.path.join(ROOT, "tests/fixtures/deepseek_v3_fp8")
BLOCK = [16, 32]
SEED = 3200
N_IDS = 24
N_NEW = 16
MIN_GAP = 0.02

CONFIG = dict(
    vocab_size=408,
    hidden_size=40,
    intermediate_size=36,
    moe_intermediate_size=20,
    num_hidden_layers=2,
    first_k_dense_replace=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=24,
    kv_lora_rank=20,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    rope_interleave=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.7,
    },
    tie_word_embeddings=False,
    eos_token_id=400,
    bos_token_id=None,
    pad_token_id=None,
)

# Linear weights of the decoder layers that the releases store as FP8.
FP8_SUFFIXES = (
    "self_attn.q_a_proj.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_b_proj.weight",
    "self_attn.o_proj.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "down_proj.weight",
)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 bytes, f32 scales [ceil(r/B0), ceil(c/B1)]) of a 2-D f32 weight."""
    rows, cols = w.shape
    b0, b1 = BLOCK
    sr, sc = math.ceil(rows / b0), math.ceil(cols / b1)
    scale = torch.empty(sr, sc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            s = blk.abs().max() / 448.0
            s = s if s > 0 else torch.tensor(1.0)
            scale[i, j] = s
            q[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8.float() * its block's scale, in f32: the true weight."""
    b0, b1 = BLOCK
    s = scale.repeat_interleave(b0, 0)[: q.shape[0]].repeat_interleave(b1, 1)[:, : q.shape[1]]
    return q.to(torch.float32) * s


def build(seed: int):
    """Everything of the fixture made from `seed`."""
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(**CONFIG)
    model = DeepseekV3ForCausalLM(cfg).to(torch.float32).eval()
    sd = model.state_dict()
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    # Weights of ordinary spread: linear maps ~ 1/sqrt(fan_in), norms near 1.
    new = {}
    for name, t in sd.items():
        if name.endswith("norm.weight"):
            new[name] = 1.0 + 0.1 * randn(*t.shape)
        elif name.endswith("e_score_correction_bias"):
            new[name] = 0.05 * randn(*t.shape)
        elif name == "model.embed_tokens.weight":
            new[name] = randn(*t.shape)
        elif t.dim() >= 2:
            new[name] = randn(*t.shape) / math.sqrt(t.shape[-1])
        else:
            new[name] = t.clone()

    # The checkpoint (per-expert tensors, FP8 where the releases have it) and the
    # dequantized weights the reference runs on.
    ckpt: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    ne, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
    for name, t in new.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            for e in range(ne):
                ckpt[f"{p}{e}.gate_proj.weight"] = t[e, :inter]
                ckpt[f"{p}{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            p = name[: -len("down_proj")]
            for e in range(ne):
                ckpt[f"{p}{e}.down_proj.weight"] = t[e]
        else:
            ckpt[name] = t
    stored: dict[str, torch.Tensor] = {}
    for name, t in ckpt.items():
        if name.startswith("model.layers.") and name.endswith(FP8_SUFFIXES):
            q, s = quantize(t.float())
            stored[name] = q
            stored[name + "_scale_inv"] = s
            deq[name] = dequantize(q, s)
        elif name.endswith("e_score_correction_bias"):
            stored[name] = t.float().contiguous()
            deq[name] = stored[name]
        else:
            stored[name] = t.to(torch.bfloat16).contiguous()
            deq[name] = stored[name].float()
    n_sub = sum(int(((q.view(torch.uint8) & 0x78) == 0).sum()) for n, q in stored.items() if q.dtype == torch.float8_e4m3fn)

    # The model's parameters: the dequantized weights, experts fused back.
    params = {}
    for name in new:
        if name.endswith("mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            params[name] = torch.stack(
                [torch.cat([deq[f"{p}{e}.gate_proj.weight"], deq[f"{p}{e}.up_proj.weight"]]) for e in range(ne)]
            )
        elif name.endswith("mlp.experts.down_proj"):
            p = name[: -len("down_proj")]
            params[name] = torch.stack([deq[f"{p}{e}.down_proj.weight"] for e in range(ne)])
        else:
            params[name] = deq[name]
    model.load_state_dict(params, strict=True)
    model.config._attn_implementation = "eager"

    src_ref = json.load(open(os.path.join(SRC, "reference.json")))
    ids = src_ref["ids"][:N_IDS]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
        prompt = src_ref["greedy"]["prompt_ids"]
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
    new_ids = out.sequences[0, len(prompt) :].tolist()
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    tf_gaps = (logits.topk(2, dim=-1).values[:, 0] - logits.topk(2, dim=-1).values[:, 1]).tolist()
    return cfg, stored, n_sub, src_ref, ids, logits, prompt, new_ids, gaps, tf_gaps


def write_checkpoint(out, src, stored, cfg, architecture, logits) -> None:
    """Writes an FP8 release-layout fixture to `out` (emptied first): the tensors, config.json
    with the releases' quantization_config, the tokenizer files of fixture `src`, and the
    reference logits."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    save_file(stored, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_dict()
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": BLOCK,
        "activation_scheme": "dynamic",
    }
    config["dtype"] = "bfloat16"
    config["architectures"] = [architecture]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, name), os.path.join(out, name))
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))


def main() -> None:
    # The first seed from SEED whose greedy continuation has no near-tie (a tie would make
    # the token test a coin toss between equally right answers).
    for seed in range(SEED, SEED + 100):
        cfg, stored, n_sub, src_ref, ids, logits, prompt, new_ids, gaps, tf_gaps = build(seed)
        if min(gaps) >= MIN_GAP:
            break
    else:
        raise SystemExit(f"no seed in {SEED}..{SEED + 100} gives greedy gaps >= {MIN_GAP}")

    write_checkpoint(OUT, SRC, stored, cfg, "DeepseekV3ForCausalLM", logits)
    ref = {
        "model_type": "deepseek_v3",
        "dtype_on_disk": "float8_e4m3fn (block-scaled) + bfloat16",
        "weight_block_size": BLOCK,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "vocab_size": cfg.vocab_size,
        "ids": ids,
        "logits_file": "logits.bin",
        "logits_std": float(logits.std()),
        "greedy": {"prompt_ids": prompt, "new_ids": new_ids, "min_top2_gap": min(gaps)},
        "tokenizer": src_ref["tokenizer"],
        "chat": src_ref["chat"],
        "diagnostics": {
            "seed": seed,
            "reference": "transformers f32, eager attention, on fp8.float() * scale_inv per block",
            "teacher_forced_min_top2_gap": min(tf_gaps),
            "e4m3_subnormal_or_zero_bytes": n_sub,
            "tokenizer_vocab_size": src_ref["diagnostics"]["tokenizer_vocab_size"],
        },
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{OUT}: greedy {new_ids}, min gap {min(gaps):.4f}, subnormal/zero bytes {n_sub}")


if __name__ == "__main__":
    main()
