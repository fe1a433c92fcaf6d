"""Word lists and fact tables the tasks and stories draw from."""

from __future__ import annotations



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
