#!/usr/bin/env python3
"""Train colibri's built-in demo model from scratch: a tiny `qwen3_moe` chat model.

    nice -n 10 python3 tools/train_demo.py train                 # -> models/demo-hf/
    python3 tools/train_demo.py eval --engine hf   --model models/demo-hf
    python3 tools/train_demo.py eval --engine coli --model models/demo-hf   # native path
    python3 tools/train_demo.py compare --model models/demo-hf   # coli vs transformers, token for token
    python3 tools/train_demo.py samples --engine coli --model models/demo-hf

Everything the model learns from is made here, seeded:

  * chat-formatted synthetic tasks whose answers can be checked: two-digit addition and
    subtraction (several phrasings), counting the letters of a word, counting the items
    of a list, spelling a word forwards and backwards, and simple facts from tables held
    in this file (capitals, animal sounds, colours, opposites), plus small talk;
  * general English: short stories and descriptions generated from a small grammar in
    this file, and public-domain prose from two Debian packages, read from the local
    installation (`apt-get install -y bible-kjv bible-kjv-text dict-devil`):
    the King James Bible (1611; bible-kjv-text, read through the `bible` program of
    bible-kjv) and Ambrose Bierce's The Devil's Dictionary (1911; dict-devil).

Each task has a held-out evaluation split that is never trained on:
  * arithmetic: whole (a, b) operand pairs are held out (no phrasing of them is trained);
  * letters / spelling / reverse: held-out made-up words (random syllables) and a held-out
    part of the real word list;
  * counting items: held-out lists;
  * facts: one (fact, phrasing) combination per fact is held out: the fact is learned
    from the other phrasings, and asked in the held-out phrasing.

The tokenizer is a byte-level BPE trained here (tokenizers library) whose pre-tokenizer
splits digits one by one; it is saved with a ChatML chat template inside
tokenizer_config.json (eos `<|im_end|>`).

Requires torch, transformers (5.x) and tokenizers, and for `train` the Debian packages
above. CI never runs this script; the model it wrote is committed under models/demo-hf/.
`train` records its wall time, CPU time (getrusage) and the load average in training.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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

# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "England": "London", "Ireland": "Dublin", "Scotland": "Edinburgh",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "Poland": "Warsaw", "Austria": "Vienna", "Greece": "Athens", "Hungary": "Budapest",
    "Belgium": "Brussels", "the Netherlands": "Amsterdam", "Switzerland": "Bern",
    "Czechia": "Prague", "Romania": "Bucharest", "Russia": "Moscow", "Ukraine": "Kyiv",
    "Turkey": "Ankara", "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja",
    "Morocco": "Rabat", "Ghana": "Accra", "Ethiopia": "Addis Ababa", "Japan": "Tokyo",
    "China": "Beijing", "India": "New Delhi", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "South Korea": "Seoul", "Indonesia": "Jakarta", "Iran": "Tehran", "Iraq": "Baghdad",
    "Israel": "Jerusalem", "Canada": "Ottawa", "the United States": "Washington",
    "Mexico": "Mexico City", "Cuba": "Havana", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
    "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota", "Australia": "Canberra",
    "New Zealand": "Wellington", "Iceland": "Reykjavik",
}
SOUNDS = {
    "cat": "meow", "dog": "woof", "cow": "moo", "sheep": "baa", "duck": "quack",
    "pig": "oink", "horse": "neigh", "lion": "roar", "owl": "hoot", "frog": "croak",
    "mouse": "squeak", "snake": "hiss", "bee": "buzz", "rooster": "cock-a-doodle-doo",
    "goat": "bleat", "wolf": "howl", "donkey": "hee-haw", "crow": "caw", "chick": "cheep",
    "turkey": "gobble", "dove": "coo", "bear": "growl", "elephant": "trumpet",
}
COLOURS = {
    "the sky": "blue", "grass": "green", "snow": "white", "coal": "black", "a banana": "yellow",
    "a lemon": "yellow", "a tomato": "red", "a strawberry": "red", "an orange": "orange",
    "a carrot": "orange", "the sea": "blue", "a leaf": "green", "milk": "white",
    "chocolate": "brown", "a pumpkin": "orange", "a lime": "green", "blood": "red",
    "the sun": "yellow", "a crow": "black", "a polar bear": "white", "an elephant": "grey",
    "a frog": "green", "a cherry": "red", "a plum": "purple", "a grape": "purple",
    "a flamingo": "pink", "the night sky": "black", "a cloud": "white", "a fire truck": "red",
    "a mouse": "grey",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "day": "night",
    "happy": "sad", "old": "new", "open": "closed", "light": "dark", "wet": "dry",
    "left": "right", "high": "low", "early": "late", "full": "empty", "hard": "soft",
    "long": "short", "loud": "quiet", "rich": "poor", "strong": "weak", "thick": "thin",
    "win": "lose", "in": "out", "black": "white", "first": "last", "near": "far",
    "young": "old", "clean": "dirty", "heavy": "light", "push": "pull", "yes": "no",
}

FRUITS = ["apple", "banana", "pear", "plum", "grape", "lemon", "cherry", "orange", "peach",
          "melon", "mango", "lime", "kiwi", "fig"]
ANIMALS = list(SOUNDS)
COLOUR_WORDS = ["red", "blue", "green", "yellow", "white", "black", "brown", "pink", "purple",
                "grey", "orange"]
# Real words for the letter tasks (spelling, backwards, counting letters).
WORDS = sorted(set(FRUITS + ANIMALS + COLOUR_WORDS + list(OPPOSITES) + list(OPPOSITES.values()) + """
    house tree river stone cloud water fire bread table chair window door garden flower
    book paper pencil letter music dance song story dream night morning evening summer
    winter spring autumn friend family mother father sister brother child baby school
    teacher doctor farmer king queen castle bridge road city town village forest mountain
    island ocean beach sand shell boat ship train plane car bike ball kite doll robot
    rocket planet star moon earth light shadow smile laugh happy quick slow gentle brave
    clever kind quiet little tiny giant green purple silver golden candle lamp clock watch
    shoe sock hat coat dress shirt glove ring crown sword shield horse rabbit turtle
    dolphin whale shark tiger zebra monkey giraffe camel parrot eagle swan spider ant
    butter cheese honey sugar salt pepper soup cake cookie pizza salad rice bean corn
    potato onion garlic carrot tomato basket bottle cup plate spoon fork knife bowl
    piano guitar drum violin flute paint brush color shape circle square triangle heart
    north south east west left right under over after before always never maybe often
    jump run walk swim climb sing read write draw think learn build open close start stop
    """.split()))

NAMES = ["Tom", "Anna", "Sam", "Lily", "Ben", "Mia", "Max", "Emma", "Leo", "Zoe", "Jack",
         "Lucy", "Finn", "Ella", "Noah", "Ruby", "Omar", "Nina", "Hugo", "Ava"]
GIRLS = {"Anna", "Lily", "Mia", "Emma", "Zoe", "Lucy", "Ella", "Ruby", "Nina", "Ava"}
PLACES = ["the park", "the forest", "the river", "the garden", "the town", "the beach",
          "the market", "the hill", "the farm", "the lake", "the library", "the old house"]
OBJECTS = ["ball", "kite", "book", "hat", "box", "key", "map", "shell", "stone", "cup",
           "bell", "boat", "drum", "lamp", "ring", "basket"]
FEELINGS = ["happy", "sad", "tired", "excited", "scared", "proud", "surprised", "calm"]
ADJS = ["small", "big", "old", "young", "shiny", "quiet", "funny", "brave", "kind", "lazy"]

# --------------------------------------------------------------------------------------
# English text
# --------------------------------------------------------------------------------------


def a_an(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def story(rng: random.Random, animal: str | None = None) -> str:
    name = rng.choice(NAMES)
    he = ("she", "her", "her") if name in GIRLS else ("he", "his", "him")
    animal = animal or rng.choice(ANIMALS)
    adj = rng.choice(ADJS)
    place = rng.choice(PLACES)
    place2 = rng.choice([p for p in PLACES if p != place])
    obj = rng.choice(OBJECTS)
    colour = rng.choice(COLOUR_WORDS)
    feeling = rng.choice(FEELINGS)
    friend = rng.choice([n for n in NAMES if n != name])
    opening = rng.choice(["Once upon a time", "One day", "Long ago", "One morning", "Last summer",
                          "On a cold winter day", "One sunny afternoon"])
    s = []
    s.append(rng.choice([
        f"{opening}, there was {a_an(adj)} {animal} who lived near {place}.",
        f"{opening}, {name} went to {place} with {he[1]} friend {friend}.",
        f"{opening}, {name} found {a_an(colour)} {obj} in {place}.",
        f"{opening}, {a_an(adj)} {animal} and {name} played in {place}.",
    ]))
    middle = [
        f"The {animal} said \"{SOUNDS[animal]}\" and ran to {place2}.",
        f"{name} was {feeling} because the {obj} was {colour}.",
        f"\"Look!\" said {friend}. \"There is {a_an(colour)} {obj} under the tree.\"",
        f"They walked to {place2} and looked for the {obj}.",
        f"{he[0].capitalize()} picked up the {obj} and showed it to {he[1]} mother.",
        f"The sun was warm, and the wind moved the leaves of the trees.",
        f"{name} gave the {animal} some bread, and the {animal} was very {rng.choice(FEELINGS)}.",
        f"It started to rain, so {name} and {friend} ran home.",
        f"\"Can we keep it?\" asked {name}. \"Yes,\" said {friend}, \"but we must take care of it.\"",
        f"At {place2}, they met {a_an(rng.choice(ADJS))} {rng.choice(ANIMALS)}.",
        f"{name} counted {rng.randint(2, 9)} birds in the sky.",
        f"The {obj} was heavy, but {name} did not give up.",
        f"{friend} laughed, and {name} laughed too.",
        f"{he[0].capitalize()} wanted to find out where the {animal} lived.",
    ]
    rng.shuffle(middle)
    s.extend(middle[: rng.randint(2, 5)])
    s.append(rng.choice([
        f"In the end, {name} went home and was {rng.choice(['happy', 'tired', 'proud', 'calm'])}.",
        f"From that day on, {name} and the {animal} were good friends.",
        f"That night, {name} dreamed about the {colour} {obj}.",
        f"And that is how {name} learned to be {rng.choice(['brave', 'kind', 'patient', 'careful'])}.",
        f"The end.",
    ]))
    return " ".join(s)


def fact_prose(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(2, 5)):
        kind = rng.randrange(4)
        if kind == 0:
            c = rng.choice(list(CAPITALS))
            parts.append(rng.choice([f"The capital of {c} is {CAPITALS[c]}.", f"{CAPITALS[c]} is the capital of {c}.",
                                     f"{CAPITALS[c]} is a big city in {c}."]))
        elif kind == 1:
            a = rng.choice(ANIMALS)
            parts.append(rng.choice([f"{a_an(a).capitalize()} says \"{SOUNDS[a]}\".", f"The {a} makes a sound like \"{SOUNDS[a]}\"."]))
        elif kind == 2:
            t = rng.choice(list(COLOURS))
            parts.append(f"{t[0].upper() + t[1:]} is {COLOURS[t]}.")
        else:
            w = rng.choice(list(OPPOSITES))
            parts.append(f"The opposite of \"{w}\" is \"{OPPOSITES[w]}\".")
    return " ".join(parts)


# Public-domain English prose from two Debian packages (see docs/demo-model.md for their
# copyright statements):
#   * bible-kjv-text: the King James Bible (1611), read through the `bible` program of the
#     bible-kjv package (the data file is in that program's own compressed format);
#   * dict-devil: Ambrose Bierce, The Devil's Dictionary (1911), in dictd format.
KJV_DATA = Path("/usr/lib/bible.data")
DEVIL_DICT = Path("/usr/share/dictd/devil.dict.dz")
DEVIL_INDEX = Path("/usr/share/dictd/devil.index")


def missing(what: str, packages: str) -> SystemExit:
    return SystemExit(f"error: {what} not found. The demo model's English text comes from Debian packages; "
                      f"install them with:  apt-get install -y {packages}")


def kjv_paragraphs() -> list[str]:
    """The King James Bible as prose paragraphs: consecutive verses of one chapter, without
    verse numbers or chapter headings, joined until a paragraph has at least 300 characters
    and ends a sentence (at most 1200 characters)."""
    if not KJV_DATA.exists():
        raise missing(str(KJV_DATA), "bible-kjv bible-kjv-text")
    try:
        r = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise missing("the `bible` program", "bible-kjv bible-kjv-text") from None
    out, cur = [], []

    def flush():
        if cur:
            out.append(" ".join(cur))
            cur.clear()

    n_verses = 0
    for line in r.stdout.splitlines():
        m = re.match(r"^\s+\d+ (.*\S)\s*$", line)
        if not m:
            flush()  # chapter heading or blank line: a chapter ends
            continue
        n_verses += 1
        verse = " ".join(m.group(1).split())
        if cur and len(" ".join(cur)) + len(verse) > 1200:
            flush()
        cur.append(verse)
        if len(" ".join(cur)) >= 300 and verse[-1] in ".?!":
            flush()
    flush()
    if n_verses != 31102:
        raise SystemExit(f"error: `bible` printed {n_verses} verses, expected the 31102 of the King James Bible")
    return out


def devil_paragraphs() -> list[str]:
    """The Devil's Dictionary as prose paragraphs: each entry's definition ("Abasement, n. A
    decent and customary mental attitude ...") and any further prose paragraphs of the entry.
    The dictd header entries (00-database-*) and the indented verse quotations and their
    attributions are left out; _italics_ marks are removed."""
    import gzip
    if not (DEVIL_DICT.exists() and DEVIL_INDEX.exists()):
        raise missing(f"{DEVIL_DICT} / {DEVIL_INDEX}", "dict-devil")
    raw = gzip.open(DEVIL_DICT).read()
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def num(s: str) -> int:
        v = 0
        for ch in s:
            v = v * 64 + b64.index(ch)
        return v

    out = []
    for line in DEVIL_INDEX.read_text(encoding="utf-8").splitlines():
        word, off, size = line.split("\t")
        if word.startswith("00database"):
            continue
        entry = raw[num(off):num(off) + num(size)].decode("utf-8")
        blocks = [b for b in re.split(r"\n\s*\n", entry) if b.strip()]
        for i, block in enumerate(blocks):
            lines = block.split("\n")
            # Prose: the first block (headword and definition), or a block whose lines after
            # the first are not indented. Verse is indented throughout.
            if i > 0 and (len(lines) < 2 or any(l.startswith(" ") for l in lines[1:])):
                continue
            p = " ".join(block.split()).replace("_", "")
            p = re.sub(r"\{([^}]*)\}", lambda m: m.group(1).lower(), p)  # dictd cross-references
            if i == 0:  # "ABASEMENT, n." -> "Abasement, n."; "BABE or BABY" -> "Babe or baby"
                m = re.match(r"^[A-Z][A-Z'-]*(?: (?:or )?[A-Z][A-Z'-]*)*", p)
                if m and len(m.group(0).strip()) > 1:
                    p = m.group(0).capitalize() + p[len(m.group(0)):]
            if len(p) >= 20 and p not in out:  # some entries are indexed under two headwords
                out.append(p)
    if len(out) < 900:
        raise SystemExit(f"error: only {len(out)} paragraphs read from {DEVIL_DICT}; is dict-devil complete?")
    return out


# --------------------------------------------------------------------------------------
# Synthetic chat tasks
# --------------------------------------------------------------------------------------

ADD_Q = [
    "What is {a} + {b}?", "What is {a} plus {b}?", "What's {a}+{b}?", "Add {a} and {b}.",
    "Compute {a} + {b}.", "What is the sum of {a} and {b}?", "{a} + {b} = ?", "Calculate {a} plus {b}.",
    "How much is {a} + {b}?", "Please add {a} to {b}.",
]
SUB_Q = [
    "What is {a} - {b}?", "What is {a} minus {b}?", "What's {a}-{b}?", "Subtract {b} from {a}.",
    "Compute {a} - {b}.", "What is the difference between {a} and {b}?", "{a} - {b} = ?",
    "Calculate {a} minus {b}.", "How much is {a} - {b}?", "Take {b} away from {a}.",
]
LETTERS_Q = ['How many letters are in "{w}"?', 'How many letters does the word "{w}" have?',
             'Count the letters in "{w}".', 'What is the length of the word "{w}"?',
             'How long is the word "{w}"?']
SPELL_Q = ['How do you spell "{w}"?', 'Spell "{w}".', 'Spell the word "{w}" letter by letter.',
           'What are the letters of "{w}"?']
REVERSE_Q = ['Spell "{w}" backwards.', 'What is "{w}" written backwards?', 'Reverse the letters of "{w}".',
             'Write "{w}" in reverse.', 'How do you spell "{w}" backwards?']
ITEMS_Q = ["How many items are in this list: {l}?", "Count the words: {l}.",
           "How many things are here: {l}?", "I have {l}. How many is that?",
           "How many are there: {l}?"]
FACT_Q = {
    "capital": (CAPITALS, ["What is the capital of {k}?", "Which city is the capital of {k}?",
                           "Name the capital of {k}.", "What's the capital city of {k}?",
                           "Tell me the capital of {k}."],
                lambda k, v: f"The capital of {k} is {v}."),
    "sound": (SOUNDS, ["What sound does a {k} make?", "What does a {k} say?", "How does a {k} sound?",
                       "Which sound does a {k} make?", "What noise does a {k} make?"],
              lambda k, v: f"{a_an(k).capitalize()} says \"{v}\"."),
    "colour": (COLOURS, ["What colour is {k}?", "What color is {k}?", "Which colour is {k}?",
                         "Tell me the colour of {k}.", "What is the colour of {k}?"],
               lambda k, v: f"{k[0].upper() + k[1:]} is {v}."),
    "opposite": (OPPOSITES, ['What is the opposite of "{k}"?', 'What is the opposite of {k}?',
                             'Give me the opposite of "{k}".', 'Name the opposite of "{k}".',
                             'What word means the opposite of "{k}"?'],
                 lambda k, v: f"The opposite of \"{k}\" is \"{v}\"."),
}
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are colibri's tiny demo model.",
                  "Answer briefly."]
SMALL_TALK = [
    (["Hello!", "Hi!", "Hello", "Hi there!", "Hey!", "Good morning!"],
     ["Hello! How can I help you?", "Hi! What would you like to know?", "Hello! Ask me something."]),
    (["How are you?", "How are you today?", "How is it going?"],
     ["I am fine, thank you! How can I help you?", "I am well, thanks for asking."]),
    (["Who are you?", "What are you?", "What is your name?", "Tell me about yourself."],
     ["I am the colibri demo model, a tiny mixture-of-experts language model. I can add and subtract, "
      "count letters, spell words backwards and answer simple questions.",
      "I am a tiny mixture-of-experts model made by the colibri project."]),
    (["What can you do?", "How can you help me?", "What do you know?"],
     ["I can add and subtract two-digit numbers, count letters and things, spell words backwards, "
      "and tell you capitals, animal sounds, colours and opposites. I can also tell a short story."]),
    (["Thank you!", "Thanks!", "Thanks a lot.", "Great, thank you."],
     ["You are welcome!", "You're welcome! Anything else?", "Happy to help!"]),
    (["Bye!", "Goodbye!", "See you later.", "Good night!"],
     ["Goodbye! Have a nice day.", "Bye! See you soon."]),
    (["What is colibri?", "Tell me about colibri."],
     ["colibri is an engine that runs mixture-of-experts language models on your own computer and in the browser."]),
]


# Stage 2 (`finetune`, conversations): more phrasings of every task, the word often without
# quotes ("Spell river backwards"). Kept apart from the lists above, from which the held-out
# sets draw, so that those sets stay exactly the ones stage 1 was checked on.
ADD_Q2 = [
    "{a} plus {b}?", "what is {a} + {b}", "Can you add {a} and {b}?", "{a} + {b}", "{a}+{b}=?",
    "Work out {a} + {b}.", "What do you get if you add {a} and {b}?", "Sum of {a} and {b}?",
    "Add {b} to {a}.", "What is {a} and {b} together?", "I have {a} apples and get {b} more. How many now?",
    "Could you add {a} and {b} for me?",
]
SUB_Q2 = [
    "{a} minus {b}?", "what is {a} - {b}", "Can you subtract {b} from {a}?", "{a} - {b}", "{a}-{b}=?",
    "Work out {a} - {b}.", "What do you get if you take {b} from {a}?", "What is {a} take away {b}?",
    "I have {a} apples and eat {b}. How many are left?", "Could you subtract {b} from {a} for me?",
]
LETTERS_Q2 = ["How many letters are in {w}?", "How many letters does {w} have?", "Count the letters of {w}.",
              'How many letters in "{w}"?', "how many letters in {w}", "How long is {w}?",
              'Can you count the letters in "{w}"?', "Number of letters in {w}?"]
SPELL_Q2 = ["Spell {w}.", "How do you spell {w}?", "Spell {w}", "Spell out {w}.", "How is {w} spelled?",
            'Can you spell "{w}"?', "spell {w}", "Spell the word {w}."]
REVERSE_Q2 = ["Spell {w} backwards.", "Spell {w} backwards", "spell {w} backwards", "What is {w} backwards?",
              "Write {w} backwards.", "Reverse the word {w}.", 'Can you spell "{w}" backwards?',
              "{w} backwards?", "How do you write {w} backwards?", "Reverse {w}.", 'Spell "{w}" in reverse.']
ITEMS_Q2 = ["Count these: {l}.", "How many words are in this list: {l}?", "Please count: {l}.",
            "How many things: {l}?", "{l}: how many?", "Can you count {l}?"]
FACT_Q2 = {
    "capital": ["Capital of {k}?", "What city is the capital of {k}?", "Do you know the capital of {k}?",
                "what is the capital of {k}", "Where is the capital of {k}?"],
    "sound": ["What sound does the {k} make?", "What does the {k} say?", "What noise does the {k} make?",
              "How does the {k} go?", "What sound do you hear from a {k}?"],
    "colour": ["What colour is {k} usually?", "Colour of {k}?", "What color is {k} usually?",
               "Do you know the colour of {k}?", "what colour is {k}"],
    "opposite": ["Opposite of {k}?", "What's the opposite of {k}?", "Tell me the opposite of {k}.",
                 "opposite of {k}", "What is the opposite of the word {k}?"],
}
# Out of scope: one short, honest answer. The templates marked held-out are only asked by
# `eval` (unseen questions the model should still decline).
CANNOT_ANSWER = ("I am a tiny demo model; I can do arithmetic (adding and subtracting numbers up to 99), "
                 "spelling, counting, simple facts and short stories, but not that.")
LANGS = ["French", "German", "Spanish", "Italian", "Japanese", "Chinese", "Russian", "Dutch"]
TOPICS = ["the weather", "football", "politics", "the stock market", "cars", "computers", "history",
          "the news", "space travel", "medicine", "philosophy", "the internet", "love", "money", "war"]
THINGS = ["movie", "book", "phone", "laptop", "restaurant", "song", "game", "car", "holiday"]
FOODS = ["pasta", "rice", "soup", "a cake", "bread", "eggs", "fish", "pizza"]
OTHER_COUNTRIES = ["Mongolia", "Chad", "Nepal", "Bolivia", "Laos", "Mali", "Fiji", "Oman", "Peru", "Brazil"]
CANNOT_Q = [
    "What is {a} times {b}?", "What is {a} multiplied by {b}?", "What is {a} divided by {b}?",
    "What is the square root of {a}?", "Translate \"{w}\" into {lang}.", "How do you say {w} in {lang}?",
    "Write a poem about {topic}.", "Tell me about {topic}.", "What do you think about {topic}?",
    "What is the weather like in {city}?", "What time is it?", "What day is it today?",
    "Who is the president of {country}?", "What is the population of {country}?", "Who wrote the Bible?",
    "Can you write a program in Python?", "How do I cook {food}?", "Recommend a good {thing}.",
    "What is the best {thing}?", "What is the meaning of life?", "Can you help me with my homework?",
    "What is the latest news?", "Tell me a joke.", "Search the internet for {topic}.",
    "How far away is the moon?", "How old is the universe?", "Who won the World Cup?",
    "Summarize this article for me.", "What should I eat for dinner?", "Book a table for two.",
    "What is my name?", "Play some music.", "Set an alarm for {n} o'clock.", "What is {a} to the power of {b}?",
    "Solve x + {a} = {b}.", "Explain quantum physics.", "Why is {topic} important?", "Write me an email.",
    "How do I fix my {thing}?", "Can you draw a picture of a {animal}?", "What is {a} percent of {b}?",
    "Who invented the {thing}?", "Is it going to rain tomorrow?", "What is the price of a {thing}?",
]
CANNOT_HELD = set(range(3, len(CANNOT_Q), 6))  # 7 of the 44 templates: never trained
# Stage 3: more out-of-scope questions (all trained; the held-out ones above stay unseen).
CANNOT_Q2 = [
    "Write a song about {topic}.", "Who is the king of {country}?", "What is the currency of {country}?",
    "What language do they speak in {country}?", "How do I learn {lang}?", "What is {a} squared?",
    "Count to {a} in {lang}.", "What will happen tomorrow?", "Give me a recipe for {food}.",
    "Can you order {food} for me?", "Where is the nearest {thing} shop?", "What is the speed of light?",
    "Why is the sky blue?", "How does a {thing} work?", "Tell me the news about {topic}.",
    "What is your favourite {thing}?", "Do you have feelings?", "Can you see me?", "Send a message to my mother.",
    "Write an essay about {topic}.", "Convert {a} miles to kilometres.", "How many days are in a year?",
    "Who painted the Mona Lisa?", "Open the window.", "Translate this into {lang}: good morning.",
]
STAGE3 = {"cannot": 0.0}  # set by `train --focus-words`: share of out-of-scope questions from CANNOT_Q2


def cannot_question(rng: random.Random, template: str) -> str:
    return template.format(
        a=rng.randint(2, 99), b=rng.randint(2, 99), n=rng.randint(1, 12), w=rng.choice(WORDS),
        lang=rng.choice(LANGS), topic=rng.choice(TOPICS), thing=rng.choice(THINGS), food=rng.choice(FOODS),
        city=rng.choice(list(CAPITALS.values())), country=rng.choice(OTHER_COUNTRIES), animal=rng.choice(ANIMALS))


def vary(rng: random.Random, q: str) -> str:
    """Small surface changes people make: a lower-case start, no final punctuation."""
    if rng.random() < 0.1:
        q = q[0].lower() + q[1:]
    if rng.random() < 0.1 and q[-1] in ".?":
        q = q[:-1]
    return q


def add_answer(a: int, b: int) -> str:
    """Column addition, shown digit by digit: every step is a one-digit fact or a copy."""
    if a < 10 and b < 10:
        return f"{a} + {b} = {a + b}."
    (a1, a0), (b1, b0) = divmod(a, 10), divmod(b, 10)
    u = a0 + b0
    c = u // 10
    s = f"{a} + {b}: {a0} + {b0} = {u}" + (", carry 1. " if c else ". ")
    s += f"{a1} + {b1}" + (" + 1" if c else "") + f" = {a1 + b1 + c}. "
    return s + f"So {a} + {b} = {a + b}."


def sub_answer(a: int, b: int) -> str:
    """Column subtraction (a >= b), shown digit by digit, borrowing when needed."""
    if a < 10 and b < 10:
        return f"{a} - {b} = {a - b}."
    (a1, a0), (b1, b0) = divmod(a, 10), divmod(b, 10)
    if a0 >= b0:
        s = f"{a} - {b}: {a0} - {b0} = {a0 - b0}. {a1} - {b1} = {a1 - b1}. "
    else:
        s = f"{a} - {b}: {a0} - {b0} needs a borrow, {a0 + 10} - {b0} = {a0 + 10 - b0}. {a1} - 1 - {b1} = {a1 - 1 - b1}. "
    return s + f"So {a} - {b} = {a - b}."


def spell(w: str) -> str:
    return "-".join(w)


def rand_pseudo_word(rng: random.Random) -> str:
    cons = "bcdfghjklmnprstvwz"
    vow = "aeiou"
    n = rng.randint(3, 8)
    w = ""
    while len(w) < n:
        w += rng.choice(cons) + rng.choice(vow) + (rng.choice(cons) if rng.random() < 0.3 else "")
    return w[:n]


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

# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=4096,
                                   clean_up_tokenization_spaces=False)


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


def make_documents(n_docs: int, seed: int, tasks: Tasks, prose: dict[str, list[str]], stage: int = 1,
                   focus: bool = False):
    """(text, trained character spans) for each document; English docs are trained whole.
    `prose` holds the paragraphs of the public-domain texts ("kjv", "devil"). Stage 2 makes
    multi-turn conversations (and draws from another seed than stage 1)."""
    rng = random.Random(seed if stage == 1 else seed * 1000003 + 2 + focus)
    kinds, weights = zip(*ENGLISH_MIX)
    out = []
    for _ in range(n_docs):
        if stage == 2 and rng.random() >= CONV_ENGLISH_SHARE:
            out.append(render_with_spans(conversation(rng, tasks, FOCUS_TASK_MIX if focus else CONV_TASK_MIX)))
        elif stage == 2 or rng.random() < ENGLISH_SHARE:
            kind = rng.choices(kinds, weights)[0]
            if kind == "story":
                t = story(rng)
            elif kind == "facts":
                t = fact_prose(rng)
            else:
                t = rng.choice(prose[kind])
            t = t + "<|endoftext|>"
            out.append((t, [(0, len(t))]))
        else:
            out.append(render_with_spans(chat_example(rng, tasks, TASK_MIX)))
    return out


def tokenize_documents(hf_tok, docs):
    import numpy as np
    enc = hf_tok._tokenizer.encode_batch([t for t, _ in docs], add_special_tokens=False)
    ids, mask, starts = [], [], []
    for (text, spans), e in zip(docs, enc):
        starts.append(len(ids))
        for tid, (s, _e) in zip(e.ids, e.offsets):
            ids.append(tid)
            mask.append(any(a <= s < b for a, b in spans))
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=bool), np.array(starts, dtype=np.int64)


def model_config(vocab_size: int, tok):
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=16, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=True, max_position_embeddings=1024,
        rope_theta=10000.0, rms_norm_eps=1e-6, router_aux_loss_coef=0.01,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def cmd_train(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import GenerationConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    import resource

    def cpu_seconds() -> float:
        """CPU time (user + system) of this process, all its threads, and of waited-for children."""
        r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    load_start = os.getloadavg()
    log(f"load average at start: {load_start}; torch threads {torch.get_num_threads()} "
        f"(inter-op {torch.get_num_interop_threads()}), {os.cpu_count()} CPUs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.focus_words and not args.init:
        raise SystemExit("--focus-words is for a later stage: give --init")
    tasks = Tasks(args.seed, real_words=0.7 if args.focus_words else 0.35)
    STAGE3["cannot"] = 0.5 if args.focus_words else 0.0
    prose = {"kjv": kjv_paragraphs(), "devil": devil_paragraphs()}
    for k, v in prose.items():
        log(f"{k}: {len(v)} paragraphs, {sum(map(len, v))} characters")
    n_docs = args.docs
    stage = 2 if args.init else 1
    docs = make_documents(n_docs, args.seed, tasks, prose, stage, args.focus_words)
    if args.init:
        # Stage 2: continue from a stage-1 model, with its tokenizer (copied byte for byte).
        import shutil
        from transformers import AutoTokenizer
        init = Path(args.init)
        hf_tok = AutoTokenizer.from_pretrained(init)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if init.resolve() != out.resolve():
                shutil.copyfile(init / f, out / f)
        vocab = len(hf_tok)
        log(f"stage 2 from {init}: tokenizer of {vocab} tokens")
    else:
        tok_rng = random.Random(args.seed + 5)
        # The tokenizer sees a sample of the documents, plus all of the Devil's Dictionary and
        # 1000 Bible paragraphs, so that its merges cover general English, not only the tasks.
        docs_en = prose["devil"] + tok_rng.sample(prose["kjv"], 1000)
        tok_texts = [t for t, _ in tok_rng.sample(docs, min(30000, len(docs)))] + docs_en
        tok_texts = [t.replace("<|endoftext|>", "").replace("<|im_start|>", "").replace("<|im_end|>", "") for t in tok_texts]
        hf_tok = train_tokenizer(tok_texts)
        vocab = len(hf_tok)
        log(f"tokenizer: {vocab} tokens ({time.time() - t0:.0f}s)")
        hf_tok.save_pretrained(out, save_jinja_files=False)  # now, before any evaluation sets padding
    ids, mask, starts_np = tokenize_documents(hf_tok, docs)
    log(f"{n_docs} documents -> {len(ids)} tokens, {mask.mean():.2f} of them trained on ({time.time() - t0:.0f}s)")

    if args.init:
        model = Qwen3MoeForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        cfg = model.config
        init_meta = json.loads((Path(args.init) / "training.json").read_text()) \
            if (Path(args.init) / "training.json").exists() else None
    else:
        cfg = model_config(vocab, hf_tok)
        model = Qwen3MoeForCausalLM(cfg)
        init_meta = None
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters")

    T, B = args.seq, args.batch
    steps = args.steps
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    # Warmup-stable-decay: warm up for the first 100 steps, hold, then decay (cosine) over
    # the last 20% of the steps. Up to 80% of the steps the run does not depend on --steps,
    # so a checkpoint taken then can be resumed with another --steps (see --resume) and
    # gives exactly what a fresh run with that --steps gives.
    warm = args.warmup
    decay_from = int(steps * 0.8)

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        if s < decay_from:
            return args.lr
        p = (s - decay_from) / max(1, steps - decay_from)
        return args.lr * (0.03 + 0.97 * 0.5 * (1 + math.cos(math.pi * p)))

    g = torch.Generator().manual_seed(args.seed)
    ids_t = torch.from_numpy(ids)
    mask_t = torch.from_numpy(mask)
    # Rows start at document starts (so that, as at inference, a conversation is seen from
    # position 0), and run on into the following documents.
    doc_starts = torch.from_numpy(starts_np[starts_np + T + 1 <= len(ids)])
    start_step = 0
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    if args.resume:
        st = torch.load(args.resume, weights_only=False)
        if st["step"] > decay_from:
            raise SystemExit(f"checkpoint at step {st['step']} is past the stable phase of --steps {steps}")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        g.set_state(st["gen"])
        torch.set_rng_state(st["torch_rng"])
        start_step = st["step"]
        log(f"resumed from {args.resume} at step {start_step}")
    model.train()
    t_train = time.time()
    cpu_train0 = cpu_seconds()
    load_samples = []
    ema = None
    for step in range(start_step, steps):
        if ckpt and step % 100 == 0 and step <= decay_from and step > start_step:
            torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "gen": g.get_state(),
                        "torch_rng": torch.get_rng_state()}, ckpt)
        starts = doc_starts[torch.randint(len(doc_starts), (B,), generator=g)]
        idx = starts[:, None] + torch.arange(T + 1)[None, :]
        x = ids_t[idx[:, :-1]]
        y = ids_t[idx[:, 1:]].clone()
        y[~mask_t[idx[:, 1:]]] = -100
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        outp = model.model(input_ids=x, output_router_logits=True, use_cache=False)
        sel = y != -100  # logits only where there is a target (saves lm_head work)
        logits = model.lm_head(outp.last_hidden_state[sel])
        ce = F.cross_entropy(logits.float(), y[sel])
        aux = load_balancing_loss_func(outp.router_logits, cfg.num_experts, cfg.num_experts_per_tok, None)
        loss = ce + cfg.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
        if step % 50 == 0 or step == steps - 1:
            load_samples.append(os.getloadavg()[0])
            el = time.time() - t_train
            log(f"step {step}/{steps} loss {ce.item():.3f} (ema {ema:.3f}) aux {aux.item():.3f} "
                f"lr {lr_at(step):.2e} {el:.0f}s, {el / (step + 1 - start_step):.2f}s/step")
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            model.eval()
            acc = quick_eval(model, hf_tok, tasks, 16, args.seed, only=("addition", "subtraction"))
            log("held-out (quick): " + ", ".join(f"{k} {v:.2f}" for k, v in acc.items()))
            model.train()

    model.eval()
    train_s = time.time() - t_train
    train_cpu = cpu_seconds() - cpu_train0
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
        do_sample=False, max_new_tokens=64)
    model.save_pretrained(out, safe_serialization=True)
    meta = {
        "command": " ".join(["python3", "tools/train_demo.py"] + sys.argv[1:]),
        "seed": args.seed, "steps": steps, "batch": B, "seq": T, "lr": args.lr, "documents": n_docs,
        "tokens_in_stream": int(len(ids)), "tokens_seen": steps * B * T, "parameters": n_params,
        "resumed_from_step": start_step,
        "experts_implementation": getattr(cfg, "_experts_implementation", None),
        "stage": stage + bool(args.focus_words), "init": args.init, "previous_stage": init_meta,
        "time": {
            "train_wall_seconds": round(train_s),
            "train_cpu_seconds": round(train_cpu),
            "total_wall_seconds": round(time.time() - t0),
            "total_cpu_seconds": round(cpu_seconds()),
            "idle_2core_estimate_minutes": round(cpu_seconds() / 2 / 60, 1),
            "note": "total = data, tokenizer and training, before the final held-out check; cpu = getrusage "
                    "user+sys of the process (all threads) and its children; idle 2-core estimate = cpu / 2",
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "cpus": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "load_average_1min_during_training": {
                "min": round(min(load_samples), 2), "max": round(max(load_samples), 2),
                "mean": round(sum(load_samples) / len(load_samples), 2), "samples": len(load_samples)},
        },
        "torch": __import__("torch").__version__, "transformers": __import__("transformers").__version__,
        "tokenizers": __import__("tokenizers").__version__, "python": sys.version.split()[0],
    }
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"saved to {out}: {meta}")
    acc = quick_eval(model, hf_tok, tasks, args.final_eval, args.seed)
    log(f"held-out ({args.final_eval} each, transformers): " + ", ".join(f"{k} {v:.3f}" for k, v in acc.items()))


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------


def check(task: str, expected_key, text: str) -> bool:
    text = text.strip()
    if task == "new phrasings (all tasks)":
        return check(expected_key[0], expected_key[1], text)
    if task == "out of scope (unseen questions)":
        return text.startswith("I am a tiny demo model")
    if task in ("addition", "subtraction"):
        m = re.findall(r"=\s*(-?\d+)\.?$", text)
        return bool(m) and m[-1] == expected_key
    if task in ("count letters",):
        m = re.search(r"has (\d+) letters", text)
        return bool(m) and m.group(1) == expected_key
    if task == "count items":
        m = re.search(r"There (?:is|are) (\d+)\.", text)
        return bool(m) and m.group(1) == expected_key
    if task in ("spell backwards", "backwards (real words)"):
        m = re.search(r"Backwards it is ([a-z-]+?)\.?$", text)
        return bool(m) and m.group(1) == expected_key
    if task == "spell":
        m = re.search(r"is spelled ([a-z-]+?)\.?$", text)
        return bool(m) and m.group(1) == expected_key
    if task == "facts":
        return re.search(r"\b" + re.escape(expected_key) + r"\b", text) is not None
    raise ValueError(task)


def hf_generate(model, tok, prompts: list[str], max_new_tokens: int = 64, batch: int = 50) -> list[list[int]]:
    import torch
    outs = []
    tok.padding_side = "left"
    for i in range(0, len(prompts), batch):
        enc = tok(prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            g = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                               eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                               pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
        for row in g[:, enc["input_ids"].shape[1]:].tolist():
            eos = tok.convert_tokens_to_ids("<|im_end|>")
            pad = tok.convert_tokens_to_ids("<|endoftext|>")
            r = []
            for t in row:
                r.append(t)
                if t == eos:
                    break
            outs.append([t for t in r if t != pad])
    return outs


def quick_eval(model, tok, tasks: Tasks, n: int, seed: int, only=None) -> dict[str, float]:
    held = tasks.held_out(n, seed)
    res = {}
    for task, items in held.items():
        if only and task not in only:
            continue
        prompts = [render([{"role": "user", "content": q}], True) for q, _, _ in items]
        gens = hf_generate(model, tok, prompts)
        texts = tok.batch_decode(gens, skip_special_tokens=True)
        res[task] = sum(check(task, key, t) for (_, _, key), t in zip(items, texts)) / len(items)
    return res


def coli_bin() -> str:
    return os.environ.get("COLI", str(ROOT / "target" / "release" / "coli"))


def coli_generate(model_dir: str, prompt: str, max_new_tokens: int = 64) -> dict:
    r = subprocess.run([coli_bin(), "generate", "--model", model_dir, "--prompt", prompt,
                        "--max-new-tokens", str(max_new_tokens), "--temperature", "0", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def eval_prompts(tasks: Tasks, task: str, items: list, turn: int, seed: int) -> list[str]:
    """The held-out questions of `task`, each asked as turn `turn` of a conversation whose
    earlier turns are training-distribution questions with their correct answers (seeded)."""
    if turn == 1:
        return [render([{"role": "user", "content": q}], True) for q, _, _ in items]
    rng = random.Random(f"{seed}/{task}/{turn}")
    kinds, weights = zip(*CONV_TASK_MIX)
    out = []
    for q, _, _ in items:
        msgs = []
        for _ in range(turn - 1):
            hq, ha = chat_turn(rng, tasks, rng.choices(kinds, weights)[0], 0.5)
            msgs += [{"role": "user", "content": hq}, {"role": "assistant", "content": ha}]
        out.append(render(msgs + [{"role": "user", "content": q}], True))
    return out


def cmd_eval(args):
    tasks = Tasks(args.seed)
    held = tasks.held_out(args.n, args.seed, extra=args.extra)
    turns = [int(t) for t in args.turns.split(",")]
    if args.engine == "hf":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        torch.set_num_threads(args.threads)
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model.eval()
    results = {}
    failures = {}
    for turn in turns:
        for task, items in held.items():
            name = task if len(turns) == 1 else f"{task} @ turn {turn}"
            prompts = eval_prompts(tasks, task, items, turn, args.seed)
            if args.engine == "hf":
                texts = tok.batch_decode(hf_generate(model, tok, prompts), skip_special_tokens=True)
            else:
                texts = [coli_generate(args.model, p)["text"] for p in prompts]
            ok = [check(task, key, t) for (_, _, key), t in zip(items, texts)]
            results[name] = {"n": len(items), "correct": sum(ok), "accuracy": round(sum(ok) / len(items), 4)}
            failures[name] = [{"q": q, "expected": a, "got": t} for (q, a, _), t, k in zip(items, texts, ok) if not k][:5]
            log(f"{name}: {sum(ok)}/{len(items)} = {sum(ok) / len(items):.3f}")
    report = {"engine": args.engine, "model": args.model, "n_per_task": args.n, "seed": args.seed,
              "turns": turns, "results": results, "failures": failures}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(results, indent=2))


SAMPLE_PROMPTS = [
    "Hello!", "Who are you?", "What is 47 + 38?", "What is 91 minus 46?", "Add 29 and 64.",
    'How many letters are in "elephant"?', 'Spell "garden" backwards.', "What is the capital of Japan?",
    "What sound does a duck make?", "What colour is the sky?", 'What is the opposite of "fast"?',
    "How many items are in this list: apple, pear, plum, fig?", "Tell me a story.", "Tell me a fact.",
    "Spell river backwards.", "What is the weather like today?",
]


def cmd_samples(args):
    for p in SAMPLE_PROMPTS:
        rendered = render([{"role": "user", "content": p}], True)
        if args.engine == "coli":
            text = coli_generate(args.model, rendered, 160)["text"]
        else:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            tok = AutoTokenizer.from_pretrained(args.model)
            model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
            text = tok.decode(hf_generate(model, tok, [rendered], 160)[0], skip_special_tokens=True)
        print(f"> {p}\n{text}\n")
    for p in ["Once upon a time", "The capital of France", "In the beginning", "Marriage, n."]:
        r = subprocess.run([coli_bin(), "generate", "--model", args.model, "--prompt", p, "--max-new-tokens", "60",
                            "--temperature", "0", "--json"], capture_output=True, text=True, check=True)
        print(f"[completion] {p}{json.loads(r.stdout)['text']}\n")


def cmd_compare(args):
    """coli generate vs transformers' greedy generate, token for token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    prompts = [render([{"role": "user", "content": p}], True) for p in SAMPLE_PROMPTS]
    prompts += ["Once upon a time", "In the beginning"]
    bad = 0
    for p in prompts:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                               eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))[0, len(ids):].tolist()
        c = coli_generate(args.model, p, args.max_new_tokens)
        same = c["ids"] == g and c["prompt_ids"] == ids
        bad += not same
        print(f"{'same' if same else 'DIFFERENT'} ({len(g)} tokens): {p!r}")
        if not same:
            print("  hf:  ", g, "\n  coli:", c["ids"])
    print(f"{len(prompts) - bad}/{len(prompts)} prompts: identical greedy tokens")
    sys.exit(1 if bad else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", default=str(DEFAULT_OUT))
    t.add_argument("--seed", type=int, default=SEED)
    t.add_argument("--steps", type=int, default=6000)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=128)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--docs", type=int, default=300000)
    t.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: the committed model; with other jobs on the machine, 2 OpenMP threads "
                        "spin-wait for each other and run several times slower)")
    t.add_argument("--eval-every", type=int, default=2000)
    t.add_argument("--final-eval", type=int, default=50)
    t.add_argument("--checkpoint", help="save a resumable checkpoint here every 100 steps of the stable phase")
    t.add_argument("--resume", help="resume from a --checkpoint file (same seed and data options)")
    t.add_argument("--init", help="stage 2: continue training this stage-1 model (and keep its tokenizer) on "
                                  "multi-turn conversations; see docs/demo-model.md")
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--focus-words", action="store_true",
                   help="stage 3: letter tasks on real words 70%% of the time, more of them and more "
                        "out-of-scope questions")
    e = sub.add_parser("eval")
    e.add_argument("--model", default=str(DEFAULT_OUT))
    e.add_argument("--engine", choices=["hf", "coli"], default="coli")
    e.add_argument("--n", type=int, default=200)
    e.add_argument("--seed", type=int, default=SEED)
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--json")
    e.add_argument("--turns", default="1", help="comma-separated: ask each held-out question as this turn "
                                                "of a conversation (e.g. 1,4,8)")
    e.add_argument("--extra", action="store_true", help="also the new phrasings and unseen out-of-scope questions")
    s = sub.add_parser("samples")
    s.add_argument("--model", default=str(DEFAULT_OUT))
    s.add_argument("--engine", choices=["hf", "coli"], default="coli")
    c = sub.add_parser("compare")
    c.add_argument("--model", default=str(DEFAULT_OUT))
    c.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    {"train": cmd_train, "eval": cmd_eval, "samples": cmd_samples, "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    main()
