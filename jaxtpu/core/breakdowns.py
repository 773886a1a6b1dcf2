"""The competitions' breakdowns of a score by what a file says about each comment, one table
(framework-free): the Unintended Bias identities, the Multilingual language, the Agile
Community Rules rule. Each row names the `Groups` field it reads, the metric it reports and
where that metric stands among a task's monitors; `Task.group_metrics`, `Task.monitors`,
`Task.undefined_monitor` and `Groups` read this table and branch on no breakdown's name.

A new breakdown (e.g. per-country AUCs of a `country` column) is a row here, its field in
`jaxtpu.core.data.records.Groups` and the reader of its column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxtpu.core import metrics

BIAS_MONITOR, LANGUAGE_MONITOR = "val_jigsaw_bias", "val_mean_language_auc"
# The Agile Community Rules metric: each rule's ROC AUC, averaged with equal weight.
RULE_MONITOR = "val_mean_rule_auc"


def rule_key(rule: str) -> str:
    """The short name of a rule in metric keys (`val_auc_rule_<key>`): its first words,
    lower-case letters and digits joined by '_', at most 40 characters."""
    words = "".join(c if c.isalnum() else " " for c in rule.lower()).split()
    key = ""
    for w in words:
        if key and len(key) + 1 + len(w) > 40:
            break
        key = f"{key}_{w}" if key else w[:40]
    return key or "rule"


def rule_keys(rules: list[str]) -> dict[str, str]:
    """`rule_key` of each rule, made unique (a second rule of the same key gets '_2', ...)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for rule in rules:
        key, n = rule_key(rule), 1
        while (key if n == 1 else f"{key}_{n}") in used:
            n += 1
        out[rule] = key if n == 1 else f"{key}_{n}"
        used.add(out[rule])
    return out


def rule_metrics(
    scores: np.ndarray, labels: np.ndarray, rules: np.ndarray, weight: np.ndarray | None = None
) -> tuple[dict[str, float], list[str]]:
    """The Agile Community Rules metric: ({'mean_rule_auc': the mean of the per-rule ROC AUCs,
    'auc_rule_<key>': each rule's}, the rules left out because their rows hold one class)."""
    aucs, left_out = metrics.group_aucs(scores, labels, rules, weight)
    keys = rule_keys(sorted(set(np.asarray(rules).tolist())))
    out = {f"auc_rule_{keys[r]}": v for r, v in aucs.items()}
    return {"mean_rule_auc": metrics.mean_of(aucs), **out}, left_out


def _language_metrics(
    scores: np.ndarray, labels: np.ndarray, langs: np.ndarray, weight: np.ndarray | None = None
) -> tuple[dict[str, float], list[str]]:
    parts, left_out = metrics.language_aucs(scores, labels, langs, weight)
    return {k.replace("auc_", "auc_lang_", 1): v for k, v in parts.items()}, left_out


@dataclass(frozen=True)
class Breakdown:
    """One breakdown of the table.

    Attributes:
      field: the `Groups` field it reads (None or empty: the file has no such column).
      monitor: its headline metric (`val_` + a key of what `measure` returns).
      measure: (scores, labels, the field's values, weight) -> ({metric: value} without the
        `val_` prefix, the groups left out because their rows hold one class).
      group: what one group is called in messages ('language').
      rank: where `monitor` stands among a task's monitors: 'first' (the competition's own
        metric where its file is given: Unintended Bias), 'after' (beside the task's), or
        'own' (it is the task's own monitor: the rules task's).
      no_rows: a left-out group may also have had no rows (an identity column left blank).
      count_left_out: messages count the left-out groups instead of naming them (rules are
        sentences).
      shown: the field's values -> how the file's groups are described ('languages es, it').
    """

    field: str
    monitor: str
    measure: Callable[..., tuple[dict[str, float], list[str]]]
    group: str
    rank: str
    no_rows: bool = False
    count_left_out: bool = False
    shown: Callable[[Any], str] = str

    def values(self, groups: Any) -> Any:
        """The field's values in `groups`, or None where the file has none."""
        found = getattr(groups, self.field, None)  # no `if groups`: Groups asks this
        return found if found is not None and len(found) else None

    def left_out(self, names: list[str], named: bool = False) -> str:
        """The left-out groups as a message shows them: counted where `count_left_out` (then
        `named` lists them after the count, '; ' between)."""
        if not self.count_left_out:
            return ", ".join(names)
        return f"{len(names)}: {'; '.join(names)}" if named else f"{len(names)}"


BREAKDOWNS: tuple[Breakdown, ...] = (
    Breakdown(
        "identities",
        BIAS_MONITOR,
        metrics.jigsaw_bias,
        "identity subgroup",
        "first",
        no_rows=True,
        shown=lambda identities: "identities " + ", ".join(identities),
    ),
    Breakdown(
        "lang",
        LANGUAGE_MONITOR,
        _language_metrics,
        "language",
        "after",
        shown=lambda lang: "languages " + ", ".join(sorted(set(lang.tolist()))),
    ),
    Breakdown(
        "rule",
        RULE_MONITOR,
        rule_metrics,
        "rule",
        "own",
        count_left_out=True,
        shown=lambda rule: f"{len(set(rule.tolist()))} rules",
    ),
)
