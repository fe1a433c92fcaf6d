#!/usr/bin/env python3
"""Writes the GGUF test fixtures under tests/fixtures/gguf/ (run once; CI needs no Python).

1. GGUF files made by llama.cpp's own converter (convert_hf_to_gguf.py, from a llama.cpp
   checkout given with --llama-cpp) from the committed tiny Hugging Face fixtures, so the
   tensor names, shapes, permutations and metadata are exactly what llama.cpp writes:
     olmoe-f16.gguf           --outtype f16 (olmoe arch, NEOX rope, no permutation)
     mixtral-f16.gguf         --outtype f16 (llama arch: q/k rows permuted for rope)
     qwen3moe-q4_0-q8_0.gguf  --outtype f32, then re-quantized with gguf.quants (llama.cpp's
                              converter writes no Q4_0): experts and output Q4_0, attention
                              and embeddings Q8_0, rows of 36 (not a multiple of 32) F16
   The fixtures' sizes are deliberately not multiples of 32, so some tensors stay F16.
     qwen2moe-f16.gguf        --outtype f16 (shared expert and its sigmoid gate, q/k/v biases; the
                              fixture's dense layer 1 under llama.cpp's dense FFN names: PATCHES)
     glm4moe-f16.gguf         --outtype f16 (partial rotary, biases, q/k norms, dense layer 0,
                              exp_probs_b correction bias, shared expert)
     deepseek2-f16.gguf       --outtype f16 from deepseek_v3 (MLA with q LoRA, kv_b_proj split
                              into attn_k_b (transposed per head) and attn_v_b as llama.cpp
                              writes it now)
     deepseek2-kv_b-f16.gguf  --outtype f16 from deepseek_v3_noqlora (plain q_proj, kv_b_proj
                              whole as attn_kv_b, as llama.cpp wrote it before the split)
 deepseek2-kv_b-split-0000N-of-00003.gguf  the same, split into three files by gguf-py's writer
                              (--split-max-tensors 12), as llama-gguf-split splits
     gpt-oss-mxfp4.gguf       --outtype bf16 from gpt_oss_mxfp4 (MXFP4 experts repacked into ggml's
                              block layout by GptOssModel.repack_mxfp4, gate and up split,
                              expert / router / o_proj biases, attention sinks, YaRN, sliding
                              window)
     qwen3next-bf16.gguf      --outtype bf16 from qwen3_next (Gated DeltaNet ssm_* tensors, in_proj_qkvz
                              regrouped into attn_qkv + attn_gate, ssm_a = -exp(A_log) and norms
                              + 1 computed in f32 by the converter (it widens bf16 first); the dense layer: PATCHES;
                              --no-mtp)
     qwen35moe-bf16.gguf      from qwen3_5_moe (the multimodal checkpoint's language model) and
     glm-dsa-bf16.gguf        from glm_moe_dsa: written by fixtures_gguf_layout.py in llama.cpp's
                              layout (its Qwen3_5MoeTextModel / GlmMoeDsaModel converter classes,
                              which the checkout used above predates; see that module), without
                              llama.cpp: `--layout-only` writes just these two
   None of the newer families' fixture sizes is a multiple of 32, so they have no quantized
   variant (llama.cpp would leave every tensor F16); qwen3moe's covers Q8_0/Q4_0.
     olmoe-q4_k.gguf          tools/bench/make_gguf.py --type q4_k, a tiny OLMoE shape whose rows
                              are whole Q4_K blocks of 256 (every matrix Q4_K, norms and router
                              F32), without llama.cpp: `--q4k-only` writes just this one and
     olmoe-q4_k_m.gguf        llama.cpp's own Q4_K_M mix (Q4_K, Q6_K for the output and layer 1's
                              attn_v and ffn_down) of two layers of that shape, made from f16 by
                              llama_model_quantize (tools/bench/quantize_gguf.py: the libllama of
                              tools/bench/node_modules, `npm ci` there), and
     olmoe-q5_k_m.gguf        its Q5_K_M mix the same way (Q5_K, Q6_K where Q4_K_M has it)
     olmoe-mix.gguf           (`--mix-only`, with dequant.json and engine/src/format/iq_grids.bin)
                              llama.cpp's other quantized types in one file (mix_fixture)
   The fixtures' tokenizer is a plain GPT-2 byte-level BPE that llama.cpp's pre-tokenizer
   table does not know by hash, so the script declares it "gpt-2" (what it is).
2. <name>.ref.json beside each GGUF: for every tensor, the sha256 of its values
   dequantized by gguf.quants (float32, little-endian, GGUF's row-major order).
3. spm-tokenizer.gguf / .ref.json: a SentencePiece BPE vocabulary (tokenizer.ggml.model
   "llama", as llama.cpp writes Mixtral's and Llama 2's) trained here on the repository's
   docs, its metadata written as llama.cpp's converter does (pieces, scores, token types),
   and the ids the sentencepiece library itself gives for a few texts.
4. dequant.json: random blocks of every tensor type colibri reads, with the values
   gguf.quants.dequantize gives (float32 bit patterns), for the Rust unit tests.

Usage: pip install gguf torch transformers sentencepiece
       python3 tools/make_gguf_fixtures.py --llama-cpp /path/to/llama.cpp
A llama.cpp checkout, or the copy llama-cpp-python's source package vendors
(`pip download llama-cpp-python --no-deps --no-binary llama-cpp-python`, then
vendor/llama.cpp of the unpacked archive; the qwen2moe, glm4moe and deepseek2 fixtures
were made with 0.3.36's).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"


WRAPPER = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
import conversion.base as base  # llama.cpp's converter package (uses llama.cpp's gguf-py)
import gguf
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
exec(sys.argv[2])
script = sys.argv[1] + "/convert_hf_to_gguf.py"
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""

# Patches applied to llama.cpp's converter for one fixture (the third argument of WRAPPER).
PATCHES = {
    # The qwen2_moe fixture has a dense layer (mlp_only_layers [1]); llama.cpp's qwen2moe
    # architecture has none (the released Qwen1.5/Qwen2 MoE checkpoints use none), so its
    # tensor map gets the names llama.cpp gives dense FFNs everywhere else.
    "qwen2moe": "gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN2MOE] += "
    "[gguf.MODEL_TENSOR.FFN_GATE, gguf.MODEL_TENSOR.FFN_UP, gguf.MODEL_TENSOR.FFN_DOWN]",
    # GLM's vocabulary writer needs GLM's special tokens ([gMASK], <sop>); the fixture has
    # the shared GPT-2 tokenizer, written as any other BPE vocabulary.
    "glm4moe": "import conversion.glm as glm\n"
    "glm.Glm4MoeModel.set_vocab = lambda self: self._set_vocab_gpt2()",
    # llama.cpp before the MLA split (mid 2025) wrote kv_b_proj whole as attn_kv_b; this
    # skips the split, giving the older layout that published deepseek2 GGUFs still have.
    # Like qwen2_moe's, the qwen3_next fixture has a dense layer (mlp_only_layers [2]).
    "qwen3next": "gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3NEXT] += "
    "[gguf.MODEL_TENSOR.FFN_GATE, gguf.MODEL_TENSOR.FFN_UP, gguf.MODEL_TENSOR.FFN_DOWN]",
    "deepseek2-kv_b": "import conversion.deepseek as ds\n"
    "_split = ds.DeepseekV2Model.modify_tensors\n"
    "def _whole(self, data, name, bid):\n"
    "    if name.endswith('kv_b_proj.weight'):\n"
    "        return base.TextModel.modify_tensors(self, data, name, bid)\n"
    "    return _split(self, data, name, bid)\n"
    "ds.DeepseekV2Model.modify_tensors = _whole",
}


def run_llama_cpp_convert(
    llama_cpp: Path, src: Path, out: Path, outtype: str, patch: str = "", extra: tuple = ()
) -> None:
    cmd = [sys.executable, "-c", WRAPPER, str(llama_cpp), PATCHES.get(patch, ""), str(src), "--outfile", str(out)]
    cmd += ["--outtype", outtype, *extra]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def with_config(src: Path, dst: Path, **changes) -> Path:
    """A copy of checkpoint `src` (weights linked) whose config.json has `changes`."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def writer_like(r, dst: Path, skip=()):
    """A GGUF writer to `dst` holding the metadata of reader `r` (but the keys in `skip`)."""
    import gguf

    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in skip:
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, f.contents(), vt)
    return w


