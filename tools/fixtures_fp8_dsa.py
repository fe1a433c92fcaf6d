"""The FP8 DSA fixture: tests/fixtures/glm_moe_dsa_fp8.

A tiny glm_moe_dsa (GLM-5) checkpoint in the FP8 release layout, the DSA counterpart of
tools/fixtures_fp8.py (whose `quantize` / `dequantize` it uses): every weight that
transformers' finegrained FP8 integration loads as FP8 is stored as `float8_e4m3fn` with a
`<name>_scale_inv` f32 tensor per [16, 32] block (partial blocks at the edges), with
`quantization_config = {quant_method: "fp8", fmt: "e4m3", weight_block_size: [16, 32],
activation_scheme: "dynamic"}`. That integration swaps every `nn.Linear` of the model
except the output projection (`lm_head`) and the modules the model keeps in f32
(`_keep_in_fp32_modules`: the indexer's `weights_proj`); the router is not an
`nn.Linear`. So FP8 here: MLA's q_a/q_b/kv_a/kv_b/o projections, the indexer's `wq_b` and
`wk`, the dense MLP, the routed experts (per expert, the hub layout) and the shared
expert; bf16: embedding, lm_head, norms (the indexer's LayerNorm weight and bias too),
router, the indexer's `weights_proj`; f32: the router's correction bias.

The shape is tools/fixtures_dsa.py's glm_moe_dsa (hidden 64, 3 layers: dense, then two MoE
layers; `indexer_types` full, shared, full; index_topk 6 of 8 index heads x 16, the
indexer's rope interleaved): the 48 teacher-forced ids and the 8 + 16 greedy ones are
longer than index_topk, so the sparse path decides. A seed is rejected when the greedy
continuation has a near-tie or an indexer selection is nearly tied (fixtures_dsa's
`selection_gap`, recomputed in float64 on the dequantized weights).

The reference is transformers (f32, eager attention and experts) on exactly the dequantized
weights, `fp8.float() * scale` per block, put into the model's own parameters.

Run from the repository root: python3 tools/fixtures_fp8_dsa.py (needs torch and
transformers 5.23 or later; the tests read the committed files only).
"""

from __future__ import annotations

import json
import math
import os

import torch
import transformers
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

import fixtures_dsa
from fixtures_fp8 import BLOCK, dequantize, quantize, write_checkpoint

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests/fixtures/glm_moe_dsa")  # tokenizer files and cases
OUT = os.path.join(ROOT, "tests/fixtures/glm_moe_dsa_fp8")
SEED = 3300
N_NEW = 16
MIN_GAP = 0.02

CONFIG = dict(
    fixtures_dsa.CASES["glm_moe_dsa"]["config"],
    vocab_size=404,
    eos_token_id=400,
    bos_token_id=None,
    pad_token_id=None,
)
CONFIG.pop("num_mtp_layers", None)


def is_fp8(name: str, t: torch.Tensor) -> bool:
    """Whether transformers' FP8 integration holds this checkpoint tensor as FP8."""
    return (
        name.startswith("model.layers.")
        and name.endswith(".weight")
        and t.dim() == 2
        and not name.endswith(("mlp.gate.weight", "indexer.weights_proj.weight"))
    )


def build(seed: int):
    """Everything of the fixture made from `seed`."""
    torch.manual_seed(seed)
    cfg = GlmMoeDsaConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = GlmMoeDsaForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    # Linear maps ~ 1/sqrt(fan_in) (the attention's a little stronger, so that the
    # selection matters), norms near 1, the indexer's LayerNorm bias small.
    new = {}
    for name, t in model.state_dict().items():
        if name.endswith("norm.weight"):
            new[name] = 1.0 + 0.1 * randn(*t.shape)
        elif name.endswith("k_norm.bias"):
            new[name] = 0.1 * randn(*t.shape)
        elif name.endswith("e_score_correction_bias"):
            new[name] = 0.05 * randn(*t.shape)
        elif name == "model.embed_tokens.weight":
            new[name] = randn(*t.shape)
        elif t.dim() >= 2:
            qk = ("q_b_proj.weight", "kv_b_proj.weight", "wq_b.weight", "wk.weight")
            new[name] = (1.6 if name.endswith(qk) else 1.0) * randn(*t.shape) / math.sqrt(t.shape[-1])
        else:
            new[name] = t.clone()

    # The checkpoint (per-expert tensors) and the dequantized weights the reference runs on.
    ckpt: dict[str, torch.Tensor] = {}
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
    deq: dict[str, torch.Tensor] = {}
    for name, t in ckpt.items():
        if is_fp8(name, t):
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

    src_ref = json.load(open(os.path.join(SRC, "reference.json")))
    ids = src_ref["ids"]
    prompt = src_ref["greedy"]["prompt_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
    new_ids = out.sequences[0, len(prompt) :].tolist()
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    sel = min(fixtures_dsa.selection_gap(model, cfg, seq) for seq in (ids, prompt + new_ids))
    return cfg, stored, src_ref, ids, logits, prompt, new_ids, gaps, sel


def main() -> None:
    for seed in range(SEED, SEED + 100):
        cfg, stored, src_ref, ids, logits, prompt, new_ids, gaps, sel = build(seed)
        if min(gaps) >= MIN_GAP and sel >= fixtures_dsa.SELECT_GAP_MIN:
            break
        print(f"seed {seed}: greedy gap {min(gaps):.4f}, selection gap {sel:.3g}")
    else:
        raise SystemExit(f"no seed in {SEED}..{SEED + 100} is clear of near-ties")

    write_checkpoint(OUT, SRC, stored, cfg, "GlmMoeDsaForCausalLM", logits)
    n_fp8 = sum(1 for q in stored.values() if q.dtype == torch.float8_e4m3fn)
    ref = {
        "model_type": "glm_moe_dsa",
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
            "reference": "transformers f32, eager attention and experts, on fp8.float() * scale_inv per block",
            "fp8_tensors": n_fp8,
            "dsa_min_selection_gap": sel,
            "tokenizer_vocab_size": src_ref["diagnostics"]["tokenizer_vocab_size"],
        },
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{OUT}: seed {seed}, greedy {new_ids}, min gap {min(gaps):.4f}, selection gap {sel:.3g}, {n_fp8} FP8 tensors")


if __name__ == "__main__":
    main()
