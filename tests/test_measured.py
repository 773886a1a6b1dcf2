"""Measured results kept once (`benchmarks.measured`, issue 64 item 7): a benchmark's report
file holds its rows with where, when and how they were measured, and the docs' table is made
from it."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import measured
from parity_tests.harness import ROOT

BUCKET_ROWS = [
    {"model": "MiniLM (6 x 384)", "gb": 0.2726, "to": "local disk", "mode": "sync",
     "stall_s": 1.84, "written_s": 1.85},
    {"model": "MiniLM (6 x 384)", "gb": 0.2726, "to": "local disk", "mode": "async",
     "stall_s": 0.2, "written_s": 1.33},
]  # fmt: skip


def test_a_kept_report_renders_its_kinds_table_and_says_where_when_and_how(tmp_path, monkeypatch):
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef+changes")  # git: a process
    argv = ["--out", "runs/bucket", "--report", "docs/measured/bucket.json"]
    path = measured.keep(
        tmp_path / "m" / "bucket.json", "bucket", BUCKET_ROWS, "benchmarks.bucket", argv
    )
    record = json.loads(path.read_text())
    assert record["report"] == BUCKET_ROWS and record["kind"] == "bucket"
    assert record["command"] == "python -m benchmarks.bucket " + " ".join(argv)
    when = record["measured"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", when["date"])
    assert when["commit"] == "0123abcdef+changes"
    assert when["cpu"]["cores"] >= 1 and "jax" in when["versions"]
    shown = measured.render(path)
    assert "| MiniLM (6 x 384) | 0.27 GB | local disk | async | 0.20 s | 1.33 s |" in shown
    assert f"Measured {when['date']} at commit `{when['commit']}`" in shown
    assert (
        "`python -m benchmarks.bucket --out runs/bucket --report docs/measured/bucket.json`"
        in shown
    )
    assert not list(path.parent.glob("*.tmp"))


def test_a_report_of_no_known_kind_is_refused_when_kept_and_when_shown(tmp_path):
    with pytest.raises(ValueError, match="no table for reports of kind 'serving'"):
        measured.keep(tmp_path / "s.json", "serving", [], "benchmarks.serving", [])
    assert not (tmp_path / "s.json").exists()
    (tmp_path / "rows.json").write_text(json.dumps(BUCKET_ROWS))  # a bare bucket.json
    with pytest.raises(ValueError, match="not a kept report"):
        measured.render(tmp_path / "rows.json")


def test_every_kept_report_renders_and_a_page_shows_it():
    """Each file in docs/measured/ has a table and is named by a page; each page's marker
    names a file there (the docs build fails on a missing one)."""
    kept = sorted((ROOT / "docs" / "measured").glob("*.json"))
    assert kept, "no report kept in docs/measured/"
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    named = set(re.findall(r"<!-- measured:([\w.-]+) -->", pages))
    assert named == {p.name for p in kept}
    for path in kept:
        assert "|---|" in measured.render(path), path.name


def test_the_step_time_report_is_a_markdown_row_per_configuration():
    from benchmarks.compare import markdown

    ok = {"framework": "jaxtpu", "parallel": "jit", "workload": "minilm", "precision": "bf16",
          "devices": 2, "steps_per_call": 8, "median_s": 0.94, "p10_s": 0.93, "p90_s": 0.97,
          "samples_per_s": 34.0, "mfu": 0.265, "compile_s": 12.25,
          "peak_host_mb": 2100.4}  # fmt: skip
    failed = {"framework": "torch", "parallel": "spmd", "workload": "minilm", "precision": "bf16",
              "devices": 8, "error": "timed out after 1500 s"}  # fmt: skip
    saved = {"results": [ok, failed], "matmul_peak_gflops": {"fp32": 880.4, "bf16": 1122.0}}
    shown = markdown(saved).splitlines()
    assert shown[2] == (
        "| jaxtpu | jit/8 | minilm | bf16 | 2 | 0.940 | 0.930-0.970 | 34.0 | 26.5 % | 12.2 | "
        "2,100 |"
    )
    assert shown[3].startswith(
        "| torch | spmd | minilm | bf16 | 8 | error: timed out after 1500 s |"
    )
    assert shown[3].count("|") == shown[2].count("|")  # the row keeps the table's columns
    assert shown[-1].endswith("GFLOP/s: fp32 880, bf16 1122.")
