"""A text's word and character n-grams, as a readout reads them (framework-free; the standard
library and numpy).

`history fit-scale --readout --ngrams` reads an attribute out of the model's vector and, beside
it, out of the words of the comment itself: what a frozen vector blurs (a slur, a threat's
verb) a weight per n-gram keeps. Both the fit (`jaxtpu.core.data.history.readout`) and every
scorer (`jaxtpu.core.calibration.Readout`) compute a text's features with `features`, so a
comment is read the same way wherever it is scored.

A text's features: its lower-cased word 1- and 2-grams (words of two or more letters or
digits, as scikit-learn's default token pattern) and the character 2- to 5-grams of each
whitespace-separated word padded with a space on either side (as scikit-learn's `char_wb`),
of the text's first `MAX_CHARS` characters; each n-gram counted as 1 + log(count), the whole
divided by its Euclidean norm, so that a long comment weighs no more than a short one. A
readout keeps the `VOCABULARY` n-grams found in the most fitting comments (and in at least
`MIN_COMMENTS` of them); any other n-gram weighs nothing.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

MAX_CHARS = 10_000  # a comment's first 10,000 characters: a text bomb costs no more
VOCABULARY = 20_000  # n-grams a readout keeps a weight for
MIN_COMMENTS = 3  # an n-gram of fewer fitting comments is not learnt from
WORDS = re.compile(r"(?u)\b\w\w+\b")
CHARS = range(2, 6)


def text_of(item: Any) -> str:
    """The text a scorer was given for one row: a comment, or a pair's two texts joined (the
    rules task's rule and comment)."""
    if isinstance(item, tuple | list):
        return " ".join(str(x) for x in item)
    return str(item)


def counts(text: str) -> Counter[str]:
    """How often each n-gram occurs in `text` (word n-grams start with `w `, character
    n-grams with `c`)."""
    text = text[:MAX_CHARS].lower()
    words = WORDS.findall(text)
    out: Counter[str] = Counter(f"w {w}" for w in words)
    out.update(f"w {a} {b}" for a, b in zip(words, words[1:], strict=False))
    for word in text.split():
        padded = f" {word} "
        for n in CHARS:
            out.update("c" + padded[i : i + n] for i in range(len(padded) - n + 1))
    return out


def features(text: str) -> dict[str, float]:
    """`text`'s n-grams, each as 1 + log(count), divided by the norm of them all (an empty
    text: none)."""
    raw = {g: 1.0 + math.log(c) for g, c in counts(text).items()}
    norm = math.sqrt(sum(v * v for v in raw.values()))
    return {g: v / norm for g, v in raw.items()} if norm else {}


def vocabulary(
    each: Sequence[dict[str, float]], size: int = VOCABULARY, least: int = MIN_COMMENTS
) -> list[str]:
    """The `size` n-grams of the most texts among `each` (texts' `features`), each of at
    least `least` of them; ties in order of the n-grams themselves, so the same texts always
    give the same vocabulary."""
    seen: Counter[str] = Counter()
    for f in each:
        seen.update(f.keys())
    common = sorted((g for g, n in seen.items() if n >= least), key=lambda g: (-seen[g], g))
    return common[:size]


def indexed(f: dict[str, float], index: dict[str, int]) -> tuple[list[int], list[float]]:
    """Of a text's `features`, those in a vocabulary (`index`: each n-gram's position): their
    positions and values. The fit's design matrix and a scorer's readout both read a text so."""
    known = [(index[g], v) for g, v in f.items() if g in index]
    return [i for i, _ in known], [v for _, v in known]
