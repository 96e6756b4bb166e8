"""The fixture pair's text: the templates its corpus, its bundled prompts and its users' prompts come from.

``scripts/build_fixture.py`` trained the fixture target on documents these templates write (``chat``,
``code``, ``math``, ``records``) and cut its bundled prompts from fresh documents at natural points
(after ``Assistant:`` in a chat, before a newline elsewhere) to 20-120 tokens. The same recipe, with
another seed, is what a user of the fixture pair sends, so the suite draws its held-out prompts for the
pair here (:mod:`ddtree_conformance.held_out`): their distribution is the users' own, published in this
file, and only the run's seed picks which ones.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

__all__ = [
    "CATEGORIES",
    "GENERATORS",
    "PROMPT_MIN_TOKENS",
    "PROMPT_MAX_TOKENS",
    "cut_points",
    "prompt_cuts",
    "draw_prompt",
]

CATEGORIES = ("chat", "code", "math", "records")
PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS = 20, 120


# --------------------------------------------------------------------------------------------
# Word lists (written for this project). Order matters: earlier items are drawn more often.
# --------------------------------------------------------------------------------------------

FIRST = (
    "Ada Ben Cleo Dan Eva Finn Gus Hana Ivo Jade Kai Lena Milo Nora Omar Pia Quin Rosa Sam Tara Uma "
    "Vik Wren Yara Zane Alba Boris Cora Dion Elsa Femi Gita Hugo Iris Jon Kira Luca Maya Nils Olga"
).split()
LAST = (
    "Stone Park Reed Hale Moss Frost Lane Cole Wade Bloom Marsh Dale Shaw Vance Pike Grant Hart "
    "Quill Rowe Sage Thorn Voss West Yates Brook Finch Gray Holt"
).split()
CITIES = (
    "Oslo Lund Porto Turin Ghent Cork Bern Graz Brno Lyon Nice Bonn Kiel Riga Split Malmo Aarhus "
    "Delft Basel Leeds York Bath Pisa Siena Tartu Vigo"
).split()
TOPICS = [
    "gardening",
    "chess",
    "baking bread",
    "running",
    "painting",
    "birdwatching",
    "cycling",
    "knitting",
    "photography",
    "hiking",
    "sailing",
    "pottery",
    "astronomy",
    "journaling",
    "cooking soup",
    "learning Spanish",
    "playing piano",
    "camping",
    "fishing",
    "swimming",
    "reading poetry",
    "building kites",
    "making tea",
    "yoga",
    "rock climbing",
    "woodworking",
    "drawing maps",
    "fixing radios",
    "board games",
    "dancing",
]
ADJ = (
    "calm useful fun slow relaxing tricky rewarding simple social quiet cheap healthy creative "
    "popular old flexible patient bright gentle steady"
).split()
TIMES = ["morning", "evening", "afternoon", "weekend", "winter", "summer", "spring", "autumn"]
PLACES = [
    "the park",
    "the garden",
    "a small club",
    "the library",
    "the kitchen",
    "the coast",
    "a quiet room",
    "the city centre",
    "the hills",
    "a community hall",
]
PEOPLE = ["friends", "family", "neighbours", "a coach", "a teacher", "a partner", "colleagues", "kids"]
THINGS = [
    "a notebook",
    "good shoes",
    "a timer",
    "a map",
    "a warm coat",
    "a sketch pad",
    "a flask",
    "a small bag",
    "a lamp",
    "a pencil",
    "a chair",
    "a pair of gloves",
]
GREETINGS = ["Hi!", "Hello.", "Hey there.", "Good morning.", "Quick question.", "Hi again."]
FEELINGS = ["curious", "unsure", "excited", "tired", "busy", "nervous", "happy", "bored"]
VERBS = ["enjoy", "practise", "try", "learn", "share", "plan", "study", "teach"]

NOUNS = (
    "user order item point book task note file event city score price track photo ticket "
    "plant route sensor recipe invoice"
).split()
FIELDS = (
    "name size count color price weight owner status title level width height speed label "
    "kind total index value start end"
).split()
CODE_VERBS = ["filter", "select", "collect", "find", "keep", "drop", "count", "group"]
OPS = [">", "<", ">=", "<=", "=="]
ITEMS = ["apples", "pens", "books", "cups", "stamps", "shells", "coins", "cards", "eggs", "beads"]
CONTAINERS = ["boxes", "bags", "jars", "baskets", "crates", "trays"]
TAGS = "red blue green tea music sport travel food art news garden science".split()


def _zipf(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


class Slots:
    """Zipf-weighted choices; within one document a slot prefers values it has not used yet."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: dict[str, set[int]] = {}

    def __call__(self, name: str, items, fresh: bool = True, order_key: int = 0):
        used = self.used.setdefault(name, set())
        n = len(items)
        # A per-document key rotates the preference order, so the most likely value depends on
        # context (a topic prefers its own adjectives) rather than being one global favourite.
        order = [(i + order_key) % n for i in range(n)]
        candidates = [(rank, i) for rank, i in enumerate(order) if not (fresh and i in used)]
        if not candidates:
            candidates = list(enumerate(order))
        weights = [1.0 / (rank + 1) for rank, _ in candidates]
        _, index = self.rng.choices(candidates, weights=weights)[0]
        used.add(index)
        return items[index]

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


