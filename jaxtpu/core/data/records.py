"""What an input file holds once read: `Comments` (labelled or to score) and ranking `Pairs`,
the `Groups` a metric breaks scores down by, the texts read only when needed (`FileTexts`), and
the column names of the Jigsaw files (framework-free)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from jaxtpu.core.breakdowns import BREAKDOWNS
from jaxtpu.core.data.tokens import digest_pairs, digest_texts
from jaxtpu.core.tasks import LABELS, SEVERITY_WEIGHTS
from jaxtpu.core.textformat import COMMENT

SUBLABELS = LABELS[1:]  # ("severe_toxic", "obscene", "threat", "insult", "identity_hate")


CLASSIFICATION_COLUMNS = ("comment_text", "toxic")


PAIRS_COLUMNS = ("less_toxic", "more_toxic")


SCORE_COLUMNS = ("comment_id", "text")


# The comment's column: `content` is the Multilingual competition's test.csv name for it.
TEXT_COLUMNS = ("comment_text", "content")


# The identities of the Unintended Bias metric (the competition's own list), fractions of
# raters, blank where the comment was not annotated.
IDENTITIES = (
    "male",
    "female",
    "homosexual_gay_or_lesbian",
    "christian",
    "jewish",
    "muslim",
    "black",
    "white",
    "psychiatric_or_mental_illness",
)


LANG_COLUMN = "lang"  # the Multilingual competition's language of each comment


# Agile Community Rules (2025): a comment (`body`) and a subreddit rule, whether the comment
# breaks it (`rule_violation`, 0/1; absent from the test file), the row's id, and two
# comments that break the rule and two that do not as examples.
RULES_COLUMNS = ("body", "rule")
RULE_LABEL = "rule_violation"
RULE_ID = "row_id"
RULE_EXAMPLES = {
    "positive_example_1": 1.0,
    "positive_example_2": 1.0,
    "negative_example_1": 0.0,
    "negative_example_2": 0.0,
}


@dataclass(frozen=True)
class NumberColumn:
    """A numeric column a run asks a file for beyond the Jigsaw ones (a row weight, an
    auxiliary target): which flag asked, whether a blank is allowed (NaN) and the range, and
    whether a file without the column is refused (else every value is blank); a `time`
    column holds ISO 8601 times (or numbers), read as seconds since the epoch in float64."""

    flag: str
    blank_ok: bool
    lo: float
    hi: float = float("inf")
    required: bool = True
    time: bool = False

    @property
    def dtype(self) -> Any:
        return np.float64 if self.time else np.float32


@dataclass
class Groups:
    """What a file says about each comment besides its labels, for the metrics that break
    the score down by it (never a model input): the Unintended Bias identities, the
    Multilingual language and the Agile Community Rules rule."""

    identities: dict[str, np.ndarray] = field(default_factory=dict)  # (N,) float32, NaN blank
    lang: np.ndarray | None = None  # (N,) str
    rule: np.ndarray | None = None  # (N,) str: the rule a rules row asks about

    def __bool__(self) -> bool:
        return any(b.values(self) is not None for b in BREAKDOWNS)

    def describe(self) -> str:
        """'identities male, female; languages es, it' (those the file has)."""
        shown = [b.shown(b.values(self)) for b in BREAKDOWNS if b.values(self) is not None]
        return "; ".join(shown)

    def take(self, idx: np.ndarray) -> Groups:
        """The groups of rows `idx`, every breakdown's field taken alike."""
        taken = {}
        for b in BREAKDOWNS:
            values = getattr(self, b.field)
            if isinstance(values, dict):
                taken[b.field] = {k: v[idx] for k, v in values.items()}
            else:
                taken[b.field] = None if values is None else values[idx]
        return Groups(**taken)


class FileTexts(Sequence[str]):
    """Rows of a file's comments that are read from the file only when first needed: a run
    whose tokens are all in the cache never reads them (`read_task_file` with a cache). `load`
    gives every kept row's text; the subsets of one file share what it read."""

    def __init__(self, load: Callable[[], Sequence[str]], rows: np.ndarray) -> None:
        self.load, self.rows = load, rows

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        texts = self.load()
        if isinstance(i, slice):
            return [texts[r] for r in self.rows[i].tolist()]
        return texts[int(self.rows[i])]

    def __iter__(self) -> Iterator[str]:
        texts = self.load()
        return (texts[r] for r in self.rows.tolist())

    def take(self, idx: np.ndarray) -> FileTexts:
        return FileTexts(self.load, self.rows[idx])


