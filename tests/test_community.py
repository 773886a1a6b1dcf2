"""`jaxtpu train --init-from RUN --train-csv DECISIONS` (issue 88 item 2): RUN's model flags
taken (`core.flags.fromrun`), the newest decisions held out by time, RUN's rows replayed
without a validation text, blank columns left blank, RUN's validation rows written to score at
the end (`core.data.community`); and one run end to end."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import JIGSAW_HEADER, TINY, cli

from jaxtpu.core.calibration import Calibration, fit
from jaxtpu.core.data import community
from jaxtpu.core.data.readers import parse_time
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags import fromrun
from jaxtpu.core.flags.schema import Config, apply_overrides
from jaxtpu.core.tasks import LABELS

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _run_dir(tmp_path: Path, cfg: Config) -> Path:
    """A directory with what a finished run records of its flags (config.json)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": cfg.to_dict()}))
    return run


def _jigsaw_file(path: Path, n: int, start: int = 0) -> Path:
    """`n` comments with all six labels, every fourth toxic (and obscene), texts unique."""
    with path.open("w", newline="") as f:
        f.write(JIGSAW_HEADER)
        w = csv.writer(f)
        for i in range(start, start + n):
            tox = int(i % 4 == 0)
            w.writerow([f"r{i}", f"old comment {i}", tox, 0, tox, 0, 0, 0])
    return path