# --------------------------------------------------------------------------------------------
# Document generators
# --------------------------------------------------------------------------------------------


def gen_chat(rng: random.Random) -> str:
    s = Slots(rng)
    topic = s("topic", TOPICS)
    key = TOPICS.index(topic)
    name = s("first", FIRST)
    turns = []
    user_lines = [
        lambda t: f"{s('greet', GREETINGS)} I am {s('feel', FEELINGS, order_key=key)} about {t}. What do you think?",
        lambda t: f"Can you tell me why {t} is {s('adj', ADJ, order_key=key)}?",
        lambda t: f"My name is {name}. How do I start with {t}?",
        lambda t: f"What should I bring for {t} in the {s('time', TIMES, order_key=key)}?",
        lambda t: f"Is {t} better than {s('topic', TOPICS)}?",
        lambda t: f"Any tips for {t} with {s('people', PEOPLE, order_key=key)}?",
    ]
    answers = [
        lambda t: f"{t.capitalize()} is {s('adj', ADJ, order_key=key)} and {s('adj', ADJ, order_key=key)}.",
        lambda t: f"Many people {s('verb', VERBS)} {t} in the {s('time', TIMES, order_key=key)}.",
        lambda t: f"You could start in {s('place', PLACES, order_key=key)} with {s('people', PEOPLE, order_key=key)}.",
        lambda t: f"Bring {s('thing', THINGS, order_key=key)} and {s('thing', THINGS, order_key=key)}.",
        lambda t: f"If you like {t}, you might also like {s('topic', TOPICS)}.",
        lambda t: f"Give it {s.int(2, 9)} weeks and it gets {s('adj', ADJ, order_key=key)}.",
        lambda t: f"{name}, try {s.int(10, 40)} minutes a day, no more.",
        lambda t: f"The hardest part is staying {s('adj', ADJ, order_key=key)}.",
        lambda t: f"A friend of mine from {s('city', CITIES)} does it every {s('time', TIMES, order_key=key)}.",
        lambda t: f"Honestly, it is more {s('adj', ADJ, order_key=key)} than it looks.",
    ]
    for turn in range(rng.randint(4, 7)):
        t = topic if turn == 0 or rng.random() < 0.6 else s("topic", TOPICS)
        turns.append("User: " + rng.choices(user_lines, weights=_zipf(len(user_lines), 0.7))[0](t))
        n = rng.randint(2, 4)
        picked = rng.sample(range(len(answers)), n)
        first = rng.choice(["Sure.", "Good question.", "Well,", "Great.", "Okay."])
        turns.append("Assistant: " + first + " " + " ".join(answers[i](t) for i in picked))
    return "\n".join(turns) + "\n"


def _cap(word: str) -> str:
    return word[0].upper() + word[1:]


def gen_code(rng: random.Random) -> str:
    s = Slots(rng)
    parts = []
    classes: list[tuple[str, list[str]]] = []
    for _ in range(rng.randint(3, 5)):
        kind = rng.choices(["class", "filter", "total", "table", "test"], weights=[4, 3, 2, 1, 2])[0]
        noun = s("noun", NOUNS)
        if kind == "class" or (kind == "test" and not classes):
            fields = [s("field:" + noun, FIELDS, order_key=NOUNS.index(noun)) for _ in range(rng.randint(2, 5))]
            cls = _cap(noun)
            lines = [f"class {cls}:", f"    def __init__(self, {', '.join(fields)}):"]
            lines += [f"        self.{f} = {f}" for f in fields]
            lines += ["", "    def to_dict(self):"]
            lines += ["        return {" + ", ".join(f'"{f}": self.{f}' for f in fields) + "}"]
            if rng.random() < 0.6:
                lines += ["", "    def __repr__(self):"]
                inner = ", ".join(f"{f}={{self.{f}!r}}" for f in fields)
                lines += [f'        return f"{cls}({inner})"']
            classes.append((cls, fields))
            parts.append("\n".join(lines))
        elif kind == "filter":
            verb, field, op, limit = s("verb", CODE_VERBS), s("f", FIELDS), rng.choice(OPS), s.int(0, 99)
            lines = [
                f"def {verb}_{noun}s({noun}s, limit={limit}):",
                f'    """{_cap(verb)} the {noun}s whose {field} is {op} limit."""',
                "    result = []",
                f"    for {noun} in {noun}s:",
                f"        if {noun}.{field} {op} limit:",
                f"            result.append({noun})",
                "    return result",
            ]
            parts.append("\n".join(lines))
        elif kind == "total":
            field = s("f", FIELDS)
            lines = [
                f"def total_{field}({noun}s):",
                "    total = 0",
                f"    for {noun} in {noun}s:",
                f"        total += {noun}.{field}",
                "    return total",
            ]
            parts.append("\n".join(lines))
        elif kind == "table":
            keys = [s("city", CITIES).lower() for _ in range(rng.randint(3, 6))]
            start = s.int(0, 20)
            lines = [f"{noun.upper()}_CODES = {{"]
            lines += [f'    "{k}": {start + i},' for i, k in enumerate(keys)]
            lines += ["}"]
            parts.append("\n".join(lines))
        else:
            cls, fields = classes[-1]
            var = cls.lower()
            values = [str(s.int(1, 99)) for _ in fields]
            lines = [f"def test_{var}():"]
            lines += [f"    {var} = {cls}({', '.join(values)})"]
            lines += [f"    assert {var}.{f} == {v}" for f, v in zip(fields, values)]
            lines += [f'    assert {var}.to_dict()["{fields[0]}"] == {values[0]}']
            parts.append("\n".join(lines))
    return "\n\n\n".join(parts) + "\n"


