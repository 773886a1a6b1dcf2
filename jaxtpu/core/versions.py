"""The installed version of a distribution (framework-free): what `jaxtpu --version`, a saved
program's environment and a served model's version record."""

from __future__ import annotations

import importlib.metadata


def installed(dist: str, missing: str = "-") -> str:
    """The version of installed distribution `dist`, or `missing` when it is not installed (a
    source tree run without installing, a package left out)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return missing