def requantize(src: Path, dst: Path, pick) -> None:
    """Copies a GGUF, re-quantizing every F32 weight of 2+ dimensions to `pick(name)` with
    gguf.quants, like llama-quantize with a per-tensor type: a row length the block size
    does not divide falls back to F16 (as llama.cpp does); norms and routers stay F32."""
    import gguf

    r = gguf.GGUFReader(src)
    w = writer_like(r, dst)
    for t in r.tensors:
        data = np.array(t.data)
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        qtype = t.tensor_type
        if qtype == gguf.GGMLQuantizationType.F32 and len(shape) >= 2 and "ffn_gate_inp" not in t.name:
            qtype = pick(t.name)
            if shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] != 0:
                qtype = gguf.GGMLQuantizationType.F16
        if qtype != t.tensor_type:
            data = gguf.quants.quantize(data.reshape(shape).astype(np.float32), qtype)
            w.add_tensor(t.name, data, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, data.reshape(shape), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(path: Path) -> None:
    import gguf

    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        v = gguf.quants.dequantize(np.array(t.data), t.tensor_type).astype("<f4")
        out[t.name] = {
            "type": t.tensor_type.name,
            "shape": [int(x) for x in t.shape],
            "sha256": hashlib.sha256(v.tobytes()).hexdigest(),
        }
    path.with_suffix(".ref.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


def dequant_vectors() -> None:
    """Random blocks (finite f16 scales, every quant bit pattern) and their dequantized values."""
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(16)
    cases = {}
    # The types added later come last, so that the earlier cases' random bytes stay as they were.
    types = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]
    types += [Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS]
    for qt in types:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        n_blocks = 3
        raw = rng.integers(0, 256, size=n_blocks * size, dtype=np.uint8)
        if qt == Q.F32:
            raw = rng.standard_normal(n_blocks * block).astype("<f4").view(np.uint8)
        elif qt == Q.F16:
            raw = (rng.standard_normal(n_blocks * block) * 3).astype("<f2").view(np.uint8)
        elif qt == Q.BF16:
            f = rng.standard_normal(n_blocks * block).astype("<f4").view("<u4")
            raw = (f >> 16).astype("<u2").view(np.uint8)
        else:
            raw = raw.reshape(n_blocks, size)
            # f16 scale fields: finite values of either sign, one of them zero / subnormal.
            def f16(vals):
                return np.array(vals, dtype="<f2").view(np.uint8)
            scale_at = {Q.Q4_0: [0], Q.Q8_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [size - 2]}
            scale_at |= {Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q2_K: [size - 4, size - 2]}
            scale_at |= {Q.Q3_K: [size - 2], Q.IQ4_NL: [0], Q.IQ4_XS: [0]}
            for b in range(n_blocks):
                for off in scale_at.get(qt, []):
                    val = [0.0123, -0.75, 3.0e-6][b] * (1 + off)
                    raw[b, off : off + 2] = f16([val])
            if qt == Q.Q8_0:
                raw[0, 2] = 0x80  # -128
            if qt == Q.MXFP4:
                raw[:, 0] = [0, 1, 121][:n_blocks]  # e8m0 exponents: the two subnormal cases and 2^-7
            raw = raw.reshape(-1)
        vals = gguf.quants.dequantize(raw, qt).astype("<f4").reshape(-1)
        cases[qt.name] = {
            "type_id": int(qt),
            "bytes": raw.tobytes().hex(),
            "f32_bits": [int(x) for x in vals.view("<u4")],
        }
    grid_vectors(cases, rng)
    (OUT / "dequant.json").write_text(json.dumps(cases) + "\n")


SPM_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,\ta tab\nand a newline\n\n    then four spaces",
    "Café déjà vu: naïve façade, 12345 and 3.14159; ünïcödé 🦙 (byte fallback)",
    "coli convert model.gguf -o DIR --quant int4",
]


