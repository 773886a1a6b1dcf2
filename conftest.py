"""The test tiers, for every test directory. A test is marked
- `e2e` when it runs a subprocess,
- `compile` when it compiles for a TPU topology or compares with another framework's model,
- `torch` when it runs the torch_xla reference side,
- `model` when it runs a real JAX model in-process (training or scoring, or a compiled step),
and `make test-fast` runs everything else (`-m "not e2e and not compile and not torch and not
model"`): the pure functions, the FakeBackend loop, parsing, data, metrics and refusals.

The marks are enforced where a cheap check can tell: a test without `e2e` that starts a
process, one without `compile` that asks JAX for a TPU topology, one without `torch` that
imports torch_xla, or one without `model` that builds a JAX backend (train or score) fails and
names the mark it needs; so does a test of the fast tier (none of the four marks) that runs a
Flax module (`init` or `apply`, eagerly or inside a program it compiles: a model's layers
tested on their own bypass the backend). A Flax module traced
for its shapes alone (`jax.eval_shape`: nothing is compiled or run) is allowed. The guards count
what a test does, never how long it takes, so a busy machine cannot make them flake.
Comparisons with transformers' PyTorch models are marked by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # tests/test_tiers.py runs a test session of its own


def _test_compile_cache() -> Path:
    """JAX's persistent compilation cache for every test process of this machine (both
    workers, every subprocess, every later run and clone), one directory per jax version:
    the suite compiles the same tiny programs run after run, and a process that finds them
    there skips XLA's compile. An entry is keyed by the program, the compile options, the
    devices and jax's version, so a hit is the executable a compile would give; a test of
    the cache itself sets its own directory. `JAX_COMPILATION_CACHE_DIR` set by the user
    wins. The first run on a machine fills it."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "jaxtpu-tests" / f"xla-jax-{metadata.version('jax')}"


if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_test_compile_cache())
    # jax's own least-recently-used eviction keeps each version's directory under 2 GiB
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))


def pytest_report_header(config: pytest.Config) -> str:
    cache = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    entries = list(cache.glob("*-cache")) if cache.is_dir() else []
    size = sum(f.stat().st_size for f in entries) / 2**20
    return f"compilation cache: {cache} ({len(entries)} programs, {size:.0f} MiB)"


# The marks that take a test out of `make test-fast`.
SLOW_TIERS = {"e2e", "compile", "torch", "model"}


def _marks(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers()}


def _refuse(mark: str, what: str):
    def refused(*args, **kwargs):
        raise pytest.fail.Exception(
            f"this test {what} but is not marked @pytest.mark.{mark} (see conftest.py)",
            pytrace=False,
        )

    return refused


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    had_torch_xla = "torch_xla" in sys.modules
    with _guarded(item):
        result = yield
    if not had_torch_xla and "torch_xla" in sys.modules and "torch" not in _marks(item):
        pytest.fail("this test imports torch_xla but is not marked @pytest.mark.torch", False)
    return result


class _guarded:
    """Within a test's setup and call: subprocesses and TPU topologies only for the marked."""

    def __init__(self, item: pytest.Item) -> None:
        self.marks = _marks(item)
        self.patch = pytest.MonkeyPatch()

    def __enter__(self) -> None:
        if "e2e" not in self.marks:
            self.patch.setattr(subprocess.Popen, "__init__", _refuse("e2e", "starts a process"))
        if "model" not in self.marks:
            from jaxtpu.engine.backend import JaxBackend

            what = "runs a real JAX model (builds a JaxBackend)"
            self.patch.setattr(JaxBackend, "__init__", _refuse("model", what))
        if not self.marks & SLOW_TIERS:  # outside the fast tier, a mark already says so
            _refuse_flax_modules(self.patch)
        if "compile" not in self.marks:
            try:
                from jax.experimental import topologies
            except ImportError:
                return
            what = "compiles for a TPU topology"
            self.patch.setattr(topologies, "get_topology_desc", _refuse("compile", what))

    def __exit__(self, *exc: object) -> None:
        self.patch.undo()


def _refuse_flax_modules(patch: pytest.MonkeyPatch) -> None:
    """Flax modules' `init` and `apply` refused (they run or compile a model), except inside
    `jax.eval_shape`, which traces for shapes and compiles nothing."""
    try:
        import jax
        from flax import linen as nn
    except ImportError:
        return
    depth = [0]
    eval_shape = jax.eval_shape

    def shapes_only(*args, **kwargs):
        depth[0] += 1
        try:
            return eval_shape(*args, **kwargs)
        finally:
            depth[0] -= 1

    for name in ("init", "apply", "init_with_output"):
        method = getattr(nn.Module, name)
        what = f"runs a JAX model (calls a Flax module's {name} outside jax.eval_shape)"

        def guarded(self, *args, _method=method, _what=what, **kwargs):
            if depth[0] == 0:
                _refuse("model", _what)()
            return _method(self, *args, **kwargs)

        patch.setattr(nn.Module, name, guarded)
    patch.setattr(jax, "eval_shape", shapes_only)
