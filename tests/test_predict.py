"""Scoring a finished run (`jaxtpu.predict`, `jaxtpu.export`): output paths checked before
scoring, bad input refused with results kept, ensembles of unlike runs refused."""

from __future__ import annotations

import os

import pytest
from helpers import cli, one_line, one_line_exit_2, write

from jaxtpu.core.errors import UserError


@pytest.mark.e2e
def test_output_paths_are_checked_before_scoring(finished_run, tmp_path):
    to_score = tmp_path / "score.csv"
    to_score.write_text("comment_id,text\n1,hello\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    for output, message in [
        (a_file / "out.csv", "is not a directory"),
        (tmp_path, "is a directory"),
    ]:
        proc = cli(
            "jaxtpu.predict", "--workdir", finished_run, "--input", to_score, "--output", output
        )
        one_line(proc, f"--output {output}")
        assert message in proc.stderr
    proc = cli("jaxtpu.export", "--workdir", finished_run, "--out", a_file / "model")
    one_line(proc, "is not a directory")
    proc = cli("jaxtpu.export", "--workdir", finished_run, "--out", a_file)
    one_line(proc, "is not an empty directory")
    assert a_file.read_text() == "keep"


@pytest.mark.e2e
def test_predict_and_export_refuse_bad_input_and_keep_results(finished_run, tmp_path):
    out = write(tmp_path / "out.csv", "keep me\n")
    to_score = write(tmp_path / "score.csv", "comment_id,text\n1,hello\n")
    proc = cli(
        "jaxtpu.predict",
        "--workdir",
        str(finished_run),
        "--input",
        str(to_score),
        "--output",
        str(out),
    )
    assert proc.returncode == 2 and "exists; pass --overwrite" in proc.stderr
    assert out.read_text() == "keep me\n"
    proc = cli(
        "jaxtpu.predict",
        "--workdir",
        str(tmp_path),
        "--input",
        str(to_score),
        "--output",
        str(tmp_path / "new.csv"),
    )
    assert proc.returncode == 2 and "not a jaxtpu run directory" in proc.stderr
    proc = cli("jaxtpu.export", "--workdir", str(finished_run), "--out", str(tmp_path))
    assert proc.returncode == 2 and "is not an empty directory" in proc.stderr


def test_an_ensemble_of_other_tasks_or_tokenizers_is_refused(tmp_path, minilm_dir):
    from types import SimpleNamespace

    from jaxtpu.core.tasks import get_task
    from jaxtpu.engine.scoring import check_ensemble

    other_tok = tmp_path / "tok"
    from jaxtpu.core.data.tokens import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    tok.add_tokens(["zzzunseen"])
    tok.save_pretrained(other_tok)

    from jaxtpu.core.flags.schema import Config

    def model(task, tokenizer_dir, prompt=""):
        fmt = Config().replace(prompt_template=prompt, task=task).text_format
        return SimpleNamespace(
            spec=SimpleNamespace(task=get_task(task), pad_id=None, text_format=fmt),
            tokenizer_dir=tokenizer_dir,
        )

    with pytest.raises(UserError, match="--workdir B is a ranking run, A a toxicity run"):
        check_ensemble([model("toxicity", minilm_dir), model("ranking", minilm_dir)], ["A", "B"])
    with pytest.raises(UserError, match="--workdir B has another tokenizer than A"):
        check_ensemble([model("toxicity", minilm_dir), model("toxicity", other_tok)], ["A", "B"])
    with pytest.raises(UserError, match="B reads each row as --prompt-template 'Toxic.*A as"):
        check_ensemble(
            [model("toxicity", minilm_dir), model("toxicity", minilm_dir, "Toxic? {comment}")],
            ["A", "B"],
        )
    check_ensemble([model("toxicity", minilm_dir), model("toxicity", minilm_dir)], ["A", "B"])


# ------------------------------------------------- one predict per output, resumes that match


def _predict_argv(run, src, out, *extra: str) -> list[str]:
    return [
        "--workdir",
        str(run),
        "--input",
        str(src),
        "--output",
        str(out),
        "--num-devices",
        "1",
        "--chunk-rows",
        "16",
        *extra,
    ]


def _numbered(path, n: int = 40, bad_row: int | None = None):
    rows = [f"{i},comment number {i}".encode() for i in range(n)]
    if bad_row is not None:
        rows[bad_row] = b"%d,caf\xe9" % bad_row  # not UTF-8
    path.write_bytes(b"id,comment_text\n" + b"\n".join(rows) + b"\n")
    return path