def spm_tokenizer() -> None:
    import gguf
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as d:
        corpus = Path(d) / "corpus.txt"
        corpus.write_text((ROOT / "README.md").read_text() + (ROOT / "docs" / "format.md").read_text())
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=f"{d}/tiny", vocab_size=400, model_type="bpe", byte_fallback=True,
            character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, split_digits=True,
            allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
            normalization_rule_name="identity", minloglevel=2,
        )
        sp = spm.SentencePieceProcessor(model_file=f"{d}/tiny.model")
    # Token types as llama.cpp's _create_vocab_sentencepiece assigns them.
    types = []
    for i in range(sp.get_piece_size()):
        t = gguf.TokenType.NORMAL
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        types.append(t)
    w = gguf.GGUFWriter(OUT / "spm-tokenizer.gguf", "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([sp.id_to_piece(i).encode() for i in range(sp.get_piece_size())])
    w.add_token_scores([sp.get_score(i) for i in range(sp.get_piece_size())])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = [{"text": t, "ids": sp.encode(t)} for t in SPM_TEXTS]
    (OUT / "spm-tokenizer.ref.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")


def layout_fixtures(fx: Path) -> None:
    """qwen35moe and glm-dsa, written in llama.cpp's layout (fixtures_gguf_layout.py)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import fixtures_gguf_layout as lay

    tok = OUT / "qwen3next-bf16.gguf"  # llama.cpp's writing of the shared tokenizer
    lay.write_qwen35moe(fx / "qwen3_5_moe", OUT / "qwen35moe-bf16.gguf", tok)
    lay.write_glm_dsa(fx / "glm_moe_dsa", OUT / "glm-dsa-bf16.gguf", tok)
    for name in ["qwen35moe-bf16", "glm-dsa-bf16"]:
        reference(OUT / f"{name}.gguf")
        p = OUT / f"{name}.gguf"
        print(f"{p.stat().st_size:>9}  {p.relative_to(ROOT)}")


def q4k_fixture() -> None:
    """olmoe-q4_k.gguf and its .ref.json: every matrix Q4_K (rows of 256 values); and
    olmoe-q4_k_m.gguf: llama.cpp's own Q4_K_M mix (llama_model_quantize through
    tools/bench/quantize_gguf.py, which needs `npm ci` in tools/bench) of an f16 GGUF of a
    two-layer version of the shape: Q4_K, and Q6_K for the output and layer 1's attn_v and
    ffn_down (llama.cpp's `use_more_bits` layers); and olmoe-q5_k_m.gguf, its Q5_K_M mix
    (Q5_K, and Q6_K where Q4_K_M has it)."""
    make = [sys.executable, str(ROOT / "tools" / "bench" / "make_gguf.py")]
    shape = ["--experts", "4", "--top-k", "2", "--hidden", "256", "--intermediate", "256"]
    shape += ["--heads", "2", "--vocab", "1700", "--context", "256", "--seed", "7"]
    out = OUT / "olmoe-q4_k.gguf"
    subprocess.run([*make, str(out), "--layers", "1", *shape, "--type", "q4_k"], check=True)
    reference(out)
    out = OUT / "olmoe-q4_k_m.gguf"
    with tempfile.TemporaryDirectory() as d:
        f16 = Path(d) / "olmoe-f16.gguf"
        subprocess.run([*make, str(f16), "--layers", "2", *shape, "--type", "f16"], check=True)
        quantize = [sys.executable, str(ROOT / "tools" / "bench" / "quantize_gguf.py"), str(f16), str(out)]
        subprocess.run([*quantize, "--ftype", "q4_k_m", "--threads", "1"], check=True, stderr=subprocess.DEVNULL)
        q5 = OUT / "olmoe-q5_k_m.gguf"
        quantize[-1] = str(q5)
        subprocess.run([*quantize, "--ftype", "q5_k_m", "--threads", "1"], check=True, stderr=subprocess.DEVNULL)
    reference(out)
    reference(q5)


GRID_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"]


def iq_grids() -> None:
    """engine/src/format/iq_grids.bin: the codebooks of ggml's grid-coded types (iq2xxs_grid,
    iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid: format constants, not
    computable), one signed byte per element, in GRID_TYPES' order, as gguf.quants unpacks
    them. IQ1_M shares IQ1_S's."""
    import gguf

    out = bytearray()
    for name in GRID_TYPES:
        cls = gguf.quants._type_traits[gguf.GGMLQuantizationType[name]]
        cls.init_grid()
        g = cls.grid.reshape(cls.grid_shape)
        assert (g == np.round(g)).all() and g.min() >= -128 and g.max() < 128
        out += g.astype(np.int8).tobytes()
    (ROOT / "engine" / "src" / "format" / "iq_grids.bin").write_bytes(bytes(out))


