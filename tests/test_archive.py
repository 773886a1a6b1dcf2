"""`jaxtpu archive` (issue 87 item 6): a file, or a glob of files, scored on Apache Beam's
RunInference by the local runner, in the environment of its own that Beam needs
(`make setup-archive`: `.venv-archive`, made here when missing), against `jaxtpu predict` (a
run) and onnxruntime on the same graph (an export) in the main one."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import cli

from parity_tests.harness import ROOT, clean_env

ARCHIVE_PYTHON = ROOT / ".venv-archive" / "bin" / "python"
TEXTS = [
    "you are an idiot",
    "thanks for the edit!",
    "What kind of idiot name is foo?",
    "",  # an empty comment: scored as empty text, as predict does
    'a comment over\ntwo lines, "quoted", with a comma',  # never split at its line end
    "I will find you and hurt you",
    *(f"an ordinary comment number {i} about the article" for i in range(14)),
]


@pytest.fixture(scope="module")
def archive_python() -> Path:
    """Beam's environment, made by the Makefile's own target when it is missing."""
    if not (ARCHIVE_PYTHON.parent.parent / ".installed").exists():
        proc = subprocess.run(["make", "--no-print-directory", "setup-archive"], cwd=ROOT,
                              capture_output=True, text=True, timeout=1200)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return ARCHIVE_PYTHON


def _archive(python: Path, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "jaxtpu", "archive", *map(str, args)], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=600)  # fmt: skip


def _scores(paths: list[Path]) -> dict[str, list[float]]:
    """id -> scores of the CSV files (each with predict's header), checking the header once."""
    out: dict[str, list[float]] = {}
    headers = set()
    for path in paths:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
        headers.add(tuple(rows[0]))
        for row in rows[1:]:
            assert row[0] not in out, f"{row[0]} twice"
            out[row[0]] = [float(x) for x in row[1:]]
    assert len(headers) == 1, headers
    return out


def _write_csv(path: Path, texts: list[str], start: int = 0) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text"])
        w.writerows([f"c{start + i}", t] for i, t in enumerate(texts))
    return path


@pytest.mark.e2e
def test_archive_scores_a_run_as_predict_does_row_for_row(archive_python, finished_run, tmp_path):
    """The jaxtpu handler on Beam's local runner, against `jaxtpu predict` of the same run and
    file: every id once, the same header, the same scores (within 1e-6; the scorer gives a
    comment the same score in any call, so they are equal)."""
    source = _write_csv(tmp_path / "in.csv", TEXTS)
    want = tmp_path / "predict.csv"
    proc = cli("jaxtpu.predict", "--workdir", finished_run, "--input", source, "--output", want)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = tmp_path / "archive.csv"
    proc = _archive(archive_python, "--workdir", finished_run, "--input", source, "--output", got)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {len(TEXTS)} scores of 1 file(s) to {got}" in proc.stdout
    assert got.read_text().splitlines()[0] == want.read_text().splitlines()[0]
    a, b = _scores([got]), _scores([want])
    assert sorted(a) == sorted(b) and len(a) == len(TEXTS)
    diff = max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))
    assert diff <= 1e-6, diff
    # an --output there already is refused, as predict refuses it
    proc = _archive(archive_python, "--workdir", finished_run, "--input", source, "--output", got)
    assert proc.returncode == 2 and "exists; pass --overwrite" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_archive_scores_a_glob_of_parquet_and_jsonl_with_an_export_as_onnxruntime_does(
    archive_python, onnx_export, tmp_path
):
    """The ONNX handler on a glob of a Parquet and a JSONL file, shards chosen by the runner:
    every row of both files scored as onnxruntime scores it in the main environment (the fp32
    graph of the directory on two worker processes, then the int8 graph named on one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jaxtpu.core.data.filekinds import BY_NAME
    from jaxtpu.engine.predictions import outputs
    from jaxtpu.serve.onnxmodel import OnnxModel

    half = len(TEXTS) // 2
    pq.write_table(
        pa.table({"id": [f"c{i}" for i in range(half)], "comment_text": TEXTS[:half]}),
        tmp_path / "part-0.parquet",
    )
    with (tmp_path / "part-1.jsonl").open("w") as f:
        for i, text in enumerate(TEXTS[half:], half):
            f.write(json.dumps({"id": f"c{i}", "comment_text": text}) + "\n")
    for graph, workers in ((onnx_export.out, 2), (onnx_export.out / "model_int8.onnx", 1)):
        model = OnnxModel(graph, 16)
        scores = model.scorer.calibrate(model.logits(TEXTS))
        header, want = outputs(scores, model.task, BY_NAME["classification"])
        out = tmp_path / f"scores-{graph.name}"
        proc = _archive(archive_python, "--onnx", graph, "--input", tmp_path / "part-*",
                        "--output", out, "--workers", workers, "--shards", 0)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"wrote {len(TEXTS)} scores of 2 file(s)" in proc.stdout, proc.stdout
        shards = sorted(tmp_path.glob(f"{out.name}-*-of-*.csv"))
        assert shards, list(tmp_path.iterdir())
        assert shards[0].read_text().splitlines()[0] == ",".join(header)
        got = _scores(shards)
        assert sorted(got) == sorted(f"c{i}" for i in range(len(TEXTS)))
        diff = np.abs(np.array([got[f"c{i}"] for i in range(len(TEXTS))]) - want).max()
        assert diff <= 1e-6, (graph, diff)


@pytest.mark.e2e
def test_archive_refuses_an_input_it_cannot_read_in_one_line(archive_python, onnx_export, tmp_path):
    proc = _archive(archive_python, "--onnx", onnx_export.out, "--input", tmp_path / "none-*.csv",
                    "--output", tmp_path / "o.csv")  # fmt: skip
    assert proc.returncode == 2 and "none-*.csv: no such file" in proc.stderr, proc.stderr
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("worker,less_toxic,more_toxic\n1,a,b\n")
    proc = _archive(archive_python, "--onnx", onnx_export.out, "--input", pairs,
                    "--output", tmp_path / "o.csv")  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--input" in proc.stderr and "scores" in proc.stderr
    _write_csv(tmp_path / "comments.csv", TEXTS[:2])
    proc = _archive(archive_python, "--onnx", onnx_export.out, "--input", tmp_path / "*.csv",
                    "--output", tmp_path / "o.csv")  # fmt: skip
    assert proc.returncode == 2 and "files are of different kinds" in proc.stderr, proc.stderr


def test_without_beam_the_command_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    """The main install has no Beam (its pins are older than the newest lock's): one line."""
    import sys

    from jaxtpu.serve import archive

    monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` fails
    source = _write_csv(tmp_path / "in.csv", TEXTS[:2])
    with pytest.raises(SystemExit) as e:
        archive.main(["--onnx", str(tmp_path), "--input", str(source), "--output", "x.csv"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "needs Apache Beam" in err and "make setup-archive" in err and len(err.splitlines()) == 1


@pytest.mark.e2e
def test_the_command_and_its_pipeline_import_without_jax():
    """`jaxtpu archive --onnx` needs no JAX (an export is scored on onnxruntime): JAX is
    imported when a run's model is loaded, never at the top."""
    import sys

    code = (
        "import sys\nsys.modules['jax'] = None\n"
        "import jaxtpu.serve.archive, jaxtpu.serve.beam\nprint('imported')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-2000:]
