"""How a command's flag is declared (framework-free): `_c`, a dataclass field with its help,
choices, bounds and how the command line takes it, read by `jaxtpu.core.flags.commands` for
`--help`, the checks and the docs' reference; and the flags several commands share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Any

from jaxtpu.core.flags.schema import Bounds


def _c(
    default: Any,
    help: str,
    *,
    choices: Sequence[str] | None = None,
    bounds: Bounds | None = None,
    required: bool = False,
    nargs: str | None = None,
    const: Any = None,
    metavar: str | None = None,
    one_of: str = "",
) -> Any:
    """A command's flag: its default and help, its choices, the values it accepts (`bounds`,
    numeric flags), whether it must be given, argparse's `nargs`/`const`/`metavar` where the
    flag takes other than one value, and `one_of`: the name of a group of flags of which at
    most one may be given (exactly one when any of them is `required`)."""
    metadata = {"help": help, "choices": choices, "bounds": bounds, "required": required}
    metadata.update(nargs=nargs, const=const, metavar=metavar, one_of=one_of)
    return field(default=default, metadata=metadata)


def _no_calibration() -> Any:
    """--no-calibration, the same flag on predict and serve (a field of its own for each)."""
    return _c(
        False,
        "Score with the model's raw probabilities: without it, a run's (or export's) "
        "calibration (per-output Platt scaling fitted on its validation rows, "
        "calibration.json) is applied, so a 0.7 means about 7 in 10 such comments are labelled "
        "so. Rankings and AUCs are the same either way.",
    )
