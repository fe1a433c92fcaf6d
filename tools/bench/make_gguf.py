#!/usr/bin/env python3
"""Writes a Q4_0 GGUF of an OLMoE-shaped model with seeded random weights, for llama.cpp
and wllama in tools/bench_peers.sh: the same shape and the same weight distribution as
`coli synth` (uniform in +-sqrt(3 / fan_in), embeddings in +-1, norms ones), so both sides
run the same amount of arithmetic on the same kind of numbers.

    python3 tools/bench/make_gguf.py OUT.gguf [--layers 16 --experts 16 --top-k 8 --hidden 2048
        --intermediate 1024 --heads 16 --vocab 50304 --seed 0]
    python3 tools/bench/make_gguf.py --tokenizer-json DIR/tokenizer.json [--vocab 50304]

Needs the `gguf` and `numpy` PyPI packages. Every matrix is Q4_0 (gguf.quants, llama.cpp's
reference quantizer: blocks of 32, an f16 scale d = the signed value of largest magnitude
/ -8, then 16 bytes of nibbles, low nibbles elements 0..15, high 16..31); norms and the
router are f32, as llama.cpp's own converter leaves them. The tokenizer is a synthetic
GPT-2-style byte-level BPE vocabulary (256 byte tokens, " x" and " xy" for lowercase
letters, then lowercase-letter strings built by merges, then <|endoftext|> as BOS/EOS) so
llama.cpp loads the file; llama.cpp gets token ids, wllama (text prompts only) a text of
P words " xy", which is exactly P tokens.

Prints one JSON line: path, bytes, and the weight bytes one decode token reads (dense
matrices + the output matrix + one embedding row + top-k of the experts per layer).
"""

import argparse
import itertools
import json
import os
import sys

try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError as e:  # pragma: no cover - the message is the point
    sys.exit(f"make_gguf.py: {e}; install with: pip install gguf numpy")

Q4_0 = gguf.GGMLQuantizationType.Q4_0
Q4_K = gguf.GGMLQuantizationType.Q4_K
F16 = gguf.GGMLQuantizationType.F16


