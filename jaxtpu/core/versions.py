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


# what the `jax` extra installs, by module (`pip install 'jaxtpu[jax]'`)
JAX_MODULES = ("jax", "flax", "optax", "orbax.checkpoint")


def missing_jax() -> str | None:
    """The first module of the `jax` extra that is not installed (a slim server install,
    `jaxtpu[serve-onnx]`), or None when all are."""
    import importlib.util

    for module in JAX_MODULES:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ModuleNotFoundError:  # its parent package is missing
            return module
    return None


def jax_needed(what: str) -> str | None:
    """One line saying `what` needs the `jax` extra, when it is not installed; else None."""
    module = missing_jax()
    if module is None:
        return None
    return (
        f"{what} needs JAX ({module} is not installed): pip install 'jaxtpu[jax]' (or "
        "'jaxtpu[tpu]', 'jaxtpu[cuda]'); a server of an ONNX export needs only "
        "'jaxtpu[serve-onnx]': jaxtpu serve --onnx DIR"
    )
