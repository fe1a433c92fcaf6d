"""General English: stories and fact sentences from a small grammar, and public-domain
prose read from Debian packages (the King James Bible, The Devil's Dictionary)."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

from .tables import *  # noqa: F401,F403


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
