"""DeepSeek-V4 in the release's mixed FP4/FP8 layout: tests/fixtures/deepseek_v4_fp8.

    python3 tools/fixtures_v4_fp8.py

A tiny random DeepSeek-V4 (tools/fixtures_v4.py's model: every attention type, hash and
learned routing, 3 hyper-connection streams; hidden 64 and expert width 32 so that every
expert row is whole blocks of 32) written as DeepSeek-V4-Flash is published, under the
release's own names (no `model.` prefix: `embed.weight`, `head.weight`, `norm.weight`,
`hc_head_fn`, `layers.L.attn.wq_a.weight`, `layers.L.ffn.experts.E.w1.weight`, ...), which
transformers 5.23's conversion mapping renames on load:

- config.json: `quantization_config` {quant_method "fp8", fmt "e4m3", scale_fmt "ue8m0",
  weight_block_size [16, 32], activation_scheme "dynamic"} and `expert_dtype` "fp4" at the
  top level (as V4 ships it; transformers folds it into quantization_config);
- the dense linear weights of attention (`wq_a`, `wq_b`, `wkv`, `wo_a`, `wo_b`, the
  indexer's `wq_b`) and of the shared expert (`w1`, `w2`, `w3`): F8_E4M3 with `X.scale`
  (F8_E8M0, one power of two per block of [16, 32], blocks cut at the edges of dims that
  are not multiples of them), the name transformers' FP8 quantizer renames to
  `X.weight_scale_inv`;
- the routed experts: FP4 e2m1, two values per byte (value 2i in the low nibble) as I8
  `[rows, cols / 2]`, with `X.scale` F8_E8M0 `[rows, cols / 32]` (one per 32 values of a
  row), as transformers' FP8Experts allocates them for `expert_dtype` "fp4";
- BF16 embeddings, head, router, the compressors' and the indexer's `wkv` / `wgate` /
  `weights_proj`; F32 norms, sinks, `ape`, correction biases and hyper-connection tensors;
  `tid2eid` I64.

Scales are powers of two: 2^ceil(log2(amax / 448)) per FP8 block, 2^ceil(log2(amax / 6)) per
FP4 group; values are rounded to the nearest e4m3 (torch's cast) or e2m1.

The reference is transformers (f32, eager attention) run on exactly the dequantized
weights (e4m3 * 2^s and e2m1 * 2^s are exact in f32), loaded from a checkpoint of those
values under transformers' own names: teacher-forced logits over 48 ids and a greedy
continuation (8 + 24) through its cache, seeds rejected on near-ties as in
tools/fixtures_v4.py (whose model, initialisation and checks this script reuses). Last,
transformers loads the written release layout itself (FineGrainedFP8Config(dequantize=True):
its renaming, the `.scale` names, the FP4 experts) and must give the same logits bit for bit.
Needs torch, transformers 5.23 and accelerate; the tests read the committed files only.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures_v4 as v4  # noqa: E402

NAME = "deepseek_v4_fp8"
BLOCK = [16, 32]
FP4_GROUP = 32
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
v4.CONFIG.update(hidden_size=64, moe_intermediate_size=32)

# Dense linear weights the release stores as FP8 (suffixes of the names transformers saves).
FP8 = (
    "attn.wq_a.weight",
    "attn.wq_b.weight",
    "attn.wkv.weight",
    "attn.wo_a.weight",
    "attn.wo_b.weight",
    "attn.indexer.wq_b.weight",
    "shared_experts.w1.weight",
    "shared_experts.w2.weight",
    "shared_experts.w3.weight",
)
BF16 = (
    "embed_tokens.weight",
    "head.weight",
    "ffn.gate.weight",
    "compressor.wkv.weight",
    "compressor.wgate.weight",
    "indexer.weights_proj.weight",
)


def pow2_exponent(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The smallest e with amax / 2^e <= top (0 for an all-zero block)."""
    e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / top))
    return torch.where(amax > 0, e, torch.zeros_like(e)).to(torch.int32)


