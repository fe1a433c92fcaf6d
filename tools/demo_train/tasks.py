"""Tasks (held-out splits, training draws), conversations, rendering with the chat
template, and the task mixes of each training stage."""

from __future__ import annotations

import random

from .prose import *  # noqa: F401,F403
from .questions import *  # noqa: F401,F403
from .tables import *  # noqa: F401,F403


def _t(templates: list[str], q) -> str:
    """A question template: an index into `templates`, or the template itself."""
    return templates[q] if isinstance(q, int) else q


class Tasks:
    """Builds the held-out sets first, then draws training examples that avoid them."""

    def __init__(self, seed: int, real_words: float = 0.35):
        # Share of the letter tasks (count, spell, backwards) asked about a real word rather
        # than a made-up one (stage 3 raises it: a real word without quotes is one token
        # whose letters the model has to learn word by word).
        self.real_words = real_words
        rng = random.Random(seed * 7919 + 1)
        pairs2 = [(a, b) for a in range(10, 100) for b in range(10, 100)]
        rng.shuffle(pairs2)
        self.add_held = set(pairs2[:810])          # 10% of two-digit pairs
        subs = [(a, b) for a in range(10, 100) for b in range(10, a + 1)]
        rng.shuffle(subs)
        self.sub_held = set(subs[:410])            # ~10% of two-digit a >= b pairs
        words = list(WORDS)
        rng.shuffle(words)
        self.words_held = set(words[: len(words) // 8])
        self.words_train = sorted(set(words) - self.words_held)
        self.pseudo_held = set()
        while len(self.pseudo_held) < 400:
            w = rand_pseudo_word(rng)
            if w not in WORDS:
                self.pseudo_held.add(w)
        self.items_held = set()
        while len(self.items_held) < 300:
            self.items_held.add(self._rand_list(rng))
        self.fact_held = {}
        for kind, (table, qs, _) in FACT_Q.items():
            for k in table:
                self.fact_held[(kind, k)] = rng.randrange(len(qs))

    @staticmethod
    def _rand_list(rng: random.Random) -> tuple:
        pool = rng.choice([FRUITS, ANIMALS, COLOUR_WORDS, OBJECTS])
        return tuple(rng.choice(pool) for _ in range(rng.randint(1, 8)))

    # ---- question/answer builders (key = the part of the answer that is checked) ----
    @staticmethod
    def add(a, b, q):
        return _t(ADD_Q, q).format(a=a, b=b), add_answer(a, b), str(a + b)

    @staticmethod
    def sub(a, b, q):
        return _t(SUB_Q, q).format(a=a, b=b), sub_answer(a, b), str(a - b)

    @staticmethod
    def letters(w, q):
        count = ", ".join(f"{i + 1} {c}" for i, c in enumerate(w))
        return _t(LETTERS_Q, q).format(w=w), f"Let me count: {count}. \"{w}\" has {len(w)} letters.", str(len(w))

    @staticmethod
    def spell_fwd(w, q):
        return _t(SPELL_Q, q).format(w=w), f"\"{w}\" is spelled {spell(w)}.", spell(w)

    @staticmethod
    def reverse(w, q):
        return (_t(REVERSE_Q, q).format(w=w), f"\"{w}\" is spelled {spell(w)}. Backwards it is {spell(w[::-1])}.",
                spell(w[::-1]))

    @staticmethod
    def items(lst, q):
        count = ", ".join(f"{i + 1} {x}" for i, x in enumerate(lst))
        n = len(lst)
        return (_t(ITEMS_Q, q).format(l=", ".join(lst)),
                f"Let me count: {count}. There {'is' if n == 1 else 'are'} {n}.", str(n))

    @staticmethod
    def fact(kind, k, q):
        table, qs, ans = FACT_Q[kind]
        return _t(qs, q).format(k=k), ans(k, table[k]), table[k]

    # ---- training draws ----
    def draw(self, rng: random.Random, kind: str, para: float = 0.0):
        """One training question of `kind`. With probability `para` (stage 2 only; stage 1
        passes 0 and draws exactly as it always did) the phrasing comes from the *_Q2 lists."""
        def phr(base, extra):
            if para and rng.random() < para:
                return rng.choice(extra)
            return rng.randrange(len(base))

        if kind == "add":
            while True:
                a, b = (rng.randint(10, 99), rng.randint(10, 99)) if rng.random() < 0.9 else (rng.randint(0, 99), rng.randint(0, 9))
                if rng.random() < 0.5 and a < 10:
                    a, b = b, a
                if (a, b) not in self.add_held:
                    return self.add(a, b, phr(ADD_Q, ADD_Q2))
        if kind == "sub":
            while True:
                a = rng.randint(10, 99) if rng.random() < 0.9 else rng.randint(0, 99)
                b = rng.randint(10, a) if a >= 10 and rng.random() < 0.9 else rng.randint(0, min(a, 9))
                if (a, b) not in self.sub_held:
                    return self.sub(a, b, phr(SUB_Q, SUB_Q2))
        if kind in ("letters", "spell", "reverse"):
            while True:
                w = rng.choice(self.words_train) if rng.random() < self.real_words else rand_pseudo_word(rng)
                if w not in self.pseudo_held and w not in self.words_held and len(w) <= (8 if kind == "reverse" else 10):
                    break
            if kind == "letters":
                return self.letters(w, phr(LETTERS_Q, LETTERS_Q2))
            if kind == "spell":
                return self.spell_fwd(w, phr(SPELL_Q, SPELL_Q2))
            return self.reverse(w, phr(REVERSE_Q, REVERSE_Q2))
        if kind == "items":
            while True:
                lst = self._rand_list(rng)
                if lst not in self.items_held:
                    return self.items(lst, phr(ITEMS_Q, ITEMS_Q2))
        if kind == "fact":
            fk = rng.choice(list(FACT_Q))
            table, qs, _ = FACT_Q[fk]
            k = rng.choice(list(table))
            if para and rng.random() < para:
                return self.fact(fk, k, rng.choice(FACT_Q2[fk]))
            q = rng.choice([i for i in range(len(qs)) if i != self.fact_held[(fk, k)]])
            return self.fact(fk, k, q)
        if kind == "cannot":
            if STAGE3["cannot"] and rng.random() < STAGE3["cannot"]:
                return cannot_question(rng, rng.choice(CANNOT_Q2)), CANNOT_ANSWER, CANNOT_ANSWER
            t = rng.choice([q for i, q in enumerate(CANNOT_Q) if i not in CANNOT_HELD])
            return cannot_question(rng, t), CANNOT_ANSWER, CANNOT_ANSWER
        raise ValueError(kind)

    # ---- held-out sets ----
    def held_out(self, n: int, seed: int, extra: bool = False) -> dict[str, list[tuple]]:
        rng = random.Random(seed * 31 + 7)
        out = {}
        add = sorted(self.add_held)
        sub = sorted(self.sub_held)
        out["addition"] = [self.add(a, b, rng.randrange(len(ADD_Q))) for a, b in rng.sample(add, min(n, len(add)))]
        out["subtraction"] = [self.sub(a, b, rng.randrange(len(SUB_Q))) for a, b in rng.sample(sub, min(n, len(sub)))]
        pw = sorted(self.pseudo_held)
        out["count letters"] = [self.letters(w, rng.randrange(len(LETTERS_Q))) for w in rng.sample(pw, min(n, len(pw)))]
        out["spell"] = [self.spell_fwd(w, rng.randrange(len(SPELL_Q))) for w in rng.sample(pw, min(n, len(pw)))]
        pw8 = [w for w in pw if len(w) <= 8]
        out["spell backwards"] = [self.reverse(w, rng.randrange(len(REVERSE_Q))) for w in rng.sample(pw8, min(n, len(pw8)))]
        rw = sorted(self.words_held)
        out["backwards (real words)"] = [self.reverse(w, rng.randrange(len(REVERSE_Q))) for w in rw if len(w) <= 8][:n]
        it = sorted(self.items_held)
        out["count items"] = [self.items(l, rng.randrange(len(ITEMS_Q))) for l in rng.sample(it, min(n, len(it)))]
        facts = sorted(self.fact_held.items())
        out["facts"] = [self.fact(kind, k, q) for (kind, k), q in rng.sample(facts, min(n, len(facts)))]
        if not extra:
            return out
        # Stage 2's sets (their own generator, so the sets above stay what they were):
        # held-out operands in the new phrasings, and out-of-scope questions never trained.
        rng = random.Random(seed * 31 + 8)
        new = []
        for i in range(n):
            task = ["addition", "subtraction", "count letters", "spell", "spell backwards", "count items",
                    "facts"][i % 7]
            if task == "addition":
                q, a, k = self.add(*rng.choice(add), rng.choice(ADD_Q2))
            elif task == "subtraction":
                q, a, k = self.sub(*rng.choice(sub), rng.choice(SUB_Q2))
            elif task == "count letters":
                q, a, k = self.letters(rng.choice(pw), rng.choice(LETTERS_Q2))
            elif task == "spell":
                q, a, k = self.spell_fwd(rng.choice(pw), rng.choice(SPELL_Q2))
            elif task == "spell backwards":
                q, a, k = self.reverse(rng.choice(pw8), rng.choice(REVERSE_Q2))
            elif task == "count items":
                q, a, k = self.items(rng.choice(it), rng.choice(ITEMS_Q2))
            else:
                (kind, key), _ = rng.choice(facts)
                q, a, k = self.fact(kind, key, rng.choice(FACT_Q2[kind]))
            new.append((q, a, (task, k)))
        out["new phrasings (all tasks)"] = new
        held_t = [q for i, q in enumerate(CANNOT_Q) if i in CANNOT_HELD]
        out["out of scope (unseen questions)"] = [
            (q, CANNOT_ANSWER, CANNOT_ANSWER) for q in (cannot_question(rng, held_t[i % len(held_t)]) for i in range(n))]
        return out


def chat_example(rng: random.Random, tasks: Tasks, mix: list[tuple[str, float]]) -> list[dict]:
    """One conversation (list of messages) of one to three turns."""
    msgs = []
    if rng.random() < 0.15:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = 1 if rng.random() < 0.8 else rng.randint(2, 3)
    kinds, weights = zip(*mix)
    for _ in range(turns):
        kind = rng.choices(kinds, weights)[0]
        q, a = chat_turn(rng, tasks, kind)
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "content": a})
    return msgs