def take_texts(texts: Sequence[str], idx: np.ndarray) -> Sequence[str]:
    if isinstance(texts, FileTexts):
        return texts.take(idx)
    return [texts[i] for i in idx]


@dataclass
class Comments:
    """Labelled (or, for scoring, unlabelled) comments from one file."""

    source: str
    texts: Sequence[str]  # a list, or `FileTexts` read when needed
    labels: np.ndarray | None  # (N,) float32 in [0, 1]
    sublabels: np.ndarray | None = None  # (N, 5) float32, NaN where blank
    ids: list[str] = field(default_factory=list)
    dropped: int = 0
    groups: Groups = field(default_factory=Groups)
    folds: np.ndarray | None = None  # (N,) int64: the file's --fold-column
    digests: np.ndarray | None = None  # (N, 16) uint8 `digest_texts`, made when first asked
    # the `NumberColumn`s a run asked for: name -> (N,) float32, NaN where blank
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    # text pairs (the rules task) or prompts: each row's first item, before `texts[i]` (a
    # `--rule-template` text, or a `prompts.Message`); None: one text
    first: Sequence[Any] | None = None
    # which (`jaxtpu.core.textformat`): COMMENT (no first), PAIR or PROMPT, set by the reader
    # that rendered `first`; the tokenizer reads this, never the items' types
    form: str = COMMENT

    def __len__(self) -> int:
        return len(self.texts)

    def text_digests(self) -> np.ndarray:
        """`digest_texts` of each row's text, or of its pair (`digest_pairs`)."""
        if self.digests is None:
            self.digests = (
                digest_texts(self.texts)
                if self.first is None
                else digest_pairs(self.first, self.texts)
            )
        return self.digests

    def encoded(self) -> Sequence[Any]:
        """What the tokenizer encodes (in `form`): each row's text, or its (first, text)."""
        if self.first is None:
            return self.texts
        return list(zip(self.first, self.texts, strict=True))

    def subset(self, idx: np.ndarray) -> Comments:
        return Comments(
            self.source,
            take_texts(self.texts, idx),
            None if self.labels is None else self.labels[idx],
            None if self.sublabels is None else self.sublabels[idx],
            [self.ids[i] for i in idx] if self.ids else [],
            groups=self.groups.take(idx),
            folds=None if self.folds is None else self.folds[idx],
            digests=None if self.digests is None else self.digests[idx],
            columns={k: v[idx] for k, v in self.columns.items()},
            first=None if self.first is None else take_texts(self.first, idx),
            form=self.form,
        )

    def severity(self) -> np.ndarray:
        """Weighted sum of the six labels; rows with blank sub-labels use `toxic` alone."""
        assert self.labels is not None
        sev = self.labels * SEVERITY_WEIGHTS[0]
        if self.sublabels is not None:
            sub = self.sublabels
            complete = ~np.isnan(sub).any(axis=1)
            sev = sev + np.where(complete, np.nan_to_num(sub) @ SEVERITY_WEIGHTS[1:], 0.0)
        return sev.astype(np.float32)


@dataclass
class Pairs:
    """Ranking pairs: `more[i]` is more toxic than `less[i]`."""

    source: str
    less: Sequence[str]  # lists, or `FileTexts` read when needed
    more: Sequence[str]
    dropped: int = 0
    folds: np.ndarray | None = None  # (N,) int64: the file's --fold-column
    digests: np.ndarray | None = None  # (N, 2, 16) uint8: less, more; made when first asked
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # as `Comments.columns`

    def __len__(self) -> int:
        return len(self.less)

    def text_digests(self) -> np.ndarray:
        if self.digests is None:
            self.digests = np.stack([digest_texts(self.less), digest_texts(self.more)], 1)
        return self.digests

    def subset(self, idx: np.ndarray) -> Pairs:
        return Pairs(
            self.source,
            take_texts(self.less, idx),
            take_texts(self.more, idx),
            folds=None if self.folds is None else self.folds[idx],
            digests=None if self.digests is None else self.digests[idx],
            columns={k: v[idx] for k, v in self.columns.items()},
        )