def e8m0(exps: torch.Tensor) -> torch.Tensor:
    return (exps + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def fp8_quantize(w: torch.Tensor):
    """(e4m3 [r, c], e8m0 scales [ceil(r/16), ceil(c/32)], the dequantized f32 weight)."""
    rows, cols = w.shape
    b0, b1 = BLOCK
    sr, sc = math.ceil(rows / b0), math.ceil(cols / b1)
    exps = torch.zeros(sr, sc, dtype=torch.int32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    deq = torch.empty(rows, cols, dtype=torch.float32)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            e = pow2_exponent(blk.abs().max(), 448.0)
            exps[i, j] = e
            qb = (blk / 2.0 ** float(e)).to(torch.float8_e4m3fn)
            q[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = qb
            deq[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = qb.to(torch.float32) * 2.0 ** float(e)
    return q, e8m0(exps), deq


def fp4_quantize(w: torch.Tensor):
    """(packed e2m1 I8 [r, c/2], e8m0 scales [r, c/32], the dequantized f32 weight)."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // FP4_GROUP, FP4_GROUP)
    exps = pow2_exponent(g.abs().amax(-1), 6.0)
    x = g / torch.pow(2.0, exps.to(torch.float32)).unsqueeze(-1)
    mag = (x.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)
    codes = (mag | torch.where(x < 0, 8, 0)).to(torch.uint8).reshape(rows, cols)
    value = E2M1[mag] * torch.where(x < 0, -1.0, 1.0)
    deq = (value * torch.pow(2.0, exps.to(torch.float32)).unsqueeze(-1)).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, e8m0(exps), deq


def release_name(name: str) -> str:
    """transformers' saved name -> the release's (its conversion mapping's source name)."""
    top = {
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
    }
    if name in top:
        return top[name]
    return name.removeprefix("model.")


def layout(saved: dict[str, torch.Tensor]):
    """(the release's tensors, the dequantized f32 tensors under transformers' names)."""
    release, deq = {}, {}
    for name, t in sorted(saved.items()):
        base = release_name(name)
        if t.dtype in (torch.int64, torch.int32):
            release[base], deq[name] = t, t
        elif ".experts." in name and ".shared_experts." not in name:
            q, s, d = fp4_quantize(t.float())
            release[base], deq[name] = q, d
            release[base.removesuffix(".weight") + ".scale"] = s
        elif name.endswith(FP8):
            q, s, d = fp8_quantize(t.float())
            release[base], deq[name] = q, d
            release[base.removesuffix(".weight") + ".scale"] = s
        elif name.endswith(BF16):
            b = t.to(torch.bfloat16)
            release[base], deq[name] = b, b.float()
        else:
            release[base], deq[name] = t.float(), t.float()
    return release, deq


def main() -> int:
    src = v4.FIXTURES / v4.TOKENIZER_FROM
    ref0 = json.loads((src / "reference.json").read_text())
    tok_vocab = ref0["diagnostics"]["tokenizer_vocab_size"]
    eos = json.loads((src / "config.json").read_text())["eos_token_id"]
    vocab = tok_vocab + 5
    g = torch.Generator().manual_seed(v4.BASE_SEED + 77)
    ids = torch.randint(0, tok_vocab, (v4.SEQ_LEN,), generator=g).tolist()
    prompt = torch.randint(0, tok_vocab, (v4.PROMPT_LEN,), generator=g).tolist()
    bad = set(range(tok_vocab - 3, vocab))
    out_dir = v4.FIXTURES / NAME
    with tempfile.TemporaryDirectory(prefix="fixture_v4_fp8_") as tmp:
        for attempt in range(v4.MAX_SEED_TRIES):
            seed = v4.BASE_SEED + 500 + attempt
            torch.manual_seed(seed)
            cfg = v4.build_config(vocab, eos)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
            v4.reinit_(model, cfg, torch.Generator().manual_seed(seed))
            orig = Path(tmp) / f"orig{seed}"
            model.save_pretrained(orig)
            saved = load_file(str(orig / "model.safetensors"))
            release, deq = layout(saved)
            ref_dir = Path(tmp) / f"deq{seed}"
            ref_dir.mkdir()
            shutil.copy(orig / "config.json", ref_dir / "config.json")
            save_file({k: v.contiguous() for k, v in deq.items()}, str(ref_dir / "model.safetensors"))
            loaded = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32, attn_implementation="eager")
            loaded.eval()
            res, reasons = v4.evaluate(loaded, loaded.config, ids, prompt, bad)
            if reasons:
                print(f"seed {seed} rejected: {'; '.join(reasons)}", flush=True)
                continue
            print(f"seed {seed} accepted", flush=True)
            break
        else:
            raise RuntimeError("no acceptable seed")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir()
        config = json.loads((orig / "config.json").read_text())
        config["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": BLOCK,
        }
        config["expert_dtype"] = "fp4"
        (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        shutil.copy(orig / "generation_config.json", out_dir / "generation_config.json")
        save_file({k: v.contiguous() for k, v in release.items()}, str(out_dir / "model.safetensors"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, out_dir / f)
    (out_dir / "logits.bin").write_bytes(res["logits"].contiguous().numpy().astype("<f4").tobytes())
    (out_dir / "decode_logits.bin").write_bytes(res["decode"].contiguous().numpy().astype("<f4").tobytes())
    layout = "release layout: FP4 (e2m1) routed experts, FP8 (e4m3) dense weights, ue8m0 scales"
    reference = v4.make_reference("deepseek_v4", layout, vocab, ids, prompt, res, ref0, seed, tok_vocab)
    (out_dir / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    # transformers itself reads the committed release layout (its conversion mapping, the
    # FP8 quantizer's `.scale` renaming, FP8Experts' FP4 layout, dequantized on load) to the
    # very weights the reference ran on: the same logits, bit for bit.
    from transformers import FineGrainedFP8Config

    qc = FineGrainedFP8Config(dequantize=True, weight_block_size=BLOCK, scale_fmt="ue8m0")
    again, info = AutoModelForCausalLM.from_pretrained(
        out_dir, quantization_config=qc, attn_implementation="eager", output_loading_info=True
    )
    assert not any(info.values()), info
    with torch.no_grad():
        relogits = again.float().eval()(torch.tensor([ids])).logits[0].float()
    assert torch.equal(relogits, res["logits"]), float((relogits - res["logits"]).abs().max())
    print("transformers reads the release layout to the same logits")
    for p in sorted(out_dir.iterdir()):
        print(f"  {p.name}: {p.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
