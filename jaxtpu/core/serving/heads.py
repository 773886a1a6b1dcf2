"""A community's head on the frozen served model (`jaxtpu head`, `jaxtpu serve --communities
DIR`): a logistic regression from what the served model already computes for a comment (its
vector under the head, `POOLED`, and its probabilities) to the probability that this
community's moderators remove it. Framework-free (numpy): the server keeps a thousand of them
over one encoder pass per comment.

The head corrects the base rather than replacing it: its logit is the base's logit of the
attribute it answers (TOXICITY: the `toxic` column), weighted at least 1, plus a regularised
linear term held to the range it took on the decisions (a queue's decisions are of the comments
it brought: a comment unlike them gets no correction beyond it). The strongest regularisation
is the base's own ranking, and the cross-validation that chooses it (`fit`) keeps it unless a
head beats it on the decisions, out of fold.

A head is one `.head.npz` file (`save`, `load`): its weights and one JSON record (the
community, the attribute, the base's version and score columns it reads, the regularisation,
the decisions it learnt from). A directory of them (`HeadDir`) is read again when a file
changes; a file that cannot be read is refused in one line and the head it replaces keeps
serving.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import files
from jaxtpu.core.errors import DataError
from jaxtpu.core.metrics import roc_auc

POOLED = "pooled"  # the name the model sows each comment's vector under (`models.head`)
SUFFIX = ".head.npz"
FORMAT = 1
# the L2 strengths tried (on standardized inputs, on the mean log loss); inf: the base alone
STRENGTHS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, float("inf"))
FOLDS = 5
MIN_CLASS = 2  # decisions of each class a head needs (fewer: no cross-validation)
FEW_CLASS = 10  # fewer of a class than this: said, the choice rests on a few decisions
EPS = 1e-6
BASE_WEIGHT_MIN = 1.0  # the base logit's weight at least this: the head adds to it


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))


def inputs(pooled: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """What a head reads of each comment: its vector, then the logit of each of the base's
    probabilities (N, hidden + columns)."""
    return np.concatenate([np.asarray(pooled, np.float64), logit(probabilities)], axis=1)


@dataclass(frozen=True)
class Record:
    """What a head file says of itself (its JSON)."""

    community: str
    attribute: str  # the attribute it answers (TOXICITY)
    column: str  # the base's column of that attribute, whose logit it corrects (toxic)
    columns: tuple[str, ...]  # the base's score columns it reads, in order
    base_version: str  # the served model it was trained on (`X-Model-Version`)
    hidden: int  # the width of the base's vector
    strength: float  # the L2 strength cross-validation chose (inf: the base alone)
    decisions: int
    removed: int
    cv_auc: float  # the chosen strength's ROC AUC on the decisions, out of fold (folds' mean)
    base_auc: float  # the base's own on the same folds
    trained: str  # UTC time
    seconds: float  # the fit's wall time (the encoder pass apart)
    format: int = FORMAT


@dataclass(frozen=True)
class Head:
    record: Record
    mean: np.ndarray  # standardization of the inputs
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    base_weight: float = 1.0  # the weight of the base's logit (at least BASE_WEIGHT_MIN)
    # the range its correction (weights . inputs) took on the decisions it learnt from: a
    # comment unlike any of them (a queue's decisions are of the comments it brought) gets no
    # correction beyond it
    low: float = -np.inf
    high: float = np.inf
    version: str = ""  # sha256 of its file

    def probability(self, pooled: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
        """The community's probability of removal of each comment, from the base's vector and
        probabilities of it (the base's columns, `record.columns`)."""
        x = inputs(pooled, probabilities)
        offset = x[:, self.record.hidden + self.record.columns.index(self.record.column)]
        correction = np.clip(((x - self.mean) / self.scale) @ self.weights, self.low, self.high)
        return sigmoid(self.base_weight * offset + correction + self.bias)

    def card(self) -> dict[str, Any]:
        r = self.record
        return {
            "version": self.version,
            "attribute": r.attribute,
            "base_version": r.base_version,
            "decisions": r.decisions,
            "removed": r.removed,
            "cv_auc": r.cv_auc,
            "base_auc": r.base_auc,
            "trained": r.trained,
        }


# ---- fitting ---------------------------------------------------------------------------------


Solution = tuple[np.ndarray, float, float]  # (weights, the base logit's weight, bias)


def _solve(
    x: np.ndarray,
    y: np.ndarray,
    offset: np.ndarray,
    strength: float,
    start: Solution | None = None,
) -> Solution:
    """L2-regularised logistic regression on `x` beside the base's logit (`offset`), whose
    weight (at least `BASE_WEIGHT_MIN`) and the bias are unpenalised: minimises mean(log
    loss) + strength / 2 * |w|^2, by L-BFGS (scipy's; milliseconds at a thousand decisions,
    where Newton's method solves a (hidden x hidden) system per step). `strength` inf: w = 0,
    the base's logit scaled and shifted (its ranking). `start`: a solution to start from (the
    one at the next stronger strength: a few steps from this one)."""
    # scipy comes with jax (and is declared beside it); deferred: a slim server serves heads
    # without fitting any, and without scipy
    from scipy.optimize import minimize

    n, d = x.shape
    used = x if strength != float("inf") else x[:, :0]
    lam = strength if strength != float("inf") else 0.0

    k = used.shape[1]

    def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
        w, a, b = beta[:k], beta[k], beta[k + 1]
        t = a * offset + used @ w + b
        value = np.mean(np.logaddexp(0.0, t) - y * t) + 0.5 * lam * (w @ w)  # stable log loss
        r = (sigmoid(t) - y) / n
        return float(value), np.concatenate([used.T @ r + lam * w, [offset @ r, r.sum()]])

    beta = np.zeros(k + 2)
    beta[k] = 1.0  # the base as it is
    if start is not None:
        beta[:k], beta[k], beta[k + 1] = start[0][:k], start[1], start[2]
    bounds = [(None, None)] * k + [(BASE_WEIGHT_MIN, None), (None, None)]
    result = minimize(loss, beta, jac=True, method="L-BFGS-B", bounds=bounds,
                      options={"maxiter": 1000, "gtol": 1e-6})  # fmt: skip
    w = np.zeros(d)
    w[:k] = result.x[:k]
    return w, float(result.x[k]), float(result.x[k + 1])


def folds_of(y: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """A fold (0..k-1) for each decision, each class dealt round the folds in a seeded order
    (stratified: every fold holds both classes)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), np.int64)
    for c in (0, 1):
        idx = np.flatnonzero(y == c)
        fold[rng.permutation(idx)] = np.arange(len(idx)) % k
    return fold


@dataclass
class Fit:
    """What `fit` chose and why: the out-of-fold AUC of each strength tried."""

    head: Head
    tried: dict[float, float] = field(default_factory=dict)


def fit(
    pooled: np.ndarray,
    probabilities: np.ndarray,
    removed: np.ndarray,
    record: dict[str, Any],
    strengths: tuple[float, ...] = STRENGTHS,
    folds: int = FOLDS,
    seed: int = 0,
) -> Fit:
    """A head from decisions: each comment's base vector and probabilities, and whether its
    moderators removed it (1) or kept it (0). The L2 strength is chosen by stratified k-fold
    cross-validation on the decisions (the mean of the folds' ROC AUCs; a tie goes to the
    stronger), and only where it beats the base's own on the same folds (else inf: the base
    scaled), then the head is fitted on them all. `record`: the `Record` fields a caller knows
    (community, attribute, column, columns, base_version)."""
    t0 = time.perf_counter()
    y = np.asarray(removed, np.float64)
    counts = int(y.sum()), int(len(y) - y.sum())
    if min(counts) < MIN_CLASS:
        raise DataError(
            f"{len(y)} decisions, {counts[0]} removed and {counts[1]} kept: a head needs at "
            f"least {MIN_CLASS} of each to choose its regularisation on them"
        )
    x = inputs(pooled, probabilities)
    columns = tuple(record["columns"])
    offset = x[:, pooled.shape[1] + columns.index(record["column"])]
    mean, scale = x.mean(0), x.std(0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    z = (x - mean) / scale
    k = min(folds, *counts)
    fold = folds_of(y, k, seed)
    tried: dict[float, float] = {}
    warm: dict[int, Solution] = {}  # each fold's last solution
    # each fold's AUC, then their mean: a fold's ranking is its own head's (pooling the folds'
    # scores would rank one fold's scaling of the base against another's)
    base_cv = float(np.mean([roc_auc(offset[fold == f], y[fold == f]) for f in range(k)]))
    for s in sorted(strengths, reverse=True):  # strongest first: each starts from the last
        aucs = []
        for f in range(k):
            train, test = fold != f, fold == f
            w, a, b = warm[f] = _solve(z[train], y[train], offset[train], s, warm.get(f))
            seen = z[train] @ w  # the test fold's correction is held to the range it had here
            correction = np.clip(z[test] @ w, seen.min(), seen.max())
            aucs.append(roc_auc(a * offset[test] + correction + b, y[test]))
        tried[s] = float(np.mean(aucs))
    tried = {s: tried[s] for s in strengths}
    # a head that does not beat the base out of fold is the base (the strongest, inf)
    beats = [s for s in strengths if round(tried[s], 6) > round(base_cv, 6)]
    best = max(beats, key=lambda s: (round(tried[s], 6), s)) if beats else max(strengths)
    w, a, b = _solve(z, y, offset, best)
    seen = z @ w
    rec = Record(
        **record,
        hidden=int(pooled.shape[1]),
        strength=best,
        decisions=len(y),
        removed=counts[0],
        cv_auc=round(float(tried[best]), 6),
        base_auc=round(base_cv, 6),
        trained=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        seconds=round(time.perf_counter() - t0, 3),
    )
    return Fit(Head(rec, mean, scale, w, b, a, float(seen.min()), float(seen.max())), tried)


# ---- files -----------------------------------------------------------------------------------


def save(head: Head, path: str | os.PathLike) -> str:
    """Writes `head` to `path` (a name ending .head.npz), whole or not at all (a server
    watching the directory never reads half a file); returns its version."""
    buffer = io.BytesIO()
    meta = json.dumps(asdict(head.record))
    np.savez(buffer, mean=head.mean, scale=head.scale, weights=head.weights,
             bias=np.array(head.bias), base_weight=np.array(head.base_weight),
             range=np.array([head.low, head.high]), record=np.array(meta))  # fmt: skip
    data = buffer.getvalue()
    files.write_bytes(path, data)
    return version_of(data)


def version_of(data: bytes) -> str:
    return "head-" + hashlib.sha256(data).hexdigest()[:16]


def load(path: str | os.PathLike) -> Head:
    """The head in `path`; a file that is not one, or is of another format, in one line
    (DataError)."""
    p = Path(path)
    try:
        data = p.read_bytes()
        if not data.startswith(b"PK"):  # an .npz is a zip archive
            raise ValueError("not an .npz archive")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(str(z["record"]))
            if meta.get("format") != FORMAT:  # said before its arrays are looked for
                raise DataError(
                    f"{p}: a head of format {meta.get('format')}; this jaxtpu reads {FORMAT}"
                )
            arrays = {k: np.asarray(z[k], np.float64) for k in ("mean", "scale", "weights")}
            bias, base_weight = float(z["bias"]), float(z["base_weight"])
            low, high = (float(v) for v in z["range"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{p}: not a head file ({type(e).__name__}: {e})") from None
    try:
        record = Record(**{**meta, "columns": tuple(meta["columns"])})
    except (TypeError, KeyError) as e:
        raise DataError(f"{p}: its record is not a head's ({e})") from None
    width = record.hidden + len(record.columns)
    if any(a.shape != (width,) for a in arrays.values()) or record.column not in record.columns:
        raise DataError(f"{p}: its weights are not of {width} inputs as its record says")
    return Head(record, bias=bias, base_weight=base_weight, low=low, high=high,
                version=version_of(data), **arrays)  # fmt: skip


Check = Callable[[Head], str | None]  # a reason the server cannot serve a head, or None


class HeadDir:
    """The heads of a directory (`serve --communities DIR`), one community each, read again
    by `refresh` when a file is added, replaced or removed. A file that cannot be read, or
    that `check` refuses (another base), is said in one line and the head it replaces keeps
    serving; two files of one community: the first by name serves."""

    def __init__(self, path: str | os.PathLike, check: Check | None = None) -> None:
        self.path = Path(path)
        self.check = check or (lambda head: None)
        self.heads: dict[str, Head] = {}  # by community
        self._files: dict[str, tuple[tuple[int, int], Head | None]] = {}
        if not self.path.is_dir():
            raise DataError(f"--communities {self.path}: not a directory")

    def refresh(self) -> list[str]:
        """Reads the files that changed since the last call; returns a line for each thing
        that happened (a head added, replaced, removed or refused)."""
        lines: list[str] = []
        seen = {}
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.name.endswith(SUFFIX) and entry.is_file():
                st = entry.stat()
                seen[entry.name] = (st.st_mtime_ns, st.st_size)
        for name in [n for n in self._files if n not in seen]:
            old = self._files.pop(name)[1]
            if old is not None:
                lines.append(f"{name}: removed; community {old.record.community!r} unserved")
        for name, stamp in seen.items():
            before = self._files.get(name)
            if before is not None and before[0] == stamp:
                continue
            old = before[1] if before else None
            try:
                head = load(self.path / name)
                reason = self.check(head)
                if reason:
                    raise DataError(f"{self.path / name}: {reason}")
            except DataError as e:
                keeps = "the head it replaces keeps serving" if old else "not served"
                lines.append(f"{e}; {keeps}")
                self._files[name] = (stamp, old)
                continue
            self._files[name] = (stamp, head)
            r = head.record
            what = "replaced" if old else "added"
            lines.append(f"{name}: {what}, community {r.community!r} ({r.attribute}, "
                         f"{r.decisions} decisions, cv AUC {r.cv_auc:.4f})")  # fmt: skip
        heads: dict[str, Head] = {}
        for name, (_, head) in self._files.items():
            if head is None:
                continue
            if head.record.community in heads:
                lines.append(f"{name}: community {head.record.community!r} has a head in an "
                             "earlier file; this one is not served")  # fmt: skip
                continue
            heads[head.record.community] = head
        self.heads = heads  # one assignment: a request sees the old map or the new
        return lines

    def card(self) -> dict[str, Any]:
        return {
            "directory": self.path.name,
            "heads": {c: h.card() for c, h in sorted(self.heads.items())},
        }


def file_name(community: str) -> str:
    """A file name for a community's head: its id's letters and digits, and a hash of the
    whole id (ids hold ':' and '/': Coral's are tenant:site URLs)."""
    stem = "".join(ch if ch.isalnum() else "-" for ch in community).strip("-")[:60] or "community"
    return f"{stem}-{hashlib.sha256(community.encode()).hexdigest()[:8]}{SUFFIX}"