def grid_vectors(cases: dict, rng) -> None:
    """For each grid-coded type, blocks that use every grid entry and every sign pattern
    (with random scales), and the sha256 of the float32 values gguf.quants gives them."""
    import gguf

    Q = gguf.GGMLQuantizationType
    for name in [*GRID_TYPES, "IQ1_M"]:
        qt = Q[name]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        n_blocks = 80
        raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        # Grid indices counting up over the blocks, so every entry is met; the other bits random.
        if name in ("IQ2_XXS", "IQ3_XXS"):
            n = 32 if name == "IQ2_XXS" else 64
            if name == "IQ2_XXS":
                at = [2 + 8 * k + l for k in range(8) for l in range(4)]
            else:
                at = list(range(2, 66))
            for b in range(n_blocks):
                raw[b, at] = [(n * b + g) % 256 for g in range(n)]
        elif name == "IQ2_XS":
            v = (np.arange(n_blocks * 32) % 512).astype("<u2") | (rng.integers(0, 128, n_blocks * 32) << 9).astype("<u2")
            raw[:, 2:66] = v.reshape(n_blocks, 32).view(np.uint8)
        else:
            # (first qs byte, groups, grid entries; first qh byte, bytes per qh word, groups
            # per word, bits per group): group g's high index bits are at bit (g mod per) *
            # step of little-endian qh word g / per (IQ1_M: nibbles, bit 3 the delta's sign).
            lay = {"IQ2_S": (2, 32, 1024, 66, 1, 4, 2), "IQ3_S": (2, 64, 512, 66, 1, 8, 1)}
            lay |= {"IQ1_S": (2, 32, 2048, 34, 2, 4, 3), "IQ1_M": (0, 32, 2048, 32, 1, 2, 4)}
            qs, groups, entries, qh, nbytes, per, step = lay[name]
            high = (entries >> 8) - 1
            for b in range(n_blocks):
                for g in range(groups):
                    i = (groups * b + g) % entries
                    raw[b, qs + g] = i & 0xFF
                    word, shift = qh + nbytes * (g // per), (g % per) * step
                    w = int.from_bytes(bytes(raw[b, word : word + nbytes]), "little")
                    w = (w & ~(high << shift)) | ((i >> 8) << shift)
                    raw[b, word : word + nbytes] = list(w.to_bytes(nbytes, "little"))
        if name == "IQ1_M":
            # The f16 d is spread over the top nibbles of the last four u16: a finite one.
            sc = raw[:, 48:56].copy().view("<u2")
            d = np.array([0.0123] * n_blocks, dtype="<f2").view("<u2")
            for k in range(4):
                sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
            raw[:, 48:56] = sc.view(np.uint8)
        else:
            raw[:, 0:2] = np.array([0.0123, -0.75, 3.0e-6, 1.5] * (n_blocks // 4), dtype="<f2").view(np.uint8).reshape(n_blocks, 2)
        raw = raw.reshape(-1)
        vals = gguf.quants.dequantize(raw, qt).astype("<f4").reshape(-1)
        assert np.isfinite(vals).all()
        cases[name] = {
            "type_id": int(qt),
            "bytes": raw.tobytes().hex(),
            "f32_sha256": hashlib.sha256(vals.tobytes()).hexdigest(),
            "first_f32_bits": [int(x) for x in vals[:64].view("<u4")],
        }


def mix_fixture() -> None:
    """olmoe-mix.gguf: the two-layer shape of olmoe-q4_k_m.gguf with its matrices taken in
    turn from llama.cpp's Q2_K, Q3_K_M, IQ4_XS, IQ4_NL, Q4_1, Q5_0, Q5_1 and IQ3_M
    quantizations of one f16 file (llama_model_quantize through tools/bench/quantize_gguf.py),
    so that every type llama.cpp writes of those is in one file, bytes as llama.cpp wrote
    them. (IQ3_XXS, IQ2_* and IQ1_* need an importance matrix, which quantize_gguf.py cannot
    pass: dequant.json's blocks cover them.)"""
    import gguf

    make = [sys.executable, str(ROOT / "tools" / "bench" / "make_gguf.py")]
    shape = ["--experts", "4", "--top-k", "2", "--hidden", "256", "--intermediate", "256"]
    shape += ["--heads", "2", "--vocab", "1700", "--context", "256", "--seed", "7"]
    wanted = ["Q2_K", "Q3_K", "IQ4_XS", "IQ4_NL", "Q4_1", "Q5_0", "Q5_1", "IQ3_S"]
    ftypes = ["q2_k", "q3_k_m", "iq4_xs", "iq4_nl", "q4_1", "q5_0", "q5_1", "iq3_m"]
    out = OUT / "olmoe-mix.gguf"
    with tempfile.TemporaryDirectory() as d:
        f16 = Path(d) / "olmoe-f16.gguf"
        subprocess.run([*make, str(f16), "--layers", "2", *shape, "--type", "f16"], check=True)
        quantize = [sys.executable, str(ROOT / "tools" / "bench" / "quantize_gguf.py"), str(f16)]
        readers = []
        for ft in ftypes:
            q = Path(d) / f"{ft}.gguf"
            subprocess.run([*quantize, str(q), "--ftype", ft, "--threads", "1"], check=True, stderr=subprocess.DEVNULL)
            readers.append(gguf.GGUFReader(q))
        base = readers[0]
        w = writer_like(base, out, skip=("general.file_type",))
        turn, used = 0, set()
        for i, t in enumerate(base.tensors):
            pick = t
            if len(t.shape) >= 2 and t.tensor_type != gguf.GGMLQuantizationType.F32:
                # The next wanted type that some quantization gave this tensor.
                for k in range(len(wanted)):
                    name = wanted[(turn + k) % len(wanted)]
                    hit = [r.tensors[i] for r in readers if r.tensors[i].tensor_type.name == name]
                    if hit:
                        pick, turn = hit[0], (turn + k + 1) % len(wanted)
                        break
            assert pick.name == t.name
            used.add(pick.tensor_type.name)
            w.add_tensor(pick.name, np.array(pick.data), raw_shape=pick.data.shape, raw_dtype=pick.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    missing = set(wanted) - used
    assert not missing, f"no tensor of {missing}"
    reference(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, help="a llama.cpp checkout")
    ap.add_argument("--layout-only", action="store_true", help="only the fixtures written in llama.cpp's layout")
    ap.add_argument(
        "--q4k-only", action="store_true", help="only olmoe-q4_k.gguf and olmoe-q4_k_m.gguf (tools/bench/make_gguf.py)"
    )
    ap.add_argument(
        "--mix-only", action="store_true", help="only dequant.json and olmoe-mix.gguf (tools/bench/quantize_gguf.py)"
    )
    a = ap.parse_args()
    import gguf

    OUT.mkdir(parents=True, exist_ok=True)
    fx = ROOT / "tests" / "fixtures"
    if a.layout_only:
        layout_fixtures(fx)
        return
    if a.q4k_only:
        q4k_fixture()
        return
    if a.mix_only:
        iq_grids()
        dequant_vectors()
        mix_fixture()
        return
    if a.llama_cpp is None:
        ap.error("--llama-cpp is required (or --layout-only)")
    run_llama_cpp_convert(a.llama_cpp, fx / "olmoe", OUT / "olmoe-f16.gguf", "f16")
    run_llama_cpp_convert(a.llama_cpp, fx / "mixtral", OUT / "mixtral-f16.gguf", "f16")
    Q = gguf.GGMLQuantizationType
    with tempfile.TemporaryDirectory() as d:
        f32 = Path(d) / "qwen3moe-f32.gguf"
        run_llama_cpp_convert(a.llama_cpp, fx / "qwen3_moe", f32, "f32")
        # Experts and the output in Q4_0, attention and embeddings in Q8_0.
        requantize(f32, OUT / "qwen3moe-q4_0-q8_0.gguf", lambda n: Q.Q4_0 if "exps" in n or n == "output.weight" else Q.Q8_0)
    run_llama_cpp_convert(a.llama_cpp, fx / "qwen2_moe", OUT / "qwen2moe-f16.gguf", "f16", "qwen2moe")
    run_llama_cpp_convert(a.llama_cpp, fx / "glm4_moe", OUT / "glm4moe-f16.gguf", "f16", "glm4moe")
    with tempfile.TemporaryDirectory() as d:
        # The released DeepSeek-V3 / Kimi-K2 config.json say how they route; transformers
        # does not keep these keys, and without scoring_func llama.cpp would write no
        # expert_gating_func (and then route deepseek2 with a softmax, as DeepSeek-V2).
        routing = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
        v3 = with_config(fx / "deepseek_v3", Path(d) / "deepseek_v3", **routing)
        run_llama_cpp_convert(a.llama_cpp, v3, OUT / "deepseek2-f16.gguf", "f16")
        lite = with_config(fx / "deepseek_v3_noqlora", Path(d) / "deepseek_v3_noqlora", **routing)
        run_llama_cpp_convert(a.llama_cpp, lite, OUT / "deepseek2-kv_b-f16.gguf", "f16", "deepseek2-kv_b")
        # The same GGUF split into three files as llama.cpp splits (gguf-py's writer with
        # --split-max-tensors: split.no / split.count / split.tensors.count, metadata in
        # the first part), named deepseek2-kv_b-split-0000N-of-00003.gguf.
        run_llama_cpp_convert(
            a.llama_cpp, lite, OUT / "deepseek2-kv_b-split.gguf", "f16", "deepseek2-kv_b", ("--split-max-tensors", "12")
        )
    run_llama_cpp_convert(a.llama_cpp, fx / "gpt_oss_mxfp4", OUT / "gpt-oss-mxfp4.gguf", "bf16")
    # The fixture has no MTP layer (Qwen3-Next's config does not say how many it has).
    run_llama_cpp_convert(a.llama_cpp, fx / "qwen3_next", OUT / "qwen3next-bf16.gguf", "bf16", "qwen3next", ("--no-mtp",))
    for name in [
        "olmoe-f16",
        "mixtral-f16",
        "qwen3moe-q4_0-q8_0",
        "qwen2moe-f16",
        "glm4moe-f16",
        "deepseek2-f16",
        "deepseek2-kv_b-f16",
        "gpt-oss-mxfp4",
        "qwen3next-bf16",
    ]:
        reference(OUT / f"{name}.gguf")
    layout_fixtures(fx)
    spm_tokenizer()
    dequant_vectors()
    for p in sorted(OUT.iterdir()):
        print(f"{p.stat().st_size:>9}  {p.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