STORY_Q = ["Tell me a story.", "Tell me a short story.", "Can you tell me a story?",
           "Tell me a story about a {animal}.", "Write a little story."]
STORY_Q2 = ["Tell me a story about a {animal}!", "Story please.", "Can you tell me a story about a {animal}?",
            "I would like a story.", "tell me a story", "Make up a story about a {animal}.",
            "Write a short story about a {animal}."]
TELLFACT_Q = ["Tell me a fact.", "Tell me something interesting.", "Do you know a fact?"]
TELLFACT_Q2 = ["Tell me a fun fact.", "Teach me something.", "tell me a fact", "Give me a fact."]


def chat_turn(rng: random.Random, tasks: Tasks, kind: str, para: float = 0.0) -> tuple[str, str]:
    """One (question, answer) of `kind`; `para` > 0 (stage 2) mixes in the *_Q2 phrasings."""
    if kind == "talk":
        qs, ans = rng.choice(SMALL_TALK)
        q, a = rng.choice(qs), rng.choice(ans)
    elif kind == "story":
        animal = rng.choice(ANIMALS)
        q = rng.choice(STORY_Q2 if para and rng.random() < para else STORY_Q).format(animal=animal)
        a = story(rng, animal if "about" in q else None)
    elif kind == "tellfact":
        q = rng.choice(TELLFACT_Q2 if para and rng.random() < para else TELLFACT_Q)
        a = fact_prose(rng)
    else:
        q, a, _ = tasks.draw(rng, kind, para)
    if para:
        q = vary(rng, q)
    return q, a


