"""Measured results kept once (`benchmarks.shared.measured`, issue 64 item 7): a benchmark's report
file holds its rows with where, when and how they were measured, and the docs' table is made
from it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.shared import measured
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
        tmp_path / "m" / "bucket.json", "bucket", BUCKET_ROWS, "benchmarks.training.bucket", argv
    )
    record = json.loads(path.read_text())
    assert record["report"] == BUCKET_ROWS and record["kind"] == "bucket"
    assert record["command"] == "python -m benchmarks.training.bucket " + " ".join(argv)
    when = record["measured"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", when["date"])
    assert when["commit"] == "0123abcdef+changes"
    assert when["cpu"]["cores"] >= 1 and "jax" in when["versions"]
    shown = measured.render(path)
    assert "| MiniLM (6 x 384) | 0.27 GB | local disk | async | 0.20 s | 1.33 s |" in shown
    assert f"Measured {when['date']} at commit `{when['commit']}`" in shown
    assert (
        "`python -m benchmarks.training.bucket --out runs/bucket --report "
        "docs/measured/bucket.json`" in shown
    )
    assert not list(path.parent.glob("*.tmp"))


def test_a_benchmark_ends_by_printing_its_table_and_cpu_and_keeping_the_report(tmp_path, capsys):
    from benchmarks.shared.machine import cpu_record

    result = {"rows": 200, "workers": 1, "workdir": "runs/r", "predict_seconds": 20.0,
              "archive_seconds": 25.0, "max_abs_difference": 0.0, "cpu": cpu_record()}  # fmt: skip
    measured.show_and_keep(result, "archive", "benchmarks.deploy.archive", None, [], None)
    out = capsys.readouterr().out
    assert "| `jaxtpu predict` | 20 s | 10.0 | 1.00x |" in out and "0.80x" in out
    assert out.splitlines()[-1].startswith("CPU: ") and not list(tmp_path.iterdir())
    path = tmp_path / "a.json"
    when = {"date": "2026-12-05", "commit": "0123abcdef", "python": "3.12"}  # no git process
    measured.show_and_keep(
        result, "archive", "benchmarks.deploy.archive", path, ["--rows", "200"], when
    )
    assert capsys.readouterr().out.endswith(f"benchmarks.deploy.archive: kept {path}\n")
    assert json.loads(path.read_text())["report"]["rows"] == 200


def test_reports_of_one_kind_join_in_one_table_with_a_caption_per_sitting(tmp_path, monkeypatch):
    """`<!-- measured:A,B -->` (`render_joined`): the rows of reports made one process each
    (a TPU target per process) in one table, in the files' order; one caption per sitting
    naming each command of it; another kind, or a report that is not rows, is refused."""
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    when = measured.provenance()
    a, b = (
        measured.keep(
            tmp_path / f"{n}.json", "bucket", [row], "benchmarks.training.bucket", [f"--{n}"], when
        )
        for n, row in zip("ab", reversed(BUCKET_ROWS), strict=True)
    )
    shown = measured.render_joined([a, b])
    assert shown.index("| async |") < shown.index("| sync |")  # a's row, then b's
    assert shown.count("\n|---") == 1 and shown.count("Measured ") == 1
    assert (
        "Again: `python -m benchmarks.training.bucket --a`; "
        "`python -m benchmarks.training.bucket --b`." in shown
    )
    later = measured.keep(
        tmp_path / "c.json", "bucket", BUCKET_ROWS, "benchmarks.training.bucket", [],
        {**when, "date": "2099-01-01"},
    )  # fmt: skip
    assert measured.render_joined([a, later]).count("Measured ") == 2  # two sittings
    assert measured.render_joined([a]) == measured.render(a)
    other = measured.keep(
        tmp_path / "d.json", "default_run", [], "benchmarks.training.default_run", []
    )
    with pytest.raises(ValueError, match="one table needs one kind"):
        measured.render_joined([a, other])
    saved = {"results": [], "matmul_peak_gflops": {}}  # a compare report: a record, not rows
    whole = [
        measured.keep(tmp_path / f"q{i}.json", "compare", saved, "benchmarks.training.compare", [])
        for i in (1, 2)
    ]
    with pytest.raises(ValueError, match="only reports of rows join in one table"):
        measured.render_joined(whole)
    assert re.findall(measured.MARKER, "<!-- measured:a.json,b-1.json -->") == ["a.json,b-1.json"]


def test_a_report_of_no_known_kind_is_refused_when_kept_and_when_shown(tmp_path):
    with pytest.raises(ValueError, match="no table for reports of kind 'no-such-kind'"):
        measured.keep(tmp_path / "s.json", "no-such-kind", [], "benchmarks.training.epoch", [])
    assert not (tmp_path / "s.json").exists()
    (tmp_path / "rows.json").write_text(json.dumps(BUCKET_ROWS))  # a bare bucket.json
    with pytest.raises(ValueError, match="not a kept report"):
        measured.render(tmp_path / "rows.json")


def test_showing_a_missing_or_foreign_file_is_one_line(tmp_path, capsys):
    (tmp_path / "rows.json").write_text(json.dumps(BUCKET_ROWS))
    for name, said in (("nope.json", "no such report"), ("rows.json", "not a kept report")):
        assert measured.main([str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("module", ["decoders", "default_run"])
def test_a_report_path_that_cannot_be_written_ends_a_benchmark_before_its_work(
    tmp_path, monkeypatch, capsys, module
):
    """`--report FILE` is checked as a benchmark starts (`measured.start`), not after hours of
    measuring: a directory there ends it in one line, exit 2. Both benchmarks would start a
    process or compile right after, which this tier's guard would fail."""
    import importlib

    bench = importlib.import_module(f"benchmarks.training.{module}")
    with pytest.raises(SystemExit) as e:
        bench.main(["--report", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"benchmarks.training.{module}: --report {tmp_path} is a directory; give a file path"
    )
    assert measured.start(None, "benchmarks.x") is None  # no report: nothing checked
    monkeypatch.setattr(measured, "provenance", lambda: {"commit": "c"})  # git: a process
    assert measured.start(tmp_path / "new" / "r.json", "benchmarks.x") == {"commit": "c"}
    assert not (tmp_path / "new").exists()  # checked, nothing made before the results


def test_every_kept_report_renders_and_a_page_shows_it():
    """Each file in docs/measured/ has a table and is named by a page; each page's marker
    names a file there (the docs build fails on a missing one)."""
    kept = sorted((ROOT / "docs" / "measured").glob("*.json"))
    assert kept, "no report kept in docs/measured/"
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    markers = re.findall(measured.MARKER, pages)
    named = {name for marker in markers for name in marker.split(",")}
    assert named == {p.name for p in kept}
    for path in kept:
        assert "|---|" in measured.render(path), path.name


def test_the_step_time_report_is_a_markdown_row_per_configuration():
    from benchmarks.training.compare import markdown

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


def test_the_default_run_report_is_a_row_per_run_first_from_empty_caches():
    from benchmarks.training.default_run import table

    run = {"steps": 57, "val_auc": 0.95341, "val_loss": 0.31, "run_s": 111.4, "command_s": 117.2}
    shown = table([run, {**run, "run_s": 60.0, "command_s": 66.6}]).splitlines()
    assert shown[2] == "| 1 | empty | 57 | 0.9534 | 0.3100 | 111 | 117 |"
    assert shown[3] == "| 2 | the first run's | 57 | 0.9534 | 0.3100 | 60 | 67 |"


# No page holds a table of figures copied by hand (issue 64's item 7): every measured table is
# `<!-- measured:FILE -->`, made from a kept report. A table that is not a measurement is named
# in NOT_MEASURED.
# tables of decimals that are not measurements: settings, a data description, hardware facts
NOT_MEASURED = (
    "| task | data | head | loss | metric |",
    "| row | weight |",
    "| `model_type` | transformers class |",
    "| GPU | where | compute capability | bf16 | use |",
)


def _tables_of_figures(text: str) -> list[list[str]]:
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append(line)
            continue
        if rows and not rows[0].startswith(NOT_MEASURED):
            if any(re.search(r"(?<![\w.])\d+\.\d+", row) for row in rows[2:]):
                tables.append(rows)
        rows = []
    return tables


def test_no_page_gains_a_table_of_figures_copied_by_hand():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {
        str(page.relative_to(ROOT)): len(_tables_of_figures(page.read_text())) for page in pages
    }
    found = {page: n for page, n in found.items() if n}
    assert found == {}
    # it can fail: a pasted table of figures is one, a generated marker none
    assert len(_tables_of_figures("| a | s |\n|---|---|\n| x | 1.5 |\n\ntext")) == 1
    assert _tables_of_figures("<!-- measured:bucket.json -->\n") == []


def test_an_estimated_report_is_captioned_as_an_estimate_and_its_rows_are_ordered(
    tmp_path, monkeypatch
):
    """benchmarks.training.decoders' rows are preflight's estimates for hardware that is not here:
    the caption says 'Estimated (not measured)', never 'Measured', and the rows come in the
    table's order whatever order the run saved them in."""
    from dataclasses import asdict

    from jaxtpu.preflight.report import Report

    def saved(length: int, batch: int) -> dict:
        r = Report(target="t4x2", sharding="zero1", remat="layer", mesh="data=2,fsdp=1",
                   batch_size=batch, max_len=length, params=8 << 30, capacity=12 << 30,
                   total=11 << 30, est_step_s=0.5, est_method="flops", compile_s=30.0,
                   extra={"largest_batch": batch})  # fmt: skip
        return {"model": "Qwen3-4B", **asdict(r)}

    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    path = measured.keep(tmp_path / "d.json", "decoders", [saved(512, 5), saved(256, 12)],
                         "benchmarks.training.decoders", ["--targets", "t4x2"])  # fmt: skip
    shown = measured.render(path)
    rows = [line for line in shown.splitlines() if line.startswith("| Qwen3-4B")]
    assert [r.split(" | ")[2:4] for r in rows] == [["256", "12"], ["512", "5"]]
    assert "Estimated (not measured) " in shown and "Measured" not in shown
    assert "not measurements" in shown  # the table's own footnote on the starred columns


def test_the_competitions_tables_show_each_runs_commands_training_and_evaluation():
    """benchmarks.quality.competitions' rows (kinds competitions and bias): a run's monitored best,
    evaluate's headline on its count of examples or pairs, its parts less the per-identity
    ones, what predict wrote, and the bias table's val_loss at the best step."""
    from benchmarks.quality import competitions

    row = {
        "run": "Unintended Bias",
        "commands": ["jaxtpu train --workdir runs/ub", "jaxtpu evaluate --workdir runs/ub"],
        "summary": {"steps": 94, "monitor": "val_jigsaw_bias", "best": {"value": 0.95, "step": 94}},
        "best_eval": {"val_loss": 0.498, "val_jigsaw_bias": 0.95},
        "evaluate": {"metric": "jigsaw_bias", "value": 0.952648, "examples": 1000,
                     "jigsaw_bias": 0.952648, "overall_auc": 0.951, "subgroup_auc": 0.9557,
                     "bpsn_auc": 0.9425, "bnsp_auc": 0.9614, "bpsn_auc_muslim": 0.5},
    }  # fmt: skip
    pairs = {**row, "run": "Rate Severity", "best_eval": {},
             "evaluate": {"metric": "agreement", "value": 0.934, "pairs": 1000},
             "predicted": {"columns": ["id", "toxic"], "rows": 500}}  # fmt: skip
    shown = competitions.table([row, pairs]).splitlines()
    assert shown[2].startswith("| Unintended Bias | `jaxtpu train --workdir runs/ub`; `jaxtpu")
    assert "| 94 steps, best val_jigsaw_bias 0.9500 |" in shown[2]
    assert "`jigsaw_bias` 0.9526 on 1000 examples (overall_auc 0.9510, subgroup_auc" in shown[2]
    assert "muslim" not in shown[2] and "bnsp_auc 0.9614)" in shown[2]
    assert "`agreement` 0.9340 on 1000 pairs; predict wrote 500 rows of `id,toxic` |" in shown[3]
    bias = competitions.bias_table([row, pairs | {"evaluate": row["evaluate"]}]).splitlines()
    assert (
        bias[2] == "| Unintended Bias | 94 | 0.9526 | 0.9510 | 0.9557 | 0.9425 | 0.9614 | 0.4980 |"
    )
    assert bias[3].endswith("| 0.9614 | - |")  # no eval record at the best step: no loss


def test_the_precisions_table_gives_fp16_alone_its_skipped_steps_and_loss_scales():
    from benchmarks.training import precisions

    rows = [
        {"precision": "bf16", "steps": 30, "val_agreement": 0.91667, "val_loss": 0.1042,
         "wall_s": 53.4},
        {"precision": "fp16", "steps": 30, "val_agreement": 0.91667, "val_loss": 0.1094,
         "wall_s": 94.0, "skipped_steps": 1, "loss_scales": [32768.0, 65536.0]},
    ]  # fmt: skip
    shown = precisions.table(rows).splitlines()
    assert shown[2] == "| bf16 | 30 | 0.9167 | 0.1042 | 53 | - |"
    assert shown[3] == "| fp16 | 30 | 0.9167 | 0.1094 | 94 | 1 skipped; scale 32,768 to 65,536 |"
    rows[1]["loss_scales"] = [65536.0]
    assert precisions.table(rows).endswith("| 1 skipped; scale 65,536 throughout |")


def test_the_community_table_gives_each_size_against_the_base_then_the_shadow_report():
    from benchmarks.quality import community

    row = {"decisions": 300, "deleted": 60, "community_auc_before": 0.90,
           "community_auc_after": 0.96, "jigsaw_toxic_auc_before": 0.95,
           "jigsaw_toxic_auc_after": 0.94, "original_before": 0.91, "original_after": 0.905,
           "loop_seconds": 129.6}  # fmt: skip
    shadow = {"table": "| attribute | compared |", "decisions": 300,
              "forum_answered_by": "jaxtpu-b", "others_answered_by": "jaxtpu-a"}  # fmt: skip
    result = {"rows": [row], "test_rows": 2008, "test_deleted": 501, "shadow": shadow}  # fmt: skip
    shown = community.table(result).splitlines()
    assert shown[0].startswith("The forum (profanity): its unseen decisions are 2008 comments")
    assert shown[4] == (
        "| 300 | 60 | 0.9000 | 0.9600 | +0.0600 | 0.1000 | -0.0100 | 0.9100 | 0.9050 | -0.0050 "
        "| 130 s |"
    )
    assert shown[6].endswith(": met (+0.0600, -0.0050).")
    assert "the 300-decision model in shadow" in shown[8] and "`jaxtpu-b`" in shown[8]
    assert shown[-1] == "| attribute | compared |"
    # not met: short of the rise, or the original lost too much; the room said when too small
    row.update(community_auc_before=0.96, community_auc_after=0.97)
    not_met = ": not met (+0.0100, -0.0050); out of reach: the room above the base is 0.0400."
    assert community.table(result).splitlines()[6].endswith(not_met)
    row.update(community_auc_before=0.90, community_auc_after=0.96, original_after=0.89)
    shown = community.table({**result, "forum": "hate"}).splitlines()
    assert shown[0].startswith("The forum (hate)") and shown[6].endswith(
        ": not met (+0.0600, -0.0200)."
    )


def test_a_failed_precision_run_is_one_line_and_the_runs_before_it_are_kept(tmp_path, monkeypatch):
    """benchmarks.training.precisions writes DIR/precisions.json after each run: the second run
    failing (a fake one here) ends it in one line naming the run, with the first run's row kept."""
    from benchmarks.shared import trainruns
    from benchmarks.training import precisions

    def train(cmd):
        workdir = Path(cmd[cmd.index("--workdir") + 1])
        if workdir.name != "ls-fp32":
            return SimpleNamespace(returncode=1)
        workdir.mkdir(parents=True)
        final = {"val_agreement": 0.9, "val_loss": 0.1}
        (workdir / "summary.json").write_text(json.dumps({"steps": 30, "final": final}))
        (workdir / "metrics.jsonl").write_text(json.dumps({"event": "train"}) + "\n")
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(trainruns.subprocess, "run", train)
    csv = tmp_path / "comments.csv"
    csv.write_text("id,comment_text,target\n")
    out = tmp_path / "runs"
    with pytest.raises(SystemExit, match=r"ls-bf16 failed \(exit 1; its output is above"):
        precisions.main(["--out", str(out), "--csv", str(csv), "--precisions", "fp32,bf16"])
    rows = json.loads((out / "precisions.json").read_text())
    assert [(r["precision"], r["val_agreement"]) for r in rows] == [("fp32", 0.9)]


def test_the_quality_benchmark_runs_each_seed_both_ways_and_gives_bucketed_less_padded(
    tmp_path, monkeypatch
):
    """benchmarks.quality.buckets: per seed a bucketed and a padded run of the same train command
    (fake runs here: the command line checked, a summary written), DIR/quality.json, the
    table's bucketed - padded per seed and their mean, and a report of kind quality."""
    from benchmarks.quality import buckets as quality
    from benchmarks.shared import trainruns

    commands = []
    fail_at = [0]  # the call that fails (0: none)

    def train(cmd):
        flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
        commands.append((flags["--seed"], flags["--buckets"]))
        if len(commands) == fail_at[0]:
            return SimpleNamespace(returncode=1)
        auc = {("0", "auto"): 0.9777, ("0", "none"): 0.9745, ("1", "auto"): 0.9839,
               ("1", "none"): 0.9845}[commands[-1]]  # fmt: skip
        workdir = Path(flags["--workdir"])
        workdir.mkdir(parents=True)
        final = {"val_auc": auc, "val_loss": 0.1}
        (workdir / "summary.json").write_text(json.dumps({"steps": 1125, "final": final}))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(trainruns.subprocess, "run", train)
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    csv = tmp_path / "comments.csv"
    csv.write_text("id,comment_text,target\n")
    kept = tmp_path / "quality.json"
    argv = ["--out", str(tmp_path / "runs"), "--csv", str(csv), "--report", str(kept)]
    assert quality.main(argv) == 0
    assert commands == [("0", "auto"), ("0", "none"), ("1", "auto"), ("1", "none")]
    rows = json.loads((tmp_path / "runs" / "quality.json").read_text())
    assert [r["val_auc"] for r in rows] == [0.9777, 0.9745, 0.9839, 0.9845]
    shown = measured.render(kept).splitlines()
    assert shown[2].startswith("| 0 | bucketed | 1125 | 0.9777 | 0.1000 |")
    assert shown[2].endswith("| +0.0032 |") and shown[3].endswith("| - |")
    assert shown[4].endswith("| -0.0006 |")
    assert "Bucketed - padded, mean over 2 seeds: +0.0013 validation ROC AUC." in shown
    with pytest.raises(SystemExit):  # --out holds the runs now: a new one is needed
        quality.main(argv)
    commands.clear()
    fail_at[0] = 2  # a failed run: one line naming it, the rows before it kept
    with pytest.raises(SystemExit, match=r"seed-0-padded failed \(exit 1; its output is above"):
        quality.main([*argv[:1], str(tmp_path / "again"), *argv[2:]])
    assert len(json.loads((tmp_path / "again" / "quality.json").read_text())) == 1


def test_an_estimates_report_is_captioned_as_an_estimate_in_the_targets_order(
    tmp_path, monkeypatch
):
    """benchmarks.training.estimates --report (kind estimates): preflight's figures for TPUs that
    are not here, so the caption says 'Estimated (not measured)'; the rows come in TARGETS' order
    (v3-8 before v5e-8) whatever order they were computed in, and the v3 rows carry the
    compiler's figure beside the roofline's (what docs/tpu.md's validation reads)."""
    from jaxtpu.preflight.report import Report

    def saved(target: str, step: float, compiler: float, roofline: float) -> dict:
        r = Report(target, "fsdp", "none", "data=1,fsdp=8", 32, 128, total=2**30)
        r.fits, r.est_step_s, r.global_batch = True, step, 256
        r.est_method = "compiler" if compiler > 0 else "roofline"
        r.compiler_step_s, r.roofline_step_s = compiler, roofline
        return {"model": "MiniLM (6 x 384)", **r.__dict__}

    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    rows = [saved("v5e-8", 0.01, -114.0, 0.01), saved("v3-8", 0.02, 0.02, 0.019)]
    path = measured.keep(
        tmp_path / "e.json", "estimates", rows, "benchmarks.training.estimates", []
    )
    shown = measured.render(path)
    lines = [line for line in shown.splitlines() if line.startswith("| MiniLM")]
    assert [line.split(" | ")[1] for line in lines] == ["v3-8", "v5e-8"]
    assert "| compiler | 0.0200 | 0.95 |" in lines[0] and "| (-114) | - |" in lines[1]
    assert "Estimated (not measured) " in shown and "Measured" not in shown
    assert "not a measurement" in shown


def test_the_serving_table_is_a_row_per_sitting_against_its_goals(tmp_path, monkeypatch):
    """benchmarks.serving.throughput --report (kind serving): each sitting (a backend and its serve
    flags) one row: the server's rates at each client count, p50 alone and p99 at the top count, its
    offline rate and the baseline's at the top count, and the three ratios the goals judge."""
    import argparse

    from benchmarks.serving import throughput as serving

    def sitting(backend: str, flags: str, rates: list[float], offline: float) -> dict:
        rows = [{"way": f"serve {backend}", "clients": c, "throughput": t, "p50_ms": 10.0 * c,
                 "p99_ms": 30.0 * c} for c, t in zip((1, 8, 64), rates, strict=True)]  # fmt: skip
        rows += [{"way": "baseline", "clients": c, "throughput": 40.0 + c, "p50_ms": 1.0,
                  "p99_ms": 1.0} for c in (1, 8, 64)]  # fmt: skip
        result = {"backend": backend, "serve_flags": flags, "offline": offline, "rows": rows,
                  "precision": "bf16", "half_load": {"p50_ms": 20.0, "p99_ms": 50.0}}  # fmt: skip
        return result | {"ratios": serving.ratios(result, 64)}

    sittings = [sitting("jaxtpu", "", [10.0, 30.0, 130.0], 130.0),
                sitting("onnx-int8", "--workers 2", [50.0, 160.0, 208.0], 200.0)]  # fmt: skip
    sittings[1]["cpu"] = {"model": "Some CPU", "flags": ["avx2"]}
    sittings[1]["rows"].append({"way": "serve onnx-int8 (wrk)", "clients": 64,
                                "throughput": 180.0, "p50_ms": 1.0, "p99_ms": 2.0})  # fmt: skip
    loads = ((0.5, 100.0), (0.8, 400.0), (0.95, 900.0))
    sittings[1]["open_loop"] = [{"fraction": f, "p99_ms": ms} for f, ms in loads]
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    path = measured.keep(
        tmp_path / "s.json", "serving", sittings, "benchmarks.serving.throughput", []
    )
    lines = measured.render(path).splitlines()
    assert lines[0].startswith(
        "| CPU | serve | comments/s at 1 / 8 / 64 clients | p50 at 1 / p99 at 64"
    )
    # 130 / 130 offline, 130 / 104 baseline at 64; 50 / 20 at half load
    # a sitting of before wrk and the open loops: '-' in their columns; no CPU recorded: ?
    assert lines[2] == (
        "| ? | `--workdir` (jaxtpu, bf16) | 10.0 / 30.0 / 130.0 | 10 / 1920 | 130.0 | 1.00 | - | "
        "104.0 | 1.25 | 2.50 | - |"
    )
    assert lines[3].startswith(
        "| Some CPU, AVX2 | `--onnx DIR/model_int8.onnx`, `--workers 2` | 50.0 / 160.0"
    )
    # issue 89: wrk's row (left out of the Python generator's rates) and the open loops
    assert "| 1.04 | 0.90 | 104.0 | 2.00 | 2.50 | 100 / 400 / 900 |" in lines[3]
    assert lines[-1].startswith("Measured ")
    p = argparse.ArgumentParser()
    args = argparse.Namespace(sitting=["jaxtpu", "onnx-int8:--workers 2"], backend="jaxtpu")
    assert serving.sittings_of(p, args) == [("jaxtpu", ""), ("onnx-int8", "--workers 2")]
    with pytest.raises(SystemExit):  # a backend that is not one: argparse's one line, exit 2
        serving.sittings_of(p, argparse.Namespace(sitting=["onnx-int4"]))


def test_the_epoch_table_is_each_row_against_jaxtpu_padded_at_its_length(tmp_path, monkeypatch):
    """benchmarks.training.compare --epoch --report (kind epoch): a row per framework and batching;
    x padded is the row's epoch over jaxtpu padded's (a +warm row: over padded +warm's), steady s
    is the epoch less its compile time, and torch's rows are named as the docs name them."""

    def row(fw: str, way: str, batching: str, epoch: float, cache: str | None = None, **kw):
        return {"framework": fw, "parallel": way, "batching": batching, "max_len": 128,
                "epoch_s": epoch, "compile_s": 4.0, "real_tokens_per_s": 3000.0,
                "tokens_vs_full_padding": 0.55, "compiles": 4, "steady_cpu_cores": 1.9,
                "data_wait_share": 0.0004, "compile_cache": cache, **kw}  # fmt: skip

    jax = {"steps_per_call": 8, "sharding": "fsdp", "huge_pages": True}
    records = [row("jaxtpu", "jit", "padded", 200.0, "cold", **jax),
               row("jaxtpu", "jit", "bucketed", 120.0, "cold", **jax),
               row("jaxtpu", "jit", "padded", 160.0, "warm", **jax),
               row("jaxtpu", "jit", "bucketed", 100.0, "warm", **jax),
               row("torch", "eager", "random", 300.0), row("torch", "compile", "bucketed", 180.0),
               row("torch", "eager", "bucketed", 150.0, huge_pages=True),
               {"framework": "torch", "parallel": "eager", "batching": "random", "max_len": 128,
                "error": "timed out after 3600s"}]  # fmt: skip
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    saved = {"results": records}
    path = measured.keep(
        tmp_path / "e.json", "epoch", saved, "benchmarks.training.compare", ["--epoch"]
    )
    lines = [line for line in measured.render(path).splitlines() if line.startswith("| 128 |")]
    first = "| 128 | jaxtpu jit/8+fsdp+hp | padded | 200 | 1.00 | 4.0 | 196 | 3000 | 0.55 | 4 |"
    assert lines[0] == first + " 1.90 | 0.04 |"
    assert lines[1].startswith("| 128 | jaxtpu jit/8+fsdp+hp | bucketed | 120 | 0.60 |")
    assert lines[3].startswith("| 128 | jaxtpu jit/8+fsdp+hp+warm | bucketed | 100 | 0.62 |")
    assert lines[4].startswith("| 128 | torch eager | random, dynamic padding | 300 | 1.50 |")
    assert lines[5].startswith("| 128 | torch.compile | bucketed | 180 | 0.90 |")
    assert lines[6].startswith("| 128 | torch eager+hp | bucketed | 150 | 0.75 |")
    assert "error: timed out after 3600s" in lines[7]


def test_the_tpu_tuning_table_names_each_choice_and_says_it_is_an_estimate(tmp_path, monkeypatch):
    """benchmarks.training.tpu_tuning --report (kind tpu_tuning): a row per variant in the order
    run, named by what it changes, the compiler's estimate over the FLOP floor, the roofline beside
    it; a negative compiler figure (v4+ off a TPU) is shown in parentheses with no ratio."""

    def row(variant: str, est: float) -> dict:
        return {"preset": "bert-base", "model": "", "target": "v3-8", "max_len": 128,
                "batch_per_device": 32, "variant": variant, "est_step_s": est, "floor_s": 0.035,
                "vs_floor": est / 0.035 if est > 0 else None, "roofline_step_s": 0.048}  # fmt: skip

    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    rows = [row("default", 0.0579), row("tpu", 0.0492), row("gelu=tanh", -26.0)]
    path = measured.keep(
        tmp_path / "t.json", "tpu_tuning", rows, "benchmarks.training.tpu_tuning", []
    )
    shown = measured.render(path)
    lines = [line for line in shown.splitlines() if line.startswith("| ") and "`" in line]
    assert lines[0] == (
        "| as measured on the CPU: hash dropout, fp32 matmul results, erf GELU, ZeRO-1 | "
        "`default` | 0.0579 | 1.65 | 0.0480 |"
    )
    assert lines[1].startswith("| bf16 matmul results and FSDP (what a TPU gets with `auto`) |")
    assert "| `gelu=tanh` | (-26) | - | 0.0480 |" in lines[2]
    assert shown.startswith("bert-base, length 128, 32 per device, bf16, jit, on v3-8")
    assert "Estimated (not measured) " in shown and "Estimates, not measurements" in shown
    assert "Where `" not in shown  # no --breakdown: no groups
    # on v5e the program keeps arrays on the chip: the roofline is a range; --rates-of: columns
    v5e = {**row("tpu", -50.0), "target": "v5e-8", "roofline_step_s": 0.0158,
           "roofline_high_s": 0.0416, "roofline_at_v6e-8_s": 0.0079}  # fmt: skip
    lines = measured.render(measured.keep(
        tmp_path / "v5e.json", "tpu_tuning", [v5e], "benchmarks.training.tpu_tuning", []
    )).splitlines()  # fmt: skip
    assert lines[2].endswith("| roofline s/step | at v6e-8's rates |")
    assert lines[4].endswith("| `tpu` | (-50) | - | 0.0158-0.0416 | 0.0079 |")
    groups = [{"group": "fusion/loop      backward layer_N/attention/self", "count": 48,
               "bytes": 2.25e9, "seconds": 0.0052, "beyond_flops": 0.0049},
              {"group": "all operations", "count": 900, "bytes": 12.9e9, "seconds": 0.0484,
               "beyond_flops": 0.0135}]  # fmt: skip
    rows[1]["breakdown"] = groups  # --breakdown 1: the top group, then the step
    path = measured.keep(
        tmp_path / "t.json", "tpu_tuning", rows, "benchmarks.training.tpu_tuning", []
    )
    lines = measured.render(path).split("Where `tpu`'s step goes beyond its FLOPs")[1].splitlines()
    assert lines[4] == "| `fusion/loop backward layer_N/attention/self` | 48 | 2.25 | 5.20 | 4.90 |"
    assert lines[5] == "| **all operations** | 900 | 12.90 | 48.40 | 13.50 |"
    # --program, two targets' reports joined: a target column, each target's floor, and the
    # programs' table
    program = {"matmul_gflop": 357.71, "on_chip": 3279, "copy_starts": 255, "slice_starts": 200,
               "loops": 12, "windowed": 12}  # fmt: skip
    gb = {"est_gb_per_step": 5.49, "roofline_high_gb_per_step": 5.4894,
          "roofline_gb_per_step": 0.764}  # fmt: skip
    v3 = {**row("tpu", 0.0492), **gb, "program": {**program, "on_chip": 0}}
    v5 = {**v5e, **gb, "floor_s": 0.0182, "program": program}
    module = "benchmarks.training.tpu_tuning"
    paths = [
        measured.keep(tmp_path / f"{n}.json", "tpu_tuning", [r], module, [])
        for n, r in (("v3", v3), ("v5", v5))
    ]
    shown = measured.render_joined(paths)
    assert "on v3-8 (0.0350 s), v5e-8 (0.0182 s);" in shown
    assert "| `tpu` | v5e-8 | (-50) | - | 0.0158-0.0416 |" in shown
    assert "| v5e-8 | `tpu` | 357.7 | 5.49 | 5.49 | 0.76 | 3,279 | 255 | 200 | 12 | 12 |" in shown
    assert "| v3-8 | `tpu` | 357.7 | 5.49 | 5.49 | 0.76 | 0 | 255 |" in shown


def test_a_preflight_sweep_is_kept_with_preflights_own_table(tmp_path, monkeypatch, capsys):
    """benchmarks.training.preflight_sweep (kind preflight): preflight's JSON kept as it wrote it
    and shown with preflight's own table, the largest batch column when it searched; its flags
    after `--` are checked before any process starts."""
    from dataclasses import asdict

    from benchmarks.training import preflight_sweep
    from jaxtpu.preflight.report import Report

    def saved(sharding: str, largest: int) -> dict:
        r = Report(target="v3-8", sharding=sharding, remat="none", mesh="data=8,fsdp=1",
                   batch_size=largest, max_len=224, params=2 << 30, capacity=16 << 30,
                   total=15 << 30, extra={"largest_batch": largest})  # fmt: skip
        r.fits = True
        return asdict(r)

    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    record = {"target": "v3-8", "config": {}, "reports": [saved("replicated", 11)]}
    record["reports"].append(saved("zero1", 16))
    path = measured.keep(
        tmp_path / "p.json", "preflight", record, "benchmarks.training.preflight_sweep", []
    )
    shown = measured.render(path)
    rows = [line for line in shown.splitlines() if line.startswith("| replicated") or
            line.startswith("| zero1")]  # fmt: skip
    assert [r.split(" | ")[3] for r in rows] == ["11", "16"]  # largest batch/dev
    assert "| 2.00 GiB |" in rows[0] and "Estimated (not measured) " in shown
    for flags in ([], ["--", "--preset", "tiny", "--json", "x.json"]):
        with pytest.raises(SystemExit) as e:
            preflight_sweep.main(["--report", str(tmp_path / "r.json"), *flags])
        assert e.value.code == 2
    assert not (tmp_path / "r.json").exists()
