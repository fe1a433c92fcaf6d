"""Paths, the seed, the tokenizer's special tokens and chat template, logging."""

from __future__ import annotations

import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_OUT = ROOT / "models" / "demo-hf"

SEED = 1234

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# GPT-2's pre-tokenizer pattern, except that digits are split one by one (\p{N} instead
# of \p{N}+) so that arithmetic is done on single digits.
PRETOKENIZE_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
BPE_VOCAB = 2048 - len(SPECIAL_TOKENS)  # + 3 special tokens = 2048


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)
