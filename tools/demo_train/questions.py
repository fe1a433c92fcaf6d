"""The synthetic chat tasks' phrasings, small talk, out-of-scope questions, and the
worked answers (column arithmetic, spelling)."""

from __future__ import annotations

import random

from .prose import *  # noqa: F401,F403
from .tables import *  # noqa: F401,F403


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