@pytest.mark.e2e
@pytest.mark.model
def test_a_resumed_predict_refuses_an_input_edited_in_place(
    finished_run, tmp_path, monkeypatch, capsys
):
    from jaxtpu import predict

    src, out = _numbered(tmp_path / "in.csv"), tmp_path / "out.csv"
    argv = _predict_argv(finished_run, src, out)
    from jaxtpu.engine import predictions

    save = predictions.Progress.save

    def stopped_after_one_chunk(self, rows, size, digest, *written):
        save(self, rows, size, digest, *written)
        raise KeyboardInterrupt

    monkeypatch.setattr(predictions.Progress, "save", stopped_after_one_chunk)
    with pytest.raises(SystemExit):
        predict.main(argv)
    monkeypatch.setattr(predictions.Progress, "save", save)
    capsys.readouterr()
    before = src.stat()
    # Row 3 (scored before the stop) edited in place: same size, same modification time.
    src.write_bytes(src.read_bytes().replace(b"comment number 3\n", b"comment NUMBER 3\n"))
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (src.stat().st_size, src.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    err = one_line_exit_2(capsys, lambda: predict.main([*argv, "--resume"]))
    assert "the first 16 rows of --input" in err and "are not the ones" in err
    assert out.with_name(".out.csv.partial").exists()  # the stopped predict's rows are kept
    # An edit after where it stopped is new work: the resumed predict scores it.
    _numbered(src)
    src.write_bytes(src.read_bytes().replace(b"comment number 30\n", b"comment NUMBER 30\n"))
    assert predict.main([*argv, "--resume"]) == 0
    fresh = tmp_path / "fresh.csv"
    assert predict.main(_predict_argv(finished_run, src, fresh)) == 0
    assert out.read_bytes() == fresh.read_bytes()


@pytest.mark.e2e
@pytest.mark.model
def test_a_second_predict_into_the_same_output_is_refused(finished_run, tmp_path, capsys):
    from jaxtpu import predict
    from jaxtpu.core import files

    src, out = _numbered(tmp_path / "in.csv"), tmp_path / "out.csv"
    lock = tmp_path / ".out.csv.lock"
    fd, _ = files.take_lock(lock)  # what a predict into out.csv holds while it writes
    try:
        err = one_line_exit_2(capsys, lambda: predict.main(_predict_argv(finished_run, src, out)))
    finally:
        files.release_lock(fd)
    assert f"--output {out} is being written by another predict (process {os.getpid()}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.csv.lock", "in.csv"]
    assert predict.main(_predict_argv(finished_run, src, out)) == 0  # once it has ended
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.csv"]


@pytest.mark.e2e
@pytest.mark.model
@pytest.mark.parametrize(
    "rows, bad_row, message",
    [(0, None, "but no data rows"), (40, 30, "not UTF-8 text (byte 0xe9 at line 32)")],
    ids=["header only", "a bad byte after the first chunk"],
)
def test_a_refused_predict_leaves_nothing_that_looks_stopped(
    finished_run, tmp_path, capsys, rows, bad_row, message
):
    from jaxtpu import predict

    src, out = _numbered(tmp_path / "in.csv", rows, bad_row), tmp_path / "out.csv"
    with pytest.raises(SystemExit) as e:
        predict.main(_predict_argv(finished_run, src, out))
    err = capsys.readouterr().err  # the chunks scored before the bad row, then the error
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: ") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


# ------------------------------------------------------ a directory that is not a run


def test_predict_and_evaluate_of_a_hugging_face_directory_say_what_it_is(
    minilm_dir, tmp_path, capsys
):
    from jaxtpu import evaluate, predict

    src = _numbered(tmp_path / "in.csv", 4)
    for main, extra in [(predict.main, ["--output", str(tmp_path / "o.csv")]), (evaluate.main, [])]:
        argv = ["--workdir", minilm_dir, "--input", str(src), "--num-devices", "1", *extra]
        err = one_line_exit_2(capsys, lambda main=main, argv=argv: main(argv))
        assert "is a Hugging Face model directory, not a jaxtpu run directory" in err
        assert "--model-dir" in err