def _decisions(path: Path, n: int, times: list[dt.datetime] | None = None, shared: int = -1):
    """`jaxtpu feedback export`'s layout: toxic alone decided, the other labels blank, a
    community and a time; row `shared` (if any) repeats an old comment's text."""
    times = times or [T0 + dt.timedelta(minutes=i) for i in range(n)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", *LABELS, "community", "time"])
        for i in range(n):
            text = "old comment 0" if i == shared else f"decided comment {i}"
            w.writerow([f"d{i}", text, i % 2, "", "", "", "", "", "forum", times[i].isoformat()])
    return path


def _base(tmp_path: Path, **flags) -> tuple[Path, Config]:
    """A multilabel RUN that trained on 40 rows of its file (10 held out) and the config
    of a run continuing it on the decisions."""
    old = _jigsaw_file(tmp_path / "old.csv", 40)
    base = apply_overrides(
        Config(), {"task": "multilabel", "train_csv": str(old), "valid_fraction": 0.25}
    )
    run = _run_dir(tmp_path, base)
    over = {"init_from": str(run), "train_csv": str(tmp_path / "decisions.csv"), **flags}
    return old, apply_overrides(Config(), fromrun.inherit(over, Config()))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_run_directory_lends_its_model_flags_and_refuses_another_task(tmp_path, capsys):
    base = apply_overrides(Config(), {"task": "multilabel", "max_len": 64, "model_dir": ""})
    run = str(_run_dir(tmp_path, base))
    got = fromrun.inherit({"init_from": run, "lr": 1e-5}, Config())
    assert (got["task"], got["max_len"], got["model_dir"], got["lr"]) == (
        "multilabel",
        64,
        "",
        1e-5,
    )
    assert got["time_column"] == "time"
    said = capsys.readouterr().err
    assert "--task multilabel" in said and "--max-len 64" in said and "--time-column time" in said
    assert "--lr" not in said  # given, not taken
    assert fromrun.inherit({"init_from": run, "max_len": 32}, Config())["max_len"] == 32
    assert "time_column" not in fromrun.inherit({"init_from": run, "valid_csv": "v.csv"}, Config())
    with pytest.raises(ConfigError, match="that run has --task multilabel"):
        fromrun.inherit({"init_from": run, "task": "toxicity"}, Config())
    # a notebook's state-dict file is not a run: nothing taken
    assert fromrun.inherit({"init_from": str(tmp_path / "x.bin")}, Config()) == {
        "init_from": str(tmp_path / "x.bin")
    }


def test_the_newest_decisions_validate_ties_keep_the_files_order(tmp_path):
    # out of order in the file; rows 2 and 4 tie at 9 minutes, next to the newest
    minutes = [5, 1, 9, 30, 9, 2, 7, 8, 3, 4]
    times = [T0 + dt.timedelta(minutes=m) for m in minutes]
    _decisions(tmp_path / "decisions.csv", 10, times)
    _, cfg = _base(tmp_path, valid_fraction=0.2, replay_csv=str(tmp_path / "old.csv"))
    read_cfg, prep = community.prepare(cfg, tmp_path / "new")
    valid = _rows(Path(prep.valid_csv))
    assert [r["id"] for r in valid] == ["d3", "d4"]  # 30 minutes, then the later of the tie
    assert (prep.train_rows, prep.valid_rows) == (8, 2)
    assert prep.first == times[1].isoformat() and prep.last == times[3].isoformat()
    assert prep.valid_from == times[4].isoformat()
    assert prep.communities == ["forum"]
    assert read_cfg.data.train_csv == prep.train_csv and read_cfg.data.valid_csv == prep.valid_csv
    assert read_cfg.data.time_column == "" and read_cfg.data.replay_csv is None


def test_replayed_rows_never_hold_a_validation_text_and_blank_labels_stay_blank(tmp_path):
    _decisions(tmp_path / "decisions.csv", 20, shared=3)  # d3 repeats an old comment
    old, cfg = _base(tmp_path, valid_fraction=0.2, replay_csv=str(tmp_path / "old.csv"))
    _, prep = community.prepare(cfg, tmp_path / "new")
    original = _rows(Path(prep.original_valid))
    assert len(original) == 10  # RUN's 25% of 40 rows
    train = _rows(Path(prep.train_csv))
    new, replayed = train[:16], train[16:]
    assert [r["id"] for r in new] == [f"d{i}" for i in range(16)]
    assert all(r["obscene"] == "" and r["toxic"] in ("0", "1") for r in new)
    held = {r["comment_text"] for r in original} | {
        r["comment_text"] for r in _rows(Path(prep.valid_csv))
    }
    # as many replayed rows as new ones (--replay-share 0.5), none a validation text
    assert len(replayed) == prep.replayed == 16
    assert not held & {r["comment_text"] for r in replayed}
    assert all(r["obscene"] in ("0", "1") for r in replayed)
    # RUN's validation rows are the rows RUN held out, read again
    old_texts = {r["comment_text"] for r in _rows(old)}
    assert {r["comment_text"] for r in original} <= old_texts
    assert json.loads((tmp_path / "new" / "community" / "summary.json").read_text())["rows"] == 20


def test_a_continued_run_refuses_what_it_cannot_use_in_one_line(tmp_path):
    _decisions(tmp_path / "decisions.csv", 10)
    # toxic alone and no replay: the other five labels would learn from nothing
    _, cfg = _base(tmp_path, valid_fraction=0.3)
    with pytest.raises(DataError, match="add --replay-csv"):
        community.prepare(cfg, tmp_path / "a")
    # the newest decisions all of one class
    path = tmp_path / "decisions.csv"
    rows = _rows(path)
    for r in rows[-3:]:
        r["toxic"] = "1"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    replay = str(tmp_path / "old.csv")
    cfg = cfg.replace(replay_csv=replay)
    with pytest.raises(DataError, match=r"the 3 rows held out to validate .* are all toxic"):
        community.prepare(cfg, tmp_path / "b")
    with pytest.raises(DataError, match="no such column.*--time-column ''"):
        community.prepare(cfg.replace(time_column="when"), tmp_path / "c")
    with pytest.raises(ConfigError, match="give the new rows with --train-csv"):
        community.prepare(cfg.replace(train_csv="sample"), tmp_path / "d")
    with pytest.raises(ConfigError, match="--replay-csv .* give the run with --init-from"):
        apply_overrides(Config(), {"replay_csv": replay})
    # RUN's recorded training file is gone from where it was: said why it is read
    _decisions(tmp_path / "decisions.csv", 10)
    Path(replay).rename(tmp_path / "moved.csv")
    with pytest.raises(DataError, match=r"read again from its --train-csv .*old.csv, which is not"):
        community.prepare(cfg.replace(replay_csv=str(tmp_path / "moved.csv")), tmp_path / "e")


def test_a_choice_on_few_held_out_rows_of_a_class_is_said_to_be_weak():
    """A handful of one class among the held-out decisions: the warning names the count and
    the class; ten or more of each: nothing to say."""
    assert "only 1 of the 60 rows held out to validate are toxic (>= 0.5)" in (
        community.few_held_out(1, 60)
    )
    assert "only 3 of the 60 rows held out to validate are not toxic (< 0.5)" in (
        community.few_held_out(57, 60)
    )
    assert community.few_held_out(10, 60) == community.few_held_out(50, 60) == ""


def test_a_model_that_lost_more_than_the_tolerance_of_runs_validation_is_warned_of():
    """The closing warning when RUN's validation fell by more than 0.01 (a fine-tune on a
    forum whose rule contradicts the labels did lose 0.53); none within it, when it rose,
    when it was not scored or is NaN."""
    from jaxtpu.engine.community import forgetting

    def compared(before: float, after: float) -> dict:
        return {"original": {"metric": "mean_column_auc", "before": before, "after": after}}

    lost = forgetting(compared(0.9360, 0.4101), "runs/base")
    assert "--init-from runs/base" in lost and "fell 0.5259 (0.9360 -> 0.4101)" in lost
    assert forgetting(compared(0.9360, 0.9300), "r") == ""  # within 0.01
    assert forgetting(compared(0.9360, 0.9500), "r") == ""
    assert forgetting(compared(0.9360, float("nan")), "r") == ""
    assert forgetting({}, "r") == ""


def test_times_are_iso_8601_or_numbers():
    assert parse_time("2026-11-01T00:00:00") == T0.timestamp()
    assert parse_time("2026-11-01T01:00:00+01:00") == T0.timestamp()
    assert parse_time("1700000000.5") == 1700000000.5
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_a_calibration_column_without_labelled_rows_is_null_in_its_record():
    logits = np.array([[0.1, 0.2], [2.0, -1.0], [-2.0, 0.5]])
    labels = np.array([[0.0, np.nan], [1.0, np.nan], [0.0, np.nan]])
    cal = fit(logits, labels, ("toxic", "obscene"))
    record = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    assert record["before"]["ece"][1] is None
    back = Calibration.from_dict(record, "x")
    assert np.isnan(back.before["ece"][1]) and "obscene (no labelled row)" in back.describe()


@pytest.mark.e2e
def test_a_run_continues_another_on_decisions_and_reports_both_validations(
    finished_run: Path, tmp_path: Path
):
    """The tiny run of the fixtures continued on 60 decisions for 3 steps: it starts from that
    run's weights (the model line says so), validates on the newest 20%, and its closing line
    and community/compared.json give both validations under both models."""
    from jaxtpu.core.data.demo import SAMPLE_CSV

    sample = _rows(Path(SAMPLE_CSV))[:60]
    path = tmp_path / "decisions.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", "community", "time"])
        for i, r in enumerate(sample):
            w.writerow(
                [r["id"], r["comment_text"], r["toxic"], "forum", T0 + dt.timedelta(hours=i)]
            )
    wd = tmp_path / "forum"
    args = ["--init-from", finished_run, "--train-csv", path, "--valid-fraction", "0.2"]
    proc = cli("jaxtpu.train", *TINY, *args, "--workdir", wd, "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert f"from {finished_run}" in out
    assert "48 train, 12 validate (the newest 20% by time)" in out
    compared = json.loads((wd / "community" / "compared.json").read_text())
    assert compared["community"]["examples"] == 12
    assert compared["original"]["examples"] > 0
    assert f"against --init-from {finished_run}: new rows held out (12 rows" in out
    held_toxic = sum(float(r["toxic"]) >= 0.5 for r in sample[48:])
    weak = community.few_held_out(held_toxic, 12)  # 12 rows: fewer than 10 of a class
    assert weak and weak in out
    for part in compared.values():
        assert 0.0 <= part["before"] <= 1.0 and 0.0 <= part["after"] <= 1.0
    # what a model card says of it: counts, dates, the community; never a text
    card = community.record(wd)
    assert card is not None
    assert (card["rows"], card["valid_rows"], card["communities"]) == (60, 12, ["forum"])
    assert card["first"] == T0.isoformat() and card["compared"] == compared
    said = json.dumps(card)
    assert not any(r["comment_text"] in said for r in sample)
    assert community.record(finished_run) is None
