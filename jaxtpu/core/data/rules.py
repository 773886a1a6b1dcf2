"""The Agile Community Rules competition's data beyond its rows: the examples every row carries
as training rows (`--rule-examples`, test-time training on a test file's examples) and the
validation split by whole rules (`--holdout-rules`) (framework-free)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxtpu.core import storage
from jaxtpu.core.data.readers import columns, rule_examples
from jaxtpu.core.data.records import RULE_ID, RULE_LABEL, Comments, Groups
from jaxtpu.core.data.tables import open_table
from jaxtpu.core.data.templates import PromptTemplate, RuleTemplate, template_of
from jaxtpu.core.data.tokenized import Examples, encode
from jaxtpu.core.errors import DataError
from jaxtpu.core.flags.schema import Config

log = logging.getLogger(__name__)


@dataclass
class ExampleCount:
    """What `--rule-examples` made of its files' examples."""

    found: int = 0  # example texts in the files
    added: int = 0  # training rows made of them
    duplicates: int = 0  # examples that repeated a (rule, text) already counted
    conflicts: int = 0  # (rule, text)s labelled both ways, resolved by majority vote
    ties: int = 0  # of those, as many votes each way: dropped
    validation: int = 0  # (rule, text)s that are validation rows: left out
    held_out: int = 0  # (rule, text)s of a rule held out for validation (--holdout-rules)

    def describe(self) -> str:
        return (
            f"{self.added} training rows from {self.found} examples: {self.duplicates} "
            f"duplicates merged, {self.conflicts} conflicting labels resolved by majority vote "
            f"({self.ties} ties dropped), {self.validation} left out as validation rows"
            + (f", {self.held_out} left out as examples of held-out rules" if self.held_out else "")
        )


def example_rows(
    paths: Sequence[str | os.PathLike],
    template: RuleTemplate | PromptTemplate,
    valid: Comments | None,
    held_out: Sequence[str] = (),
) -> tuple[Comments, ExampleCount]:
    """The examples of every row of `paths` as labelled rules rows: each
    `positive_example_*` a row labelled 1 and each `negative_example_*` one labelled 0, for the
    rule of the row it came from.

    One row per (rule, text): the subreddit is not part of the key (the same comment under the
    same rule is one example wherever it was posted). A (rule, text) given with both labels
    takes the label most of its occurrences give; a tie is dropped, since neither label is
    known. A (rule, text) that is a validation row (`valid`) is left out, so validation stays
    unseen, and so is every example of a rule in `held_out` (--holdout-rules: the validation
    must be of rules the model never saw). The first text of the pair is `template` over the
    columns of the first row the example was found in.
    """
    votes: dict[tuple[str, str], list[float]] = {}
    rows: dict[tuple[str, str], dict] = {}
    count = ExampleCount()
    valid_ids = set(valid.ids) - {""} if valid is not None else set()
    for path in paths:
        header = columns(path)
        template.check(path, header)
        if RULE_LABEL not in header and valid_ids:
            found = _shared_ids(path, valid_ids)
            if found:
                raise DataError(
                    f"--rule-examples {path}: {found} of its {RULE_ID}s are validation rows' "
                    "ids: validate on labelled rows that are not the test file's"
                )
        for rule, text, label, row in rule_examples(path):
            count.found += 1
            key = (rule, text)
            if key in votes:
                count.duplicates += 1
            else:
                rows[key] = row
            votes.setdefault(key, []).append(label)
    seen = set()
    if valid is not None and valid.groups.rule is not None:
        seen = set(zip(valid.groups.rule.tolist(), valid.texts, strict=True))
    keys, labels = [], []
    held = set(held_out)
    for key, given in votes.items():
        if key in seen:
            count.validation += 1
            continue
        if key[0] in held:
            count.held_out += 1
            continue
        positive = sum(given)
        if 0 < positive < len(given):
            count.conflicts += 1
            if positive * 2 == len(given):
                count.ties += 1
                continue
        keys.append(key)
        labels.append(float(positive * 2 > len(given)))
    if not keys:
        raise DataError(
            f"--rule-examples {', '.join(map(str, paths))}: no example is left to train on "
            f"({count.describe()})"
        )
    count.added = len(keys)
    return (
        Comments(
            ", ".join(map(str, paths)),
            [t for _, t in keys],
            np.asarray(labels, np.float32),
            groups=Groups(rule=np.asarray([r for r, _ in keys], dtype=object)),
            first=[template.render(rows[k]) for k in keys],
            form=template.form,
        ),
        count,
    )


def _shared_ids(path: str | os.PathLike, ids: set[str]) -> int:
    table = open_table(path)
    if RULE_ID not in table.header:
        return 0
    return sum(str(row.get(RULE_ID) or "").strip() in ids for _, row in table.rows())


def holdout_rules(rules: np.ndarray, n: int, seed: int, source: str) -> tuple[np.ndarray, list]:
    """(validation rows, the rules held out): every row of `n` of the file's rules, chosen by
    `seed`, so the model is validated on rules it never trained on (what the competition's
    test set asks: most of its rules are not in train.csv)."""
    names = sorted(set(rules.tolist()))
    if n >= len(names):
        raise DataError(
            f"--holdout-rules {n}: {source} has {len(names)} rule(s); at least one must be "
            "left to train on"
        )
    chosen = sorted(np.random.default_rng(seed).choice(len(names), n, replace=False).tolist())
    held = [names[i] for i in chosen]
    return np.flatnonzero(np.isin(rules, held)), held


def holdout_split(data: Any, n: int, seed: int, source: str) -> tuple[np.ndarray, np.ndarray, str]:
    """--holdout-rules: (train rows, validation rows, a description): every row of `n` of
    the file's rules validates (`holdout_rules`), the others train."""
    if not isinstance(data, Comments) or data.groups.rule is None:
        raise DataError(f"--holdout-rules: {source} is not a rules file (no rule column)")
    va, held = holdout_rules(data.groups.rule, n, seed, source)
    tr = np.setdiff1d(np.arange(len(data)), va)
    names = "; ".join(r[:50] for r in held)
    return tr, va, f"{len(held)} held-out rule(s), seed {seed}: {names}"


def with_examples(
    cfg: Config, train_ex: Examples, valid: Any, tokenizer: Any
) -> tuple[Examples, Any]:
    """(training examples `train_ex` with --rule-examples' rows appended, their record or
    None without the flag); a rule held out for validation gives none of its examples."""
    d = cfg.data
    if not d.rule_examples:
        return train_ex, None
    paths = [p.strip() for p in d.rule_examples.split(",") if p.strip()]
    local = [storage.fetch(p) if storage.is_remote(p) else p for p in paths]
    held = sorted(set(valid.groups.rule.tolist())) if d.holdout_rules else []
    rows, examples = example_rows(local, template_of(cfg.text_format), valid, held)
    log.info("--rule-examples %s: %s", d.rule_examples, examples.describe())
    more_ex = encode(rows, tokenizer, d.max_len, d.cache_dir, task=cfg.task)
    return train_ex.concat(more_ex, train_ex.row_weights, 1.0), examples