@pytest.mark.parametrize(
    "problem_type, labels, pairs, said",
    [
        ("multi_label_classification", ("toxic",), False, None),
        ("regression", ("score",), False, "problem_type regression"),  # issue 58: was silent
        (None, ("LABEL_0",), False, "one label and no problem_type"),
        ("regression", ("score",), True, None),  # a ranker's pairs: only the order counts
        ("multi_label_classification", ("LABEL_0", "LABEL_1") + ("x",) * 4, False, None),
    ],
)
def test_a_one_output_regression_head_is_said_to_be_one(capsys, problem_type, labels, pairs, said):
    """`--model-dir` of a classifier whose one output transformers trains as a regression
    (problem_type regression, or unset with one label) was scored through a sigmoid and
    written as probabilities without a word."""
    from jaxtpu.core.hf.heads import ClassifierConfig
    from jaxtpu.engine.scoring import classifier_task

    head = ClassifierConfig(labels, problem_type, None)
    if len(labels) == 6:  # six labels, not the Jigsaw ones nor LABEL_i: refused
        with pytest.raises(UserError, match="its head scores 6 labels"):
            classifier_task("m", head, pairs)
        return
    task = classifier_task("m", head, pairs)
    assert task == ("ranking" if pairs else "toxicity")
    err = capsys.readouterr().err
    if said is None:
        assert err == ""
    else:
        assert err.startswith(f"warning: --model-dir m: its head is a regression output ({said}")
        assert "not make them probabilities" in err and err.count("\n") == 1


def _models(task_name: str, aux: tuple[str, ...] = ()) -> list:
    from types import SimpleNamespace

    from jaxtpu.core.tasks import get_task

    task = get_task(task_name).with_aux(aux, 1.0)
    return [SimpleNamespace(spec=SimpleNamespace(task=task))]


@pytest.mark.parametrize(
    "task, header, flags, message",
    [
        ("toxicity", ["body", "rule"], {}, "a toxicity model scores labelled comments"),
        ("rules", ["comment_text"], {}, "a rules model scores an Agile Community Rules file"),
        ("rules", ["less_toxic", "more_toxic"], {}, "this is a pairs file"),
        ("toxicity", ["x"], {}, "this is a file of unknown layout"),
        ("rules", ["body", "rule"], {"pseudo_label": True}, "scored as row_id,rule_violation"),
        ("toxicity", ["comment_text"], {"rank_by_rule": True}, "--rank-by-rule ranks"),
        ("toxicity", ["comment_id", "text"], {"label_weights": "1"}, "a toxicity model on that"),
        ("multilabel", ["comment_id", "text"], {"all_outputs": True}, "one score per comment"),
        ("ranking", ["comment_text"], {"pseudo_label": True}, "not probabilities"),
    ],
)
def test_predict_refuses_a_file_or_flag_its_model_and_the_file_kind_do_not_fit(
    task, header, flags, message
):
    """`predictions.check_fits` reads the task's `predicts` and the file kind's record
    (`core/data/filekinds.py`): each refusal is one line, before anything is scored."""
    from types import SimpleNamespace

    from jaxtpu.core.data.filekinds import kind_of
    from jaxtpu.engine.predictions import check_fits

    args = dict(input="in.csv", pseudo_label=False, rank_by_rule=False, label_weights="")
    args = SimpleNamespace(**{**args, "all_outputs": False, **flags})
    with pytest.raises(UserError, match=message):
        check_fits(args.input, vars(args), _models(task), kind_of(header))
    # what fits passes: each task on a file it scores, the flags that go with it
    fits = [
        ("rules", ["body", "rule"], {"rank_by_rule": True}),
        ("multilabel", ["comment_id", "text"], {"label_weights": "1"}),
        ("toxicity", ["comment_text"], {"pseudo_label": True}),
        ("ranking", ["comment_id", "text"], {}),
    ]
    for task_name, fitting, more in fits:
        fine = {**vars(args), **dict.fromkeys(flags, False), **more}
        check_fits(args.input, fine, _models(task_name), kind_of(fitting))


def test_every_file_kind_a_task_names_is_in_the_table_and_headers_match_in_order():
    from jaxtpu.core.data.filekinds import BY_NAME, kind_of
    from jaxtpu.core.tasks import TASKS

    for task in TASKS.values():
        assert {*task.reads, task.evaluated_on, *task.predicts} <= set(BY_NAME), task.name
    found = {
        ("body", "rule", "comment_text", "toxic"): "rules",  # a rules file first
        ("less_toxic", "more_toxic", "comment_text", "toxic"): "pairs",
        ("id", "content", "target"): "classification",
        ("comment_id", "text"): "score",
        ("id", "content", "lang"): "unlabelled",
    }
    for header, name in found.items():
        assert kind_of(list(header)).name == name, header
    assert kind_of(["id", "toxic"]) is None
