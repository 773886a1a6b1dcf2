"""`jaxtpu history fit-scale` and `compare`'s work: a run against a platform's Perspective
history: its scores of the history's comments it did not train on, the maps of its
attributes onto Perspective's scale, and the comparison a platform reads before switching."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.api import load
from jaxtpu.core import calibration, ngrams
from jaxtpu.core.data.history import readout, scale
from jaxtpu.core.data.history.rows import History
from jaxtpu.core.errors import UserError
from jaxtpu.core.versions import jax_needed
from jaxtpu.engine.scoring import run_attributes, training_texts


def scored(
    workdir: str, history: History, num_devices: int, batch_size: int, vectors: bool
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray | None, list[Any], list[Any]]:
    """The run's score columns, its raw outputs (N, columns) and (`vectors`) its vectors
    (N, hidden) on the history's comments, from one pass, its attributes, and the texts it
    scored (each comment as the run reads it); the comments of the run's training rows left
    out of `history` first (said)."""
    problem = jax_needed("jaxtpu history fit-scale and compare")
    if problem:
        raise UserError(problem)
    attributes, cfg = run_attributes(Path(workdir))
    trained_on, where = training_texts(cfg, Path(workdir))
    if trained_on is None:
        print(f"note: the run's training file ({where}) is not here: comments it trained on "
              "cannot be told apart", file=sys.stderr)  # fmt: skip
    else:
        before = len(history.rows)
        history.rows = [r for r in history.rows if r.text not in trained_on]
        if len(history.rows) < before:
            print(f"left out: {before - len(history.rows):,} comment(s) of the run's training "
                  f"rows ({where})", file=sys.stderr)  # fmt: skip
    if not history.rows:
        raise UserError(f"--history {history.source}: every comment is one the run trained on")
    model = load(workdir, num_devices or None, batch_size, calibrated=False, pooled=vectors)
    t0 = time.perf_counter()
    print(f"scoring {len(history.rows):,} comments with {workdir} ...", file=sys.stderr)
    texts = model.prepared([r.text for r in history.rows])
    logits, pooled = model.scorer.features(texts) if vectors else (model.scorer.logits(texts), None)
    print(f"scored in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    columns = tuple(model.task.score_columns(True))
    logits = np.asarray(logits, np.float64).reshape(len(history.rows), -1)
    return (
        columns,
        logits,
        None if pooled is None else np.asarray(pooled, np.float64),
        list(attributes),
        texts,
    )


def perspective_scores(history: History) -> dict[str, np.ndarray]:
    """Perspective's score of each comment per attribute the history holds (NaN: unscored)."""
    return {
        a: np.array([r.scores.get(a, np.nan) for r in history.rows]) for a in history.attributes
    }


def fit_scales(
    workdir: str,
    history: History,
    method: str,
    num_devices: int,
    batch_size: int,
    readouts: bool = False,
    grams: bool = False,
) -> tuple[calibration.Calibration, list[str]]:
    """The run's calibration with each attribute the history scores mapped onto Perspective's
    scale by `method` (`scale.METHODS`, fitted on the Platt-calibrated probability, or with
    `readouts` on the held-out probability of a readout of the model's vector,
    `jaxtpu.core.data.history.readout`; `grams`: of the vector and the text's n-grams), and
    a line per attribute saying what was done."""
    columns, logits, vectors, attributes, texts = scored(
        workdir, history, num_devices, batch_size, readouts or grams
    )
    each = [ngrams.features(ngrams.text_of(t)) for t in texts] if grams else None
    cal = calibration.read(workdir) or calibration.Calibration(
        columns, (1.0,) * len(columns), (0.0,) * len(columns)
    )
    platt = calibration.Calibration(cal.columns, cal.scale, cal.shift).apply(logits)
    p = calibration.sigmoid(platt).reshape(len(logits), -1)
    theirs = perspective_scores(history)
    times = sorted(r.time for r in history.rows if r.time)
    models = tuple(sorted({r.model for r in history.rows if r.model}))
    scales, outs, lines = [], [], []
    for a in attributes:
        if a.name not in theirs:
            lines.append(f"{a.name}: no history of it; left on jaxtpu's own scale")
            continue
        ours, how = p[:, columns.index(a.column)], ""
        try:
            if vectors is not None:
                r = readout.fit(vectors, theirs[a.name], grams=each)
                ours = calibration.sigmoid(r.held_out)
                n = int(np.isfinite(r.held_out).sum())
                outs.append(calibration.Readout(a.column, a.name, tuple(r.weights.tolist()),
                                                r.bias, n, r.l2, r.grams))  # fmt: skip
                also = f" and {len(r.grams):,} n-grams of the text" if grams else ""
                how = (f", read out of the model's vector{also} (L2 {r.l2:g}; held-out rank "
                       f"correlation {r.rank_correlation:.3f})")  # fmt: skip
            x, y = scale.fit(ours, theirs[a.name], method)
        except ValueError as e:
            least = readout.MIN_ROWS if readouts or grams else scale.MIN_ROWS
            lines.append(f"{a.name}: left on jaxtpu's own scale ({e}; at least {least})")
            outs = [o for o in outs if o.column != a.column]
            continue
        n = int(np.isfinite(theirs[a.name]).sum())
        dates = (times[0], times[-1]) if times else ()
        scales.append(calibration.PerspectiveScale(
            a.column, a.name, tuple(x), tuple(y), n, history.source, dates, models,
            method))  # fmt: skip
        lines.append(
            f"{a.name}: mapped onto Perspective's scale on {n:,} comments ({len(x)} knots){how}"
        )
    if not scales:
        raise UserError(f"--history {history.source}: no attribute of the run to map")
    return cal.with_perspective(tuple(scales), tuple(outs)), lines


def compare_run(
    workdir: str, history: History, raw: bool, num_devices: int, batch_size: int
) -> tuple[dict[str, Any], str]:
    """Perspective's scores against the run's (calibrated and on Perspective's scale where
    mapped, or `raw`), per attribute (`scale.compare`), and how the run scored."""
    cal = None if raw else calibration.read(workdir)
    reads = cal is not None and cal.needs_pooled
    columns, logits, vectors, attributes, texts = scored(
        workdir, history, num_devices, batch_size, reads
    )
    z = logits if cal is None else cal.apply(logits, vectors, texts).reshape(len(logits), -1)
    probs = calibration.sigmoid(z)
    ours = {a.name: probs[:, columns.index(a.column)] for a in attributes}
    report = scale.compare(perspective_scores(history), ours)
    if not report:
        raise UserError(
            f"--history {history.source}: none of its attributes "
            f"({', '.join(history.attributes)}) is one the run answers"
        )
    if cal is None:
        return report, "raw"
    mapped = [m.attribute for m in cal.perspective]
    vector = [r.attribute for r in cal.readouts if not r.grams]
    words = [r.attribute for r in cal.readouts if r.grams]
    return report, "calibrated" + (
        f", on Perspective's scale: {', '.join(mapped)}" if mapped else ""
    ) + (f"; read out of the model's vector: {', '.join(vector)}" if vector else "") + (
        f"; read out of the model's vector and the text's n-grams: {', '.join(words)}"
        if words
        else ""
    )