def gen_math(rng: random.Random) -> str:
    s = Slots(rng)
    parts = []
    for _ in range(rng.randint(4, 7)):
        kind = rng.choices(["table", "count", "problem", "add"], weights=[3, 2, 3, 2])[0]
        if kind == "table":
            a, b0 = s.int(2, 12), s.int(1, 4)
            b1 = min(12, b0 + s.int(5, 9))
            lines = [f"Table of {a}:"] + [f"{a} x {b} = {a * b}" for b in range(b0, b1 + 1)]
        elif kind == "count":
            d = rng.choice([1, 2, 5, 10])
            start = s.int(0, 400) // d * d
            terms = [start + d * i for i in range(s.int(8, 14))]
            lines = [f"Count by {d} from {start}: " + ", ".join(map(str, terms)) + "."]
        elif kind == "problem":
            name, item, box = s("first", FIRST), s("item", ITEMS), s("box", CONTAINERS)
            a, b, c = s.int(2, 12), s.int(2, 12), s.int(1, 9)
            lines = [
                f"Problem: {name} has {a} {box} with {b} {item} in each. {name} gives away {c} {item}. "
                f"How many {item} are left?",
                f"Solution: {a} x {b} = {a * b}. Then {a * b} - {c} = {a * b - c}. {name} has {a * b - c} {item} left.",
            ]
        else:
            a, b = s.int(1, 20), s.int(1, 20)
            lines = [f"Add {b}:"] + [f"{a + i} + {b} = {a + i + b}" for i in range(s.int(5, 9))]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def gen_records(rng: random.Random) -> str:
    s = Slots(rng)
    start = s.int(1, 900)
    lines = []
    if rng.random() < 0.6:
        for i in range(rng.randint(6, 9)):
            first, last = s("first", FIRST), s("last", LAST)
            rec = {
                "id": start + i,
                "name": f"{first} {last}",
                "user": f"{first.lower()}.{last.lower()}",
                "city": s("city", CITIES),
                "age": s.int(18, 70),
                "active": rng.random() < 0.7,
            }
            if rng.random() < 0.5:
                rec["tags"] = [s("tag", TAGS) for _ in range(rng.randint(1, 3))]
            lines.append(json.dumps(rec))
    else:
        lines.append("id,name,user,city,score")
        for i in range(rng.randint(9, 13)):
            first, last = s("first", FIRST), s("last", LAST)
            user = f"{first.lower()}_{last.lower()}"
            lines.append(f"{start + i},{first} {last},{user},{s('city', CITIES)},{s.int(0, 100)}")
    return "\n".join(lines) + "\n"


GENERATORS = {"chat": gen_chat, "code": gen_code, "math": gen_math, "records": gen_records}


def cut_points(category: str, text: str) -> list[int]:
    if category == "chat":
        marker = "Assistant:"
        return [i + len(marker) for i in range(len(text)) if text.startswith(marker, i)]
    return [i for i, ch in enumerate(text) if ch == "\n" and i > 0]  # cut before a newline


def prompt_cuts(category: str, doc: str, encode: Callable[[str], list[int]]) -> list[tuple[str, list[int]]]:
    """The prompts one document gives: its text up to each natural cut point, with ids, where the ids
    are 20-120 tokens and start the document's own tokenization (no token straddles the cut)."""
    ids = encode(doc)
    cuts = []
    for cut in cut_points(category, doc):
        text = doc[:cut]
        pids = encode(text)
        if PROMPT_MIN_TOKENS <= len(pids) <= PROMPT_MAX_TOKENS and pids == ids[: len(pids)]:
            cuts.append((text, pids))
    return cuts


def draw_prompt(
    rng: random.Random, encode: Callable[[str], list[int]], categories: Sequence[str] = CATEGORIES
) -> tuple[str, str, list[int]]:
    """One prompt as a user of the fixture pair writes it: a category, a fresh document of it, one of
    its cuts (``(category, text, ids)``), everything drawn from ``rng``."""
    category = rng.choice(list(categories))
    while True:
        doc = GENERATORS[category](rng)
        cuts = prompt_cuts(category, doc, encode)
        if cuts:
            text, ids = rng.choice(cuts)
            return category, text, ids
