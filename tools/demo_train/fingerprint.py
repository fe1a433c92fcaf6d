"""A hash of everything the data generator yields for a seed: the prose, the held-out sets,
documents of every stage and the evaluation prompts. A refactoring of the generator must
leave it unchanged (`python3 tools/train_demo.py fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import random

from .common import CHAT_TEMPLATE, SEED
from .evaluate import SAMPLE_PROMPTS, eval_prompts
from .prose import devil_paragraphs, kjv_paragraphs, story
from .questions import STAGE3
from .tasks import TASK_MIX, Tasks, render
from .train import make_documents


def fingerprint(seed: int = SEED, docs: int = 3000) -> str:
    h = hashlib.sha256()

    def put(x):
        h.update(json.dumps(x, sort_keys=True, default=list).encode())

    prose = {"kjv": kjv_paragraphs(), "devil": devil_paragraphs()}
    put(prose)
    saved = STAGE3["cannot"]
    try:
        for focus, real_words in [(False, 0.35), (True, 0.7)]:
            STAGE3["cannot"] = 0.5 if focus else 0.0
            tasks = Tasks(seed, real_words=real_words)
            put(sorted(tasks.add_held))
            put(sorted(tasks.pseudo_held))
            put(sorted(map(list, tasks.items_held)))
            for stage in (1, 2):
                put(make_documents(docs, seed, tasks, prose, stage=stage, focus=focus))
            put(tasks.held_out(50, seed, extra=True))
            for turn in (1, 4, 8):
                for task, items in tasks.held_out(10, seed, extra=True).items():
                    put(eval_prompts(tasks, task, items, turn, seed))
    finally:
        STAGE3["cannot"] = saved
    put(render([{"role": "user", "content": "hi"}], True))
    put([story(random.Random(5)) for _ in range(3)])
    put(SAMPLE_PROMPTS)
    put(CHAT_TEMPLATE)
    put(TASK_MIX)
    return h.hexdigest()


def cmd_fingerprint(args):
    print(fingerprint(args.seed, args.docs))
