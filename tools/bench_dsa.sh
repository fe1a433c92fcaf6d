#!/usr/bin/env bash
# What DeepSeek Sparse Attention saves on a decode step: one MLA layer at DeepSeek-V3.2's
# attention sizes (128 heads, latent 512 + rotary 64, indexer 64 heads x 128, index_topk
# 2048; hidden 1024 to keep the weights small) over caches of 1k, 8k and 32k random
# positions, sparse against the same layer dense, best of three, release build. Prints one
# JSON line per context (milliseconds per step and the ratio). Not part of tools/test.sh.
#
#   tools/bench_dsa.sh [CONTEXTS]        e.g. tools/bench_dsa.sh 1024,8192,32768
set -euo pipefail
cd "$(dirname "$0")/.."
DSA_CONTEXTS="${1:-1024,8192,32768}" cargo test --release -p colibri-engine --lib \
  model::cpu::dsa_bench::decode_attention_by_context -- --ignored --nocapture --exact 2>&1 | grep '^{'