def conversation(rng: random.Random, tasks: Tasks, mix: list[tuple[str, float]], max_turns: int = 8,
                 para: float = 0.5) -> list[dict]:
    """Stage 2: one conversation of 1 to `max_turns` turns (a quarter of them one turn),
    mixing the tasks, sometimes after a system prompt. Every answer is trained on."""
    msgs = []
    if rng.random() < 0.15:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = 1 if rng.random() < 0.25 else rng.randint(2, max_turns)
    kinds, weights = zip(*mix)
    for _ in range(turns):
        q, a = chat_turn(rng, tasks, rng.choices(kinds, weights)[0], para)
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "content": a})
    return msgs


def render(msgs: list[dict], add_generation_prompt: bool = False) -> str:
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render_with_spans(msgs: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans that are trained on (assistant
    contents and their <|im_end|>)."""
    s, spans = "", []
    for m in msgs:
        s += f"<|im_start|>{m['role']}\n"
        if m["role"] == "assistant":
            start = len(s)
            s += m["content"] + "<|im_end|>"
            spans.append((start, len(s)))
            s += "\n"
        else:
            s += m["content"] + "<|im_end|>\n"
    return s, spans


TASK_MIX = [("add", 0.22), ("sub", 0.22), ("letters", 0.08), ("spell", 0.08), ("reverse", 0.09),
            ("items", 0.06), ("fact", 0.15), ("talk", 0.04), ("story", 0.03), ("tellfact", 0.03)]
ENGLISH_SHARE = 0.15  # share of documents that are plain English text (not chat)
# ... and of those: generated stories, generated fact sentences, King James Bible, Devil's Dictionary
ENGLISH_MIX = [("story", 0.40), ("facts", 0.15), ("kjv", 0.30), ("devil", 0.15)]
# Stage 2 (`train --init`): conversations of 1-8 turns, the new phrasings, out-of-scope questions.
CONV_TASK_MIX = [("add", 0.19), ("sub", 0.19), ("letters", 0.07), ("spell", 0.08), ("reverse", 0.10),
                 ("items", 0.06), ("fact", 0.14), ("talk", 0.05), ("story", 0.03), ("tellfact", 0.03),
                 ("cannot", 0.06)]
CONV_ENGLISH_SHARE = 0.2  # of documents; conversations are longer, so about 7% of the tokens
# Stage 3 (`train --init STAGE2 --focus-words`): more letter tasks on real words, more
# out-of-scope questions.
FOCUS_TASK_MIX = [("add", 0.13), ("sub", 0.13), ("letters", 0.12), ("spell", 0.14), ("reverse", 0.16),
                  ("items", 0.05), ("fact", 0.11), ("talk", 0.04), ("story", 0.02), ("tellfact", 0.02),
                  ("cannot", 0.08)]
