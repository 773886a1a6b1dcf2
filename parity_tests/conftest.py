"""Parity suite options and shared work directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity_tests.checks import REAL_CSV
from parity_tests.harness import share_compilations


def pytest_configure(config: pytest.Config) -> None:
    share_compilations()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--parity-full",
        action="store_true",
        help="outcome checks on all 10,000 real comments at length 128 (about an hour)",
    )


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch_xla", reason="parity needs the torch_xla reference")
    return tmp_path_factory.mktemp("parity")


@pytest.fixture(scope="session")
def real_data() -> Path:
    if not REAL_CSV.exists():
        pytest.skip(f"real Jigsaw comments not found at {REAL_CSV} (see shared/data/SOURCES.md)")
    return REAL_CSV