def quantize_q4_k(x):
    """x [rows, cols] (cols a multiple of 256) as Q4_K blocks (llama.cpp's block_q4_K, 144
    bytes per 256 values: f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales and mins, 128
    bytes of nibbles; a value is d * sc * q - dmin * m). gguf.quants has no Q4_K quantizer,
    so this is a plain one (each sub-block of 32 spans its min..max in 15 steps; llama.cpp's
    make_qkx2 searches for a better fit): the same bytes per weight and the same decode work
    as a llama.cpp Q4_K file, which is what a speed comparison needs."""
    rows, cols = x.shape
    sb = x.reshape(rows, cols // 256, 8, 32).astype(np.float32)
    lo = np.minimum(sb.min(axis=3), 0.0)
    hi = sb.max(axis=3)
    scale = (hi - lo) / 15.0
    mins = -lo
    d = np.maximum(scale.max(axis=2), 1e-30) / 63.0
    dmin = np.maximum(mins.max(axis=2), 1e-30) / 63.0
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    d, dmin = d16.astype(np.float32), dmin16.astype(np.float32)
    sc = np.clip(np.rint(scale / d[..., None]), 1, 63).astype(np.uint8)
    m = np.clip(np.rint(mins / dmin[..., None]), 0, 63).astype(np.uint8)
    step = (d[..., None] * sc)[..., None]
    off = (dmin[..., None] * m)[..., None]
    q = np.clip(np.rint((sb + off) / step), 0, 15).astype(np.uint8)
    packed = np.zeros(sb.shape[:2] + (12,), dtype=np.uint8)
    packed[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    packed[..., 4:8] = m[..., 0:4] | ((m[..., 4:8] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:8] & 15) | ((m[..., 4:8] & 15) << 4)
    # Nibbles per 64 values: byte l holds value l (low) and value 32 + l (high).
    q = q.reshape(rows, cols // 256, 4, 2, 32)
    qs = (q[:, :, :, 0, :] | (q[:, :, :, 1, :] << 4)).reshape(rows, cols // 256, 128)
    out = np.concatenate(
        [d16[..., None].view(np.uint8), dmin16[..., None].view(np.uint8), packed, qs], axis=2
    )
    return out.reshape(rows, cols // 256 * 144)


def byte_tokens():
    """GPT-2's bytes_to_unicode: the 256 printable stand-ins for bytes, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocab(n):
    """n tokens: bytes, " x" and " xy" for letters x, y, then letter strings (each one merge
    of a shorter token and a letter), then <|endoftext|>. Returns (tokens, types, merges, eos id)."""
    if n < 1700:
        raise ValueError(f"vocab {n} is too small (at least 1700)")
    tokens = byte_tokens()
    merges = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    space = tokens[ord(" ")]  # "Ġ"
    # " x" and " xy" as single tokens: a text prompt of P words " xy" is exactly P tokens
    # (wllama takes text prompts only).
    for a in letters:
        tokens.append(space + a)
        merges.append(f"{space} {a}")
    for a, b in itertools.product(letters, repeat=2):
        tokens.append(space + a + b)
        merges.append(f"{space + a} {b}")
    length = 2
    while len(tokens) < n - 1:
        for combo in itertools.product(letters, repeat=length):
            if len(tokens) >= n - 1:
                break
            s = "".join(combo)
            tokens.append(s)
            merges.append(f"{s[:-1]} {s[-1]}")
        length += 1
    tokens.append("<|endoftext|>")
    types = [gguf.TokenType.NORMAL] * (n - 1) + [gguf.TokenType.CONTROL]
    return tokens, types, merges, n - 1


def write_tokenizer_json(path, n):
    """The same vocabulary as a Hugging Face tokenizer.json (byte-level BPE), for the
    synthetic colibri checkpoint: colibri's browser engine loads a model's tokenizer."""
    tokens, _, merges, eos = vocab(n)
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": eos, "content": tokens[eos], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [m.split(" ") for m in merges]},
    }
    with open(path, "w") as f:
        json.dump(tok, f, ensure_ascii=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="the GGUF to write (omit with --tokenizer-json to write only that)")
    p.add_argument("--tokenizer-json", help="also write the vocabulary as a Hugging Face tokenizer.json here")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--type",
        choices=["q4_0", "q4_k", "f16"],
        default="q4_0",
        help="the matrices' type (q4_k: Q4_K, rows a multiple of 256; f16: for quantize_gguf.py to make llama.cpp's own mixes)",
    )
    a = p.parse_args()
    h, ff, ne, v = a.hidden, a.intermediate, a.experts, a.vocab
    if a.tokenizer_json:
        write_tokenizer_json(a.tokenizer_json, v)
    if not a.out:
        if not a.tokenizer_json:
            p.error("give the GGUF to write, or --tokenizer-json")
        return
    qk = {"q4_k": 256, "q4_0": 32, "f16": 1}[a.type]
    for name, n in [("hidden", h), ("intermediate", ff)]:
        if n % qk:
            sys.exit(f"make_gguf.py: --{name} {n} is not a multiple of {qk} ({a.type} blocks)")
    if h % a.heads:
        sys.exit(f"make_gguf.py: --hidden {h} is not a multiple of --heads {a.heads}")
    rng = np.random.default_rng(a.seed)

    def uniform(shape, bound):
        x = rng.random(shape, dtype=np.float32)
        x *= np.float32(2 * bound)
        x -= np.float32(bound)
        return x

    # (name, numpy-order shape, "q4" with fan_in bound | "ones" | "f32" with bound)
    specs = [("token_embd.weight", (v, h), "q4", 1.0)]
    for l in range(a.layers):
        b = f"blk.{l}"
        specs.append((f"{b}.attn_norm.weight", (h,), "ones", 0))
        for t in ["attn_q", "attn_k", "attn_v", "attn_output"]:
            specs.append((f"{b}.{t}.weight", (h, h), "q4", (3 / h) ** 0.5))
        specs.append((f"{b}.attn_q_norm.weight", (h,), "ones", 0))
        specs.append((f"{b}.attn_k_norm.weight", (h,), "ones", 0))
        specs.append((f"{b}.ffn_norm.weight", (h,), "ones", 0))
        specs.append((f"{b}.ffn_gate_inp.weight", (ne, h), "f32", (3 / h) ** 0.5))
        specs.append((f"{b}.ffn_gate_exps.weight", (ne, ff, h), "q4", (3 / h) ** 0.5))
        specs.append((f"{b}.ffn_up_exps.weight", (ne, ff, h), "q4", (3 / h) ** 0.5))
        specs.append((f"{b}.ffn_down_exps.weight", (ne, h, ff), "q4", (3 / ff) ** 0.5))
    specs.append(("output_norm.weight", (h,), "ones", 0))
    specs.append(("output.weight", (v, h), "q4", (3 / h) ** 0.5))

    def nbytes(shape, kind):
        n = int(np.prod(shape))
        if kind != "q4":
            return n * 4
        return {"q4_k": n // 256 * 144, "q4_0": n // 32 * 18, "f16": n * 2}[a.type]

    tmp = a.out + ".partial"
    w = gguf.GGUFWriter(tmp, "olmoe")
    w.add_name(f"colibri bench synthetic OLMoE {a.layers}L {ne}E {a.type.upper()}")
    w.add_context_length(a.context)
    w.add_embedding_length(h)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(ff)
    w.add_expert_feed_forward_length(ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(h // a.heads)
    w.add_expert_count(ne)
    w.add_expert_used_count(a.top_k)
    ftypes = {"q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_S, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "f16": gguf.LlamaFileType.MOSTLY_F16}
    w.add_file_type(ftypes[a.type])
    tokens, types, merges, eos = vocab(v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    for name, shape, kind, _ in specs:
        raw = {"q4_k": Q4_K, "q4_0": Q4_0, "f16": F16}[a.type] if kind == "q4" else None
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(shape, kind), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind, bound in specs:
        if kind == "ones":
            data = np.ones(shape, dtype=np.float32)
        elif kind == "f32":
            data = uniform(shape, bound)
        else:
            # One matrix (one expert) at a time keeps memory to ~100 MB.
            rows = shape if len(shape) == 2 else shape[1:]
            quant = {
                "q4_k": quantize_q4_k,
                "q4_0": lambda x: quants.quantize(x, Q4_0),
                "f16": lambda x: x.astype(np.float16),
            }[a.type]
            parts = [quant(uniform(rows, bound)) for _ in range(shape[0] if len(shape) == 3 else 1)]
            data = np.concatenate([q.reshape(-1) for q in parts])
        w.write_tensor_data(data)
    w.close()
    os.replace(tmp, a.out)

    size = lambda n: next(nbytes(s, k) for (m, s, k, _) in specs if m == n)
    dense = sum(
        nbytes(s, k) for (m, s, k, _) in specs if not m.endswith("_exps.weight") and m != "token_embd.weight"
    )
    experts = sum(nbytes(s, k) for (m, s, k, _) in specs if m.endswith("_exps.weight"))
    per_token = dense + size("token_embd.weight") // v + experts * a.top_k // ne
    print(
        json.dumps(
            {
                "gguf": a.out,
                "file_bytes": os.path.getsize(a.out),
                "dense_bytes_without_embedding": dense,
                "expert_bytes": experts,
                "decode_weight_bytes_per_token": per_token,
                "all_weight_bytes": dense + experts + size("token_embd.weight"),
            }
        )
    )


if __name__ == "__main__":
    main()
