"""Settings read from the environment (framework-free): `JAXTPU_LEASE_SECONDS`,
`JAXTPU_BUCKET_TIMEOUT`, `JAXTPU_BUCKET_RETRIES`. A value that is not a number, or not in its
range, is one line that names the variable, never a traceback or a silently odd run."""

from __future__ import annotations

import math
import os

from jaxtpu.core.errors import ConfigError


def env_number(name: str, default: float, minimum: float, integer: bool = False) -> float:
    """The environment variable `name` as a finite number >= `minimum` (a whole one when
    `integer`), or `default` when it is unset or empty.

    Raises ConfigError naming the variable, its value and what it must be."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    kind = "a whole number" if integer else "a number"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum or (integer and value != int(value)):
        raise ConfigError(
            f"{name}={text!r}: expected {kind} >= {minimum:g}; unset it for {default:g}"
        )
    return int(value) if integer else value
