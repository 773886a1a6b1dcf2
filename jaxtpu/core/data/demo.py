"""The data a run has without a file: the packaged 2,000 real comments (`--train-csv sample`)
and generated demo comments with a learnable signal (framework-free)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxtpu.core.data.records import SUBLABELS, Comments

# The default run's 2,000 real comments (`--train-csv sample`; source and licence beside it).
SAMPLE_CSV = Path(__file__).with_name("sample") / "jigsaw_sample.csv"


_NEUTRAL = (
    "thanks for the edit on the article",
    "i added a citation to the history section",
    "please see the talk page before reverting",
    "the infobox needs a better image",
    "welcome to wikipedia and happy editing",
    "this source looks reliable to me",
    "can you check the dates in the timeline",
    "i moved the paragraph to the right section",
    "good point, i agree with the merge",
    "the map is out of date after the election",
)


_TOXIC = ("idiot", "stupid", "moron", "loser", "pathetic", "dumb")


_OBSCENE = ("crap", "damn", "sucks")


_THREAT = ("i will hurt you", "watch your back")


def demo_comments(n: int, seed: int = 0) -> Comments:
    """A built-in dataset in the Jigsaw schema with an easy, learnable signal.

    About 30 % of comments insult the reader; their sub-labels follow the words used, so
    severity (for ranking pairs) is learnable too.
    """
    rng = np.random.default_rng(seed)
    texts, labels, subs = [], [], []
    for _ in range(n):
        base = _NEUTRAL[rng.integers(len(_NEUTRAL))]
        toxic = rng.random() < 0.3
        sub = [0.0] * len(SUBLABELS)
        if toxic:
            words = [f"you are a {_TOXIC[rng.integers(len(_TOXIC))]}"]
            sub[SUBLABELS.index("insult")] = 1.0
            if rng.random() < 0.4:
                words.append(_OBSCENE[rng.integers(len(_OBSCENE))])
                sub[SUBLABELS.index("obscene")] = 1.0
            if rng.random() < 0.2:
                words.append(_THREAT[rng.integers(len(_THREAT))])
                sub[SUBLABELS.index("threat")] = 1.0
                sub[SUBLABELS.index("severe_toxic")] = 1.0
            text = f"{base}, {' and '.join(words)}"
        else:
            text = base
        texts.append(text)
        labels.append(float(toxic))
        subs.append(sub)
    return Comments("demo", texts, np.asarray(labels, np.float32), np.asarray(subs, np.float32))


def sample_comments(n: int) -> list[str]:
    """The first `n` comments of the packaged sample (`SAMPLE_CSV`), whitespace collapsed."""
    import csv

    with open(SAMPLE_CSV, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f)
        return [" ".join(r["comment_text"].split()) for r, _ in zip(rows, range(n), strict=False)]
