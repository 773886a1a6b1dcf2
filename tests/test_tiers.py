"""The tiers' guards (conftest.py at the top of the repository): a test that runs a Flax module
without the `model` mark fails and names the mark, whether it builds a backend or not; tracing
one for its shapes alone is allowed. Each case runs in a test session of its own, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

X = jnp.ones((2, 3))


def test_init_unmarked():
    nn.Dense(4).init(jax.random.key(0), X)


def test_apply_in_a_compiled_program_unmarked():
    params = jax.eval_shape(nn.Dense(4).init, jax.random.key(0), X)
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), params)
    jax.jit(lambda p: nn.Dense(4).apply(p, X))(params)


def test_shapes_alone_unmarked():
    shapes = jax.eval_shape(nn.Dense(4).init, jax.random.key(0), X)
    assert shapes["params"]["kernel"].shape == (3, 4)


@pytest.mark.model
def test_init_marked():
    nn.Dense(4).init(jax.random.key(0), X)
"""


@pytest.mark.model  # off here, so that the inner session's own guard is the one tested
def test_a_flax_module_run_without_the_model_mark_fails_and_shapes_alone_pass(pytester):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(test_guarded=TESTS)
    # no plugins that start processes of their own (pytest-benchmark asks git at start-up)
    args = ("-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:xdist", "-rf")
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(passed=2, failed=2)
    failures = "\n".join(result.outlines)
    assert "FAILED test_guarded.py::test_init_unmarked" in failures
    assert "FAILED test_guarded.py::test_apply_in_a_compiled_program_unmarked" in failures
    assert "calls a Flax module's init outside jax.eval_shape" in failures
    assert "calls a Flax module's apply outside jax.eval_shape" in failures
    assert "is not marked @pytest.mark.model" in failures
