"""Hard-coded lexicon of the toy world.

Every content word belongs to exactly one topic and one category, and every
surface form is unique across the whole lexicon (except invariant nouns such
as ``fish`` whose singular and plural forms coincide).  That uniqueness makes
documents parseable by simple look-up (see :func:`dsl_llada.toy.world.analyze_document`).

Nouns are ``(singular, plural)`` pairs; verbs are ``(third_person_singular,
base)`` pairs, so ``the dog runs`` / ``the dogs run``.
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------- special
BOS: Final = "<|startoftext|>"
EOS: Final = "<|endoftext|>"  # also the padding token
EOT: Final = "<|eot_id|>"
START_HEADER: Final = "<|start_header_id|>"
END_HEADER: Final = "<|end_header_id|>"
MASK: Final = "<|mdm_mask|>"
UNK: Final = "[UNK]"

#: Special tokens in vocabulary order (they are appended after the words).
SPECIAL_TOKENS: Final = (UNK, BOS, EOS, EOT, START_HEADER, END_HEADER, MASK)

ROLE_WORDS: Final = ("user", "assistant")

# ---------------------------------------------------------------- function words
PUNCT: Final = (".", ",", ":")
SINGULAR_DETS: Final = ("the", "a", "an", "this")
PLURAL_DETS: Final = ("the", "some", "these", "many")
PRONOUNS: Final = {"sg": "it", "pl": "they"}
OPENERS: Final = ("today", "then", "later", "sometimes", "often", "suddenly")
GENERAL_ADJECTIVES: Final = (
    "big", "small", "old", "young", "quiet", "happy", "empty", "angry",
)
CONJUNCTIONS: Final = ("and",)
PROMPT_WORDS: Final = ("write", "about", "tell", "me", "describe", "short", "story", "summarize")

# ---------------------------------------------------------------------- topics
#: topic name -> the phrase used in prompts ("write about the ocean .").
TOPIC_PHRASES: Final = {
    "ocean": "the ocean",
    "forest": "the forest",
    "city": "the city",
    "farm": "the farm",
    "kitchen": "the kitchen",
    "space": "space",
    "school": "the school",
    "garden": "the garden",
}

TOPIC_NOUNS: Final = {
    "ocean": [("whale", "whales"), ("shark", "sharks"), ("fish", "fish"), ("boat", "boats"),
              ("sailor", "sailors"), ("octopus", "octopuses")],
    "forest": [("fox", "foxes"), ("deer", "deer"), ("owl", "owls"), ("bear", "bears"),
               ("tree", "trees"), ("squirrel", "squirrels")],
    "city": [("taxi", "taxis"), ("bus", "buses"), ("driver", "drivers"), ("tower", "towers"),
             ("artist", "artists"), ("officer", "officers")],
    "farm": [("cow", "cows"), ("sheep", "sheep"), ("farmer", "farmers"), ("horse", "horses"),
             ("goat", "goats"), ("ox", "oxen")],
    "kitchen": [("cook", "cooks"), ("chef", "chefs"), ("pot", "pots"), ("knife", "knives"),
                ("oven", "ovens"), ("apple", "apples")],
    "space": [("star", "stars"), ("planet", "planets"), ("rocket", "rockets"),
              ("astronaut", "astronauts"), ("moon", "moons"), ("alien", "aliens")],
    "school": [("teacher", "teachers"), ("student", "students"), ("book", "books"),
               ("desk", "desks"), ("pencil", "pencils"), ("eraser", "erasers")],
    "garden": [("flower", "flowers"), ("bee", "bees"), ("rabbit", "rabbits"),
               ("gardener", "gardeners"), ("worm", "worms"), ("ant", "ants")],
}

TOPIC_INTRANSITIVE: Final = {
    "ocean": [("swims", "swim"), ("dives", "dive"), ("floats", "float"), ("sinks", "sink")],
    "forest": [("hides", "hide"), ("sleeps", "sleep"), ("grows", "grow"), ("howls", "howl")],
    "city": [("waits", "wait"), ("honks", "honk"), ("stops", "stop"), ("shines", "shine")],
    "farm": [("grazes", "graze"), ("rests", "rest"), ("moos", "moo"), ("runs", "run")],
    "kitchen": [("boils", "boil"), ("bakes", "bake"), ("burns", "burn"), ("cools", "cool")],
    "space": [("spins", "spin"), ("glows", "glow"), ("drifts", "drift"), ("explodes", "explode")],
    "school": [("studies", "study"), ("listens", "listen"), ("laughs", "laugh"), ("reads", "read")],
    "garden": [("blooms", "bloom"), ("buzzes", "buzz"), ("digs", "dig"), ("wilts", "wilt")],
}

TOPIC_TRANSITIVE: Final = {
    "ocean": [("chases", "chase"), ("bites", "bite"), ("pulls", "pull"), ("circles", "circle")],
    "forest": [("hunts", "hunt"), ("climbs", "climb"), ("watches", "watch"), ("smells", "smell")],
    "city": [("passes", "pass"), ("paints", "paint"), ("blocks", "block"), ("visits", "visit")],
    "farm": [("feeds", "feed"), ("pushes", "push"), ("carries", "carry"), ("kicks", "kick")],
    "kitchen": [("cuts", "cut"), ("stirs", "stir"), ("tastes", "taste"), ("washes", "wash")],
    "space": [("orbits", "orbit"), ("hits", "hit"), ("approaches", "approach"), ("scans", "scan")],
    "school": [("teaches", "teach"), ("opens", "open"), ("holds", "hold"), ("drops", "drop")],
    "garden": [("waters", "water"), ("picks", "pick"), ("plants", "plant"), ("eats", "eat")],
}

TOPIC_ADJECTIVES: Final = {
    "ocean": ["blue", "deep", "salty", "wet", "calm"],
    "forest": ["green", "dark", "wild", "tall", "mossy"],
    "city": ["busy", "noisy", "bright", "crowded", "modern"],
    "farm": ["muddy", "brown", "lazy", "fat", "hungry"],
    "kitchen": ["hot", "sweet", "fresh", "sharp", "warm"],
    "space": ["distant", "cold", "silver", "huge", "strange"],
    "school": ["smart", "clever", "careful", "curious", "eager"],
    "garden": ["pretty", "sunny", "yellow", "tiny", "lovely"],
}

ALL_TOPICS: Final = tuple(TOPIC_PHRASES)

#: Prompt templates of the open-ended task; ``{topic}`` is a topic phrase.
OPEN_TEMPLATES: Final = (
    "write about {topic} .",
    "tell me about {topic} .",
    "describe {topic} .",
    "write a short story about {topic} .",
)
SUMMARY_PREFIX: Final = "summarize :"


def starts_with_vowel(word: str) -> bool:
    """Orthographic a/an rule used by the world (no exceptions in this lexicon)."""
    return word[:1] in "aeiou"


def all_words() -> list[str]:
    """Every non-special word of the lexicon, in a fixed deterministic order."""
    out: list[str] = []
    seen: set[str] = set()

    def add(ws):
        for w in ws:
            if w not in seen:
                seen.add(w)
                out.append(w)

    add(PUNCT)
    add(SINGULAR_DETS + PLURAL_DETS)
    add(PRONOUNS.values())
    add(OPENERS)
    add(GENERAL_ADJECTIVES)
    add(CONJUNCTIONS)
    add(PROMPT_WORDS)
    add(ROLE_WORDS)
    for topic in ALL_TOPICS:
        add([topic])
        add(w for w in TOPIC_PHRASES[topic].split())
        add(w for pair in TOPIC_NOUNS[topic] for w in pair)
        add(w for pair in TOPIC_INTRANSITIVE[topic] for w in pair)
        add(w for pair in TOPIC_TRANSITIVE[topic] for w in pair)
        add(TOPIC_ADJECTIVES[topic])
    return out
