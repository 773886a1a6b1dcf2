"""Calibration: a run's probabilities made to mean what they say, by Platt scaling of each
output, fitted on the run's validation rows when its best model is chosen.

A column's logit z becomes a z + b (a > 0), fitted by Newton's method to minimise the binary
cross-entropy of sigmoid(a z + b) against the validation labels (rater fractions stay soft;
hard 0/1 labels take Platt's targets, (n+ + 1) / (n+ + 2) and 1 / (n- + 2), so a small or
separable validation set cannot push a to infinity). A monotone map of each column: every
ROC AUC is unchanged, thresholds (Perspective users' 0.7, 0.9) move to where the rates are.

A column may also carry a map onto Perspective's scale (`PerspectiveScale`, fitted by
`jaxtpu.core.data.history.scale` on a platform's history), applied after the Platt scaling: a
score then means what Perspective's meant, so a platform's thresholds keep their meaning. And
a column may be read out of the model's vector anew (`Readout`, `history fit-scale --readout`:
a linear layer on the frozen model's pooled vector, fitted to Perspective's logged scores of
that attribute), in place of its output and Platt scaling, before the map; applying it needs
the vector (`Calibration.needs_pooled`), which every scorer then computes in the same pass,
and, for a readout of the text's n-grams too (`--ngrams`), the texts scored
(`Calibration.needs_texts`, their features as `jaxtpu.core.ngrams` computes them).

One implementation for every reader: training writes `calibration.json` beside the best
checkpoint, exports carry the same record (`jaxtpu_calibration` in an HF export's config.json,
`calibration` in `jaxtpu_onnx.json`), and `predict`, `jaxtpu.load()` and `serve` apply it;
`evaluate` reports the expected calibration error (ECE) and Brier score before and after.
Framework-free: numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import ngrams
from jaxtpu.core.errors import UserError
from jaxtpu.core.files import atomic_write

FILE = "calibration.json"  # in a run directory, beside its best checkpoint
CONFIG_KEY = "jaxtpu_calibration"  # in an HF export's config.json
METHOD = "platt"
BINS = 15  # equal-width probability bins of the expected calibration error
# A column is fitted only with at least this many labelled validation rows on each side of
# 0.5: fewer (a rare label, a tiny run) cannot say where its rates are, and it is left as it is.
MIN_CLASS = 30


@dataclass(frozen=True)
class PerspectiveScale:
    """A column's map onto Perspective's scale (`jaxtpu.core.data.history.scale`): the knots (`x`
    the calibrated probability, `y` Perspective's score) of an increasing piecewise linear map,
    fitted by `method` on `rows` history comments the model did not train on, from `source`
    (file names), of `dates` (the first and last comment's, where known), scored by
    Perspective's `models` (where the platform kept them)."""

    column: str
    attribute: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    rows: int
    source: str = ""
    dates: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    method: str = "quantile"

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "attribute": self.attribute,
            "method": self.method,
            "x": list(self.x),
            "y": list(self.y),
            "rows": self.rows,
            "source": self.source,
            "dates": list(self.dates),
            "models": list(self.models),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PerspectiveScale:
        out = cls(
            str(d["column"]),
            str(d["attribute"]),
            tuple(float(v) for v in d["x"]),
            tuple(float(v) for v in d["y"]),
            int(d["rows"]),
            str(d.get("source", "")),
            tuple(str(v) for v in d.get("dates", ())),
            tuple(str(v) for v in d.get("models", ())),
            str(d.get("method", "quantile")),
        )
        x, y = np.asarray(out.x), np.asarray(out.y)
        if (
            len(x) < 2
            or len(x) != len(y)
            or not (np.diff(x) > 0).all()
            or not (np.isfinite(y).all() and (np.diff(y) >= 0).all() and 0 <= y[0] and y[-1] <= 1)
        ):
            raise ValueError(f"the scale of {out.column} is not an increasing map into [0, 1]")
        return out


@dataclass(frozen=True)
class Readout:
    """A column's logit read out of the model's pooled vector (the vector its classifier
    reads): `weights` . vector + `bias`, in place of the model's own output and its Platt
    scaling; fitted (`jaxtpu.core.data.history.readout`) to Perspective's logged `attribute`
    on `rows` history comments the model did not train on, by ridge regression with L2
    strength `l2` chosen by k-fold cross-validation; `grams`: a weight per n-gram of the
    text (`jaxtpu.core.ngrams`), added to the vector's, for a readout of the text too."""

    column: str
    attribute: str
    weights: tuple[float, ...]
    bias: float
    rows: int
    l2: float
    grams: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {"column": self.column, "attribute": self.attribute, "rows": self.rows,
               "l2": self.l2, "bias": self.bias, "weights": list(self.weights)}  # fmt: skip
        return {**out, "grams": dict(self.grams)} if self.grams else out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Readout:
        grams = {str(g): float(w) for g, w in (d.get("grams") or {}).items()}
        out = cls(str(d["column"]), str(d["attribute"]), tuple(float(w) for w in d["weights"]),
                  float(d["bias"]), int(d["rows"]), float(d["l2"]), grams)  # fmt: skip
        values = (*out.weights, out.bias, *grams.values())
        if not out.weights or not all(math.isfinite(x) for x in values):
            raise ValueError(f"the readout of {out.column} has no or non-finite weights")
        return out


# a mapped probability is kept inside (EPS, 1 - EPS), so its logit stays finite
EPS = 1e-7


@dataclass(frozen=True)
class Calibration:
    """Per-column Platt scaling (`scale` a, `shift` b) of a model's outputs, named
    `columns` (the task's score columns, auxiliary targets included), fitted on `rows`
    validation rows, with each column's ECE and Brier score there before and after; the
    columns read out of the model's vector anew (`readouts`, in place of their output and
    scaling); then, for the columns that have one, the map onto Perspective's scale
    (`perspective`)."""

    columns: tuple[str, ...]
    scale: tuple[float, ...]
    shift: tuple[float, ...]
    rows: int = 0
    before: dict[str, list[float]] = field(default_factory=dict)
    after: dict[str, list[float]] = field(default_factory=dict)
    perspective: tuple[PerspectiveScale, ...] = ()
    readouts: tuple[Readout, ...] = ()

    @property
    def needs_pooled(self) -> bool:
        """Whether `apply` reads the model's vector (a column is read out of it)."""
        return bool(self.readouts)

    @property
    def needs_texts(self) -> bool:
        """Whether `apply` reads the texts scored (a column is read out of their n-grams)."""
        return any(r.grams for r in self.readouts)

    def apply(
        self,
        logits: np.ndarray,
        pooled: np.ndarray | None = None,
        texts: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """The calibrated logits of (N,) or (N, C) `logits` (C = the columns fitted), float64:
        the sigmoid of these is the calibrated probability, on Perspective's scale for the
        columns mapped onto it. `pooled` (N, hidden): the model's vector of each row, from the
        same pass, which the columns with a readout are read from (`needs_pooled`); `texts`:
        the N texts (or pairs) scored, whose n-grams a readout of them reads (`needs_texts`)."""
        z = np.asarray(logits, np.float64)
        a, b = np.asarray(self.scale), np.asarray(self.shift)
        if z.ndim == 1 and len(a) == 1:
            return self.apply(z[:, None], pooled, texts)[:, 0]
        if z.ndim != 2 or z.shape[1] != len(a):
            raise UserError(
                f"calibration of {len(a)} column(s) ({', '.join(self.columns)}) given outputs "
                f"of shape {z.shape}: a calibration of another model"
            )
        return self._on_scale(self._read_out(z * a + b, pooled, texts))

    def _read_out(
        self, z: np.ndarray, pooled: np.ndarray | None, texts: Sequence[Any] | None
    ) -> np.ndarray:
        if not self.readouts:
            return z
        hidden = len(self.readouts[0].weights)
        if pooled is None or pooled.shape != (len(z), hidden):
            got = "none" if pooled is None else f"shape {pooled.shape}"
            raise UserError(
                f"the calibration reads {', '.join(r.column for r in self.readouts)} out of the "
                f"model's vector ({hidden} values a comment) but was given {got}: the model "
                "scored without its vector, or a calibration of another model"
            )
        z = z.copy()
        v = np.asarray(pooled, np.float64)
        for r in self.readouts:
            z[:, self.columns.index(r.column)] = v @ np.asarray(r.weights) + r.bias
        if self.needs_texts:
            z += self._of_texts(len(z), texts)
        return z

    def _of_texts(self, n: int, texts: Sequence[Any] | None) -> np.ndarray:
        """(n, C): what the texts' n-grams add to each column with n-gram weights."""
        if texts is None or len(texts) != n:
            got = "no" if texts is None else f"{len(texts)}"
            raise UserError(
                f"the calibration reads {', '.join(r.column for r in self.readouts if r.grams)} "
                f"out of the texts' n-grams but was given {got} texts for {n} scores"
            )
        at, index, weights = self._gram_weights
        out = np.zeros((n, len(self.columns)))
        for i, t in enumerate(texts):
            k, v = ngrams.indexed(ngrams.features(ngrams.text_of(t)), index)
            if k:
                out[i, at] = np.asarray(v) @ weights[k]
        return out

    @functools.cached_property
    def _gram_weights(self) -> tuple[list[int], dict[str, int], np.ndarray]:
        """The columns read out of n-grams, every n-gram's row, and the (n-grams, columns)
        weights: one look-up per n-gram of a text, whatever the number of readouts."""
        reads = [r for r in self.readouts if r.grams]
        index: dict[str, int] = {}
        for r in reads:
            for g in r.grams:
                index.setdefault(g, len(index))
        weights = np.zeros((len(index), len(reads)))
        for j, r in enumerate(reads):
            for g, w in r.grams.items():
                weights[index[g], j] = w
        return [self.columns.index(r.column) for r in reads], index, weights

    def _on_scale(self, z: np.ndarray) -> np.ndarray:
        if not self.perspective:
            return z
        z = z.copy()
        for m in self.perspective:
            j = self.columns.index(m.column)
            q = np.clip(np.interp(sigmoid(z[:, j]), m.x, m.y), EPS, 1 - EPS)
            z[:, j] = np.log(q) - np.log1p(-q)
        return z

    def with_perspective(
        self, scales: tuple[PerspectiveScale, ...], readouts: tuple[Readout, ...] = ()
    ) -> Calibration:
        """This calibration with `scales` in place of the maps of their columns; the columns
        mapped now are read out by `readouts` where they have one, else as the model gives
        them (a readout fitted before is dropped)."""
        mapped = {s.column for s in scales}
        kept = tuple(m for m in self.perspective if m.column not in mapped)
        kept_out = tuple(r for r in self.readouts if r.column not in mapped)
        return dataclasses.replace(
            self, perspective=kept + tuple(scales), readouts=kept_out + tuple(readouts)
        )

    def subset(self, columns: list[str] | tuple[str, ...]) -> Calibration:
        """The calibration of `columns` alone (an export of the task's outputs without its
        auxiliary targets), in their order."""
        at = [self.columns.index(c) for c in columns]

        def picked(values: dict[str, list[float]]) -> dict[str, list[float]]:
            return {k: [v[j] for j in at] for k, v in values.items()}

        return Calibration(
            tuple(columns),
            tuple(self.scale[j] for j in at),
            tuple(self.shift[j] for j in at),
            self.rows,
            picked(self.before),
            picked(self.after),
            tuple(m for m in self.perspective if m.column in columns),
            tuple(r for r in self.readouts if r.column in columns),
        )

    def to_dict(self) -> dict[str, Any]:
        maps = [m.to_dict() for m in self.perspective]
        readouts = [r.to_dict() for r in self.readouts]
        return {
            "method": METHOD,
            "columns": list(self.columns),
            "scale": list(self.scale),
            "shift": list(self.shift),
            "rows": self.rows,
            # a column without a labelled validation row has no ECE: null in the JSON
            "before": _nulls(self.before),
            "after": _nulls(self.after),
            **({"perspective": maps} if maps else {}),
            **({"readouts": readouts} if readouts else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str) -> Calibration:
        try:
            if d.get("method") != METHOD:
                raise ValueError(f"method {d.get('method')!r}, not {METHOD!r}")
            out = cls(
                tuple(str(c) for c in d["columns"]),
                tuple(float(a) for a in d["scale"]),
                tuple(float(b) for b in d["shift"]),
                int(d.get("rows", 0)),
                {k: [_float(x) for x in v] for k, v in d.get("before", {}).items()},
                {k: [_float(x) for x in v] for k, v in d.get("after", {}).items()},
                tuple(PerspectiveScale.from_dict(m) for m in d.get("perspective", ())),
                tuple(Readout.from_dict(r) for r in d.get("readouts", ())),
            )
            unknown = [m.column for m in (*out.perspective, *out.readouts)
                       if m.column not in out.columns]  # fmt: skip
            if len({len(r.weights) for r in out.readouts}) > 1:
                raise ValueError("readouts of vectors of different sizes")
            if unknown:
                raise ValueError(f"a scale of column(s) {', '.join(unknown)}, not calibrated")
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{source}: not a calibration record ({e})") from None
        if not len(out.columns) == len(out.scale) == len(out.shift) or not all(
            math.isfinite(x) for x in (*out.scale, *out.shift)
        ):
            raise UserError(f"{source}: a calibration record with mismatched or non-finite values")
        return out

    def describe(self) -> str:
        """One line: the method and each column's ECE before -> after."""
        ece_b, ece_a = self.before.get("ece", []), self.after.get("ece", [])
        parts = [
            f"{c} (no labelled row)"
            if math.isnan(b)
            else f"{c} {b:.4f} -> {a:.4f}"
            if (scale, shift) != (1.0, 0.0)
            else f"{c} {b:.4f} (left as is: under {MIN_CLASS} rows of a class)"
            for c, b, a, scale, shift in zip(
                self.columns, ece_b, ece_a, self.scale, self.shift, strict=False
            )
        ]
        line = f"Platt scaling per column on {self.rows} validation rows; ECE " + ", ".join(parts)
        if self.perspective:
            read = {r.column: r for r in self.readouts}
            line += "; on Perspective's scale: " + ", ".join(
                f"{m.column} as {m.attribute} ({m.rows:,} comments{_how_read(read.get(m.column))})"
                for m in self.perspective
            )
        return line


def _how_read(r: Readout | None) -> str:
    if r is None:
        return ""
    return ", read out of the vector" + (f" and {len(r.grams):,} n-grams" if r.grams else "")


def _nulls(values: dict[str, list[float]]) -> dict[str, list[float | None]]:
    return {k: [None if math.isnan(x) else x for x in v] for k, v in values.items()}


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function; NaN (a comment with no score: a readout's held-out prediction of
    an unscored row) stays NaN, without numpy's warning about it."""
    z = np.asarray(z, np.float64)
    with np.errstate(invalid="ignore"):
        return np.exp(-np.logaddexp(0.0, -z))


def platt(z: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[float, float]:
    """(a, b) minimising the cross-entropy of sigmoid(a z + b) against targets `y` in [0, 1]
    (Platt's smoothed targets for hard labels), plus a ridge of one row's weight pulling
    toward (1, 0), so that validation rows a model separates cannot drive a to huge values:
    Newton's method on the two parameters, with a backtracking step; (1, 0) when the fit is
    not an increasing map (a model no better than chance on these rows is left as it is)."""
    z, y = np.asarray(z, np.float64), np.asarray(y, np.float64)
    if np.isin(y, (0.0, 1.0)).all():
        pos = float(y.sum())
        y = np.where(y > 0.5, (pos + 1) / (pos + 2), 1 / (len(y) - pos + 2))
    x = np.stack([z, np.ones_like(z)], 1)
    ridge, centre = 1.0 / len(z), np.array([1.0, 0.0])

    def loss(w: np.ndarray) -> float:
        t = x @ w
        return float(np.mean(np.logaddexp(0.0, t) - y * t) + ridge / 2 * np.sum((w - centre) ** 2))

    w = np.array([1.0, 0.0])
    current = loss(w)
    for _ in range(iterations):
        p = sigmoid(x @ w)
        grad = x.T @ (p - y) / len(z) + ridge * (w - centre)
        hess = (x * (p * (1 - p))[:, None]).T @ x / len(z) + ridge * np.eye(2)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-6 and loss(w - t * step) > current:
            t /= 2
        w, previous = w - t * step, current
        current = loss(w)
        if previous - current < 1e-12:
            break
    a, b = float(w[0]), float(w[1])
    if not (a > 0 and math.isfinite(a) and math.isfinite(b)):
        return 1.0, 0.0
    return a, b


def ece(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> float:
    """The expected calibration error: over `bins` equal-width bins of the probability, the
    row-weighted mean |mean probability - mean target| (soft targets as they are)."""
    p, y = np.asarray(p, np.float64), np.asarray(y, np.float64)
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for k in range(bins):
        inside = which == k
        if inside.any():
            total += inside.sum() * abs(p[inside].mean() - y[inside].mean())
    return float(total / max(len(p), 1))


def brier(p: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((np.asarray(p, np.float64) - np.asarray(y, np.float64)) ** 2))


def _columns(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return a[:, None] if a.ndim == 1 else a


def scores(logits: np.ndarray, labels: np.ndarray, cal: Calibration | None = None) -> dict:
    """{'ece': [...], 'brier': [...]} per column of `logits` against `labels` (NaN labels
    left out), calibrated by `cal` when given."""
    z = _columns(cal.apply(logits) if cal is not None else logits)
    y = _columns(labels)
    out: dict[str, list[float]] = {"ece": [], "brier": []}
    for j in range(z.shape[1]):
        known = np.isfinite(y[:, j])
        p = sigmoid(z[known, j])
        out["ece"].append(ece(p, y[known, j]) if known.any() else float("nan"))
        out["brier"].append(brier(p, y[known, j]) if known.any() else float("nan"))
    return out


def fit(logits: np.ndarray, labels: np.ndarray, columns: tuple[str, ...]) -> Calibration:
    """Per-column Platt scaling of validation `logits` against their `labels` ((N,) or
    (N, C); NaN = unlabelled, left out); a column with fewer than `MIN_CLASS` labelled rows
    on either side of 0.5 is left as it is (a = 1, b = 0)."""
    z, y = _columns(logits), _columns(labels)
    if z.shape != y.shape or z.shape[1] != len(columns):
        raise ValueError(f"logits {z.shape}, labels {y.shape}, {len(columns)} columns")
    scale, shift = [], []
    for j in range(z.shape[1]):
        known = np.isfinite(y[:, j]) & np.isfinite(z[:, j])
        target = y[known, j]
        if min((target >= 0.5).sum(), (target < 0.5).sum()) < MIN_CLASS:
            a, b = 1.0, 0.0
        else:
            a, b = platt(z[known, j], target)
        scale.append(a)
        shift.append(b)
    cal = Calibration(tuple(columns), tuple(scale), tuple(shift), int(len(z)))
    return dataclasses.replace(
        cal, before=scores(logits, labels), after=scores(logits, labels, cal)
    )


def write(directory: str | Path, cal: Calibration) -> None:
    with atomic_write(Path(directory) / FILE) as f:
        f.write(json.dumps(cal.to_dict(), indent=2, allow_nan=False) + "\n")


def read(path: str | Path) -> Calibration | None:
    """The calibration in `path` (a run directory's `calibration.json`, or the directory),
    None when there is none (a run of an older jaxtpu, or a ranking run); an unreadable file
    is one line."""
    path = Path(path)
    path = path / FILE if path.is_dir() else path
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable ({e}); delete it to score uncalibrated") from None
    return Calibration.from_dict(d, str(path))


def of_export(directory: str | Path) -> Calibration | None:
    """The calibration an export's config.json carries (`CONFIG_KEY`), None without one (a
    checkpoint transformers saved, an export of a run without calibration)."""
    path = Path(directory) / "config.json"
    try:
        d = json.loads(path.read_text()).get(CONFIG_KEY) if path.exists() else None
    except (OSError, ValueError, AttributeError):
        return None  # the model's own reader says what is wrong with its config.json
    return None if d is None else Calibration.from_dict(d, f"{path} {CONFIG_KEY}")
