"""The end of a run that continued RUN on new rows (`jaxtpu.core.data.community`): both its
validation sets, the new rows held out and RUN's own validation rows, scored under RUN's best
model and under the new run's, with the metric `jaxtpu evaluate` reports for each file
(`evaluation.score_file`, so the numbers are evaluate's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxtpu.core import files
from jaxtpu.core.data.community import COMPARED, FOLDER, Prepared
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.engine.evaluation import METRICS, headline, score_file
from jaxtpu.engine.scoring import load_trained

ORIGINAL_TOLERANCE = 0.01  # the most RUN's validation metric may fall before it is warned of


def compare(prepared: Prepared, workdir: str | Path, devices: list[Any]) -> dict[str, Any]:
    """{'community': ..., 'original': ...}, each {'metric', 'before', 'after', 'examples',
    'file'}, also written to the run's `community/compared.json`."""
    before, after = load_trained(prepared.run), load_trained(workdir)
    sets = {"community": prepared.valid_csv, "original": prepared.original_valid}
    out: dict[str, Any] = {}
    for name, path in sets.items():
        values = {}
        for when, model in (("before", before), ("after", after)):
            examples, result, _ = score_file(
                model, path, devices, SCORING.batch_size, every_label=False
            )
            metric = headline(model.spec.task, examples)
            values[when] = result[METRICS[metric]]
        out[name] = {"metric": metric, **values, "examples": len(examples), "file": path}
    files.write_text(Path(workdir) / FOLDER / COMPARED, json.dumps(out, indent=1) + "\n")
    return out


def compared_line(compared: dict[str, Any], run: str) -> str:
    """The closing line of both validations against RUN's."""
    parts = []
    for name, what in (("community", "new rows held out"), ("original", "RUN's validation")):
        c = compared[name]
        parts.append(
            f"{what} ({c['examples']:,} rows, {c['metric']}): {c['before']:.4f} -> "
            f"{c['after']:.4f} ({c['after'] - c['before']:+.4f})"
        )
    return f"against --init-from {run}: " + "; ".join(parts)


def forgetting(compared: dict[str, Any], run: str) -> str:
    """What the new model lost of RUN's own validation when its metric fell by more than
    `ORIGINAL_TOLERANCE` ('' otherwise, or when it was not scored): a warning to read before
    the model answers anyone."""
    c = compared.get("original")
    if not c or not c["before"] - c["after"] > ORIGINAL_TOLERANCE:  # NaN: not warned of
        return ""
    return (
        f"the new model forgot part of what --init-from {run} knew: its validation's "
        f"{c['metric']} fell {c['before'] - c['after']:.4f} ({c['before']:.4f} -> "
        f"{c['after']:.4f}), more than {ORIGINAL_TOLERANCE}; compare it in shadow (jaxtpu "
        "serve --shadow) before it answers, or train again with a larger --replay-share or "
        "fewer --epochs"
    )
