#!/usr/bin/env python3
"""Quantizes a GGUF with llama.cpp's own `llama_model_quantize`, the function behind
`llama-quantize`, from the libllama that the `node-llama-cpp` npm package ships prebuilt
(tools/bench/node_modules after `npm ci` there). So the mixes are exactly llama.cpp's:
Q4_K_M keeps most matrices Q4_K and gives the output matrix and, in some layers, attn_v and
ffn_down Q6_K (llama.cpp's `use_more_bits` layers), which is what people download.

    python3 tools/bench/quantize_gguf.py IN-f16.gguf OUT.gguf [--ftype q4_k_m] [--threads N]

IN is a GGUF of f16 / f32 matrices (`make_gguf.py --type f16`). Prints one JSON line: the
output path, its size, the count of tensors per type, and the weight bytes one decode token
reads (every non-expert matrix, one embedding row, top-k of the experts) and all weight
bytes, as make_gguf.py prints them, read from the written file.
"""

import argparse
import collections
import ctypes
import glob
import json
import os
import sys

# llama.h's `enum llama_ftype` (those worth benchmarking, and the test fixtures' types).
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_m": 12, "q4_k_s": 14}
FTYPES |= {"q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25, "iq3_m": 27, "iq4_xs": 30}


class QuantizeParams(ctypes.Structure):
    # llama.h `llama_model_quantize_params` of the llama.cpp that node-llama-cpp 3.22.1 bundles
    # (its llama/gitRelease.bundle); llama_model_quantize_default_params fills it.
    _fields_ = [
        ("nthread", ctypes.c_int32),
        ("ftype", ctypes.c_int32),
        ("output_tensor_type", ctypes.c_int32),
        ("token_embedding_type", ctypes.c_int32),
        ("allow_requantize", ctypes.c_bool),
        ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool),
        ("pure", ctypes.c_bool),
        ("keep_split", ctypes.c_bool),
        ("dry_run", ctypes.c_bool),
        ("imatrix", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("tt_overrides", ctypes.c_void_p),
        ("prune_layers", ctypes.c_void_p),
        ("max_buf_size", ctypes.c_size_t),
    ]


def libllama():
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "node_modules/@node-llama-cpp/linux-x64/bins/*/libllama*.so")))
    if not found:
        sys.exit("quantize_gguf.py: no libllama in tools/bench/node_modules; run `npm ci` in tools/bench")
    # libllama finds libggml*.so next to it through its RUNPATH; load them first anyway.
    d = os.path.dirname(found[0])
    for dep in ["libggml-base.so"] + sorted(glob.glob(os.path.join(d, "libggml.*so"))):
        ctypes.CDLL(os.path.join(d, dep), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(found[0])


def summary(path):
    import gguf

    r = gguf.GGUFReader(path)
    field = lambda k: int(r.fields[k].parts[-1][0])
    top_k, experts = field("olmoe.expert_used_count"), field("olmoe.expert_count")
    types = collections.Counter(t.tensor_type.name for t in r.tensors)
    per_token, all_bytes = 0, 0
    for t in r.tensors:
        all_bytes += int(t.n_bytes)
        if t.name.endswith("_exps.weight"):
            per_token += int(t.n_bytes) * top_k // experts
        elif t.name == "token_embd.weight":
            per_token += int(t.n_bytes) // int(t.shape[-1])
        else:
            per_token += int(t.n_bytes)
    by_name = {t.name: t.tensor_type.name for t in r.tensors}
    return {
        "gguf": path,
        "file_bytes": os.path.getsize(path),
        "tensor_types": dict(types),
        "ffn_down_exps_types": [by_name.get(f"blk.{l}.ffn_down_exps.weight") for l in range(field("olmoe.block_count"))],
        "output_type": by_name.get("output.weight"),
        "decode_weight_bytes_per_token": per_token,
        "all_weight_bytes": all_bytes,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--ftype", choices=sorted(FTYPES), default="q4_k_m")
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    lib = libllama()
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    params = lib.llama_model_quantize_default_params()
    params.ftype = FTYPES[a.ftype]
    params.nthread = a.threads
    tmp = a.output + ".partial"
    rc = lib.llama_model_quantize(a.input.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"quantize_gguf.py: llama_model_quantize returned {rc}")
    os.replace(tmp, a.output)
    print(json.dumps(summary(a.output)))


if __name__ == "__main__":
    main()
