"""How a model in shadow (`jaxtpu serve --shadow RUN`) compares with the one that answers, on
the live traffic both score (framework-free; the answers of the base, not of a community's own
model, which are counted apart): per attribute, the mean absolute difference of
their scores, their rank correlation, and at each threshold moderation sets (0.5, 0.7, 0.8 --
Coral Talk's default -- and 0.9) how many comments each model puts at or above it and how many
change side. No text is kept: only scores, and of the last `WINDOW` comments for the rank
correlation.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

THRESHOLDS = (0.5, 0.7, 0.8, 0.9)
WINDOW = 10_000  # the most recent score pairs the rank correlation is computed over


class _Attribute:
    def __init__(self) -> None:
        self.n = 0
        self.abs_diff = 0.0
        self.above = {t: [0, 0, 0] for t in THRESHOLDS}  # primary, shadow, changed side
        self.recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=WINDOW)

    def add(self, primary: float, shadow: float) -> None:
        self.n += 1
        self.abs_diff += abs(primary - shadow)
        for t in THRESHOLDS:
            p, s = primary >= t, shadow >= t
            counts = self.above[t]
            counts[0] += p
            counts[1] += s
            counts[2] += p != s
        self.recent.append((primary, shadow))

    def summary(self) -> dict[str, Any]:
        return {
            "compared": self.n,
            "mean_abs_difference": self.abs_diff / self.n if self.n else None,
            "rank_correlation": spearman(list(self.recent)),
            "rank_correlation_of_last": len(self.recent),
            "above": {
                str(t): {"primary": c[0], "shadow": c[1], "changed_side": c[2]}
                for t, c in self.above.items()
            },
        }


def spearman(pairs: list[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation of (x, y) pairs, ties ranked by their mean rank; None for
    fewer than 3 pairs or a constant side."""
    if len(pairs) < 3:
        return None
    x, y = (_ranks(np.asarray(v, np.float64)) for v in zip(*pairs, strict=True))
    if x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]  # ties share their mean rank


class ShadowStats:
    """The comparison so far (thread-safe), and what was not compared."""

    def __init__(self, primary: str, shadow: str) -> None:
        self.primary, self.shadow = primary, shadow
        self.dropped = 0  # requests the shadow did not score: it was behind
        self.failed = 0  # requests whose shadow scoring failed
        self.community = 0  # answered by a community's own model: the shadow stands by the base
        self._attributes: dict[str, _Attribute] = {}
        self._lock = threading.Lock()

    def add(self, primary: Mapping[str, float], shadow: Mapping[str, float]) -> None:
        """One comment's scores by both models (the attributes both answer)."""
        with self._lock:
            for name in primary.keys() & shadow.keys():
                self._attributes.setdefault(name, _Attribute()).add(primary[name], shadow[name])

    def report(self) -> dict[str, Any]:
        """What `GET /v1/shadow` answers and `jaxtpu shadow report` prints."""
        with self._lock:
            return {
                "primary": self.primary,
                "shadow": self.shadow,
                "dropped": self.dropped,
                "failed": self.failed,
                "community": self.community,
                "thresholds": list(THRESHOLDS),
                "attributes": {k: a.summary() for k, a in sorted(self._attributes.items())},
            }


def table(report: Mapping[str, Any]) -> str:
    """A report as Markdown: a row per attribute; then each community's head in shadow
    (`serve --shadow-communities`), its table under its name."""
    parts = [_table(report)] if "primary" in report else []
    for community, sub in sorted((report.get("communities") or {}).items()):
        parts.append(f"community {community!r}:\n\n{_table(sub)}")
    return "\n\n".join(parts)


def _table(report: Mapping[str, Any]) -> str:
    head = " | ".join(f">= {t}: primary / shadow / changed" for t in report["thresholds"])
    lines = [
        f"primary {report['primary']}, shadow {report['shadow']}; not compared: "
        f"{report['dropped']} dropped (the shadow was behind), {report['failed']} failed, "
        f"{report.get('community', 0)} answered by a community's own model",
        "",
        f"| attribute | compared | mean abs difference | rank correlation | {head} |",
        "|---|---|---|---|" + "---|" * len(report["thresholds"]),
    ]
    for name, a in report["attributes"].items():
        mad = "-" if a["mean_abs_difference"] is None else f"{a['mean_abs_difference']:.4f}"
        rho = "-" if a["rank_correlation"] is None else f"{a['rank_correlation']:.4f}"
        cells = " | ".join(
            f"{c['primary']} / {c['shadow']} / {c['changed_side']}" for c in a["above"].values()
        )
        lines.append(f"| {name} | {a['compared']} | {mad} | {rho} | {cells} |")
    return "\n".join(lines)
