"""Input files (`jaxtpu.core.data.readers`, `taskdata`): bad files and bad values refused in
one line through the real commands on both sides, long texts truncated, labels a task
needs checked."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    EAGER,
    JIGSAW_HEADER,
    SIDE_COMMANDS,
    TINY,
    cli,
    one_line,
    one_line_in_process,
    write,
)

from jaxtpu.core.data import demo, readers, taskdata, tokens
from jaxtpu.core.errors import DataError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDE_COMMANDS)
def test_a_csv_with_a_repeated_column_is_refused(tmp_path, side):
    module, base = SIDE_COMMANDS[side]
    csv = tmp_path / "dup.csv"
    csv.write_text("comment_text,toxic,toxic\nhello,1,0\n")
    proc = cli(module, *base, "--workdir", tmp_path / "run", "--train-csv", csv)
    one_line(proc, "column toxic appears 2 times")


def _sample_without_sublabels(tmp_path: Path, blank: bool) -> Path:
    rows = readers.read_comments(demo.SAMPLE_CSV)
    lines = [
        "id,comment_text,toxic"
        + (",severe_toxic,obscene,threat,insult,identity_hate" if blank else "")
    ]
    for i, (text, y) in enumerate(zip(rows.texts[:300], rows.labels[:300], strict=True)):
        lines.append(f'{i},"{text.replace(chr(34), "")}",{int(y)}' + (",,,,," if blank else ""))
    path = tmp_path / ("blank.csv" if blank else "toxic-only.csv")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("blank", [False, True], ids=["no columns", "all blank"])
def test_multilabel_without_sub_labels_is_refused(tmp_path, blank):
    cfg = tiny().replace(
        task="multilabel", train_csv=str(_sample_without_sublabels(tmp_path, blank))
    )
    with pytest.raises(DataError, match="no value in any of the label columns severe_toxic"):
        taskdata.load_task_data(cfg, tokens.load_tokenizer(RunSpec.resolve(cfg).tokenizer_dir))


def test_a_label_left_out_of_the_mean_is_named_in_the_log(caplog):
    from jaxtpu.core.tasks import LABELS, get_task

    labels = np.zeros((8, 6), np.float32)
    labels[::2] = 1.0
    labels[:, LABELS.index("threat")] = 0.0  # one class in the validation set
    scores = np.random.default_rng(0).normal(size=(8, 6))
    with caplog.at_level(logging.WARNING, logger="jaxtpu"):
        out = get_task("multilabel").validation_metrics(scores, labels, np.zeros(8), np.ones(8))
    assert "val_auc_threat" not in out and "mean over 5 of 6 labels: threat left out" in caplog.text


def test_an_unreadable_csv_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "train.csv"
    path.write_text(JIGSAW_HEADER + "1,hello,0,0,0,0,0,0\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)  # root reads anything: make it fail
    with pytest.raises(DataError, match=r"train.csv: cannot be read \(Permission denied\)"):
        readers.read_comments(path)


GOOD_ROWS = "".join(
    f"{i},comment number {i} {'idiot' * (i % 3 == 0)},{int(i % 3 == 0)},0,0,0,0,0\n"
    for i in range(60)
)


@pytest.fixture(scope="module")
def files(tmp_path_factory, minilm_dir):
    d = tmp_path_factory.mktemp("bad")
    good = write(d / "good.csv", JIGSAW_HEADER + GOOD_ROWS)
    other_size = d / "other-size-model"
    shutil.copytree(minilm_dir, other_size)
    cfg = json.loads((other_size / "config.json").read_text())
    (other_size / "config.json").write_text(json.dumps({**cfg, "hidden_size": 768}))
    no_tok = d / "no-tokenizer-model"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(minilm_dir) / name, no_tok / name)
    return {
        "dir": d,
        "good": good,
        "missing_col": write(d / "missing.csv", "id,text\n1,hello\n"),
        "empty": write(d / "empty.csv", ""),
        "header_only": write(d / "header.csv", JIGSAW_HEADER),
        "label_2": write(d / "l2.csv", JIGSAW_HEADER + GOOD_ROWS + "99,x,2,0,0,0,0,0\n"),
        "label_neg": write(d / "lneg.csv", JIGSAW_HEADER + "99,x,-1,0,0,0,0,0\n" + GOOD_ROWS),
        "label_yes": write(d / "lyes.csv", JIGSAW_HEADER + GOOD_ROWS + "99,x,yes,0,0,0,0,0\n"),
        "nan_comments": write(
            d / "nan.csv", JIGSAW_HEADER + '1,,1,0,0,0,0,0\n2,"   ",0,0,0,0,0,0\n'
        ),
        "single_row": write(d / "single.csv", JIGSAW_HEADER + "1,hello there,1,0,0,0,0,0\n"),
        "latin1": write(
            d / "latin1.csv", (JIGSAW_HEADER + "1,caf\xe9,1,0,0,0,0,0\n").encode("latin-1")
        ),
        "other_size": other_size,
        "no_tokenizer": no_tok,
        "a_file": write(d / "a-file", "not a directory"),
    }


BAD = [
    (
        "missing column",
        lambda f: ["--train-csv", f["missing_col"]],
        "missing columns; found: id, text",
    ),
    ("empty csv", lambda f: ["--train-csv", f["empty"]], "file is empty"),
    ("header only", lambda f: ["--train-csv", f["header_only"]], "but no data rows"),
    ("label 2", lambda f: ["--train-csv", f["label_2"]], "line 62: toxic=2 is outside [0, 1]"),
    ("label -1", lambda f: ["--train-csv", f["label_neg"]], "line 2: toxic=-1 is outside [0, 1]"),
    ("label yes", lambda f: ["--train-csv", f["label_yes"]], "toxic='yes' is not a number"),
    ("nan/empty comments", lambda f: ["--train-csv", f["nan_comments"]], "all 2 rows dropped"),
    ("single row", lambda f: ["--train-csv", f["single_row"]], "too few to split"),
    ("not utf-8", lambda f: ["--train-csv", f["latin1"]], "not UTF-8 text (byte 0xe9 at line 2)"),
    ("directory as csv", lambda f: ["--train-csv", f["dir"]], "is a directory, expected a CSV"),
    (
        "model of another size",
        lambda f: ["--model-dir", f["other_size"]],
        "tensor embeddings.LayerNorm.bias has shape (384,), the model expects (768,)",
    ),
    ("missing tokenizer", lambda f: ["--model-dir", f["no_tokenizer"]], "no tokenizer found"),
    (
        "batch larger than data",
        lambda f: ["--train-csv", f["good"], "--batch-size", "64"],
        "is larger than the 54 training comments",
    ),
    (
        "more devices than exist",
        lambda f: ["--num-devices", "8"],
        "--num-devices 8: only 4 cpu device(s) available",
    ),
    ("workdir not writable", lambda f: ["--workdir", f["a_file"] / "run"], "is not writable"),
    ("unknown flag", lambda f: ["--learning-rate", "1"], "unrecognized arguments: --learning-rate"),
    ("bad value", lambda f: ["--epochs", "many"], "invalid int value: 'many'"),
    (
        "process id out of range",
        lambda f: [
            "--num-processes",
            "2",
            "--process-id",
            "2",
            "--coordinator-address",
            "127.0.0.1:1",
        ],
        "--process-id must be in 0..1, got 2",
    ),
    (
        "processes without coordinator",
        lambda f: ["--num-processes", "2"],
        "--num-processes > 1 needs --coordinator-address",
    ),
]


TORCH_BAD = [
    "missing column",
    "label 2",
    "label yes",
    "nan/empty comments",
    "not utf-8",
    "model of another size",
    "missing tokenizer",
    "batch larger than data",
    "workdir not writable",
    "unknown flag",
]


TORCH_BAD_ARGS = [
    *(b for b in BAD if b[0] in TORCH_BAD),
    (
        "multi-host flags",
        lambda f: ["--num-processes", "2", "--coordinator-address", "h:1"],
        "multi-host runs are jaxtpu only",
    ),
]


def _bad_argv(files: dict, tmp_path: Path, args) -> list[str]:
    argv = [str(a) for a in args(files)]
    return argv if "--workdir" in argv else [*argv, "--workdir", str(tmp_path / "run")]


# A host whose device count is fixed (4 here) needs a process of its own; the other refusals
# run the command in this process (`one_line_in_process`: the same exit code, line and no
# traceback, without a fresh interpreter's import and start).
IN_PROCESS = [b for b in BAD if b[0] != "more devices than exist"]


@pytest.mark.model  # some refusals come after the model is built
@pytest.mark.parametrize("name,args,message", IN_PROCESS, ids=[b[0] for b in IN_PROCESS])
def test_bad_input_gives_one_clear_line_and_no_traceback(
    files, tmp_path, capsys, name, args, message
):
    from jaxtpu import train

    argv = [*TINY, *_bad_argv(files, tmp_path, args)]
    one_line_in_process(capsys, lambda: train.main(argv), message)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.e2e
def test_more_devices_than_the_host_has_is_one_line(files, tmp_path):
    ((name, args, message),) = [b for b in BAD if b[0] == "more devices than exist"]
    env = {"JAX_NUM_CPU_DEVICES": "4"}  # as a host whose device count is fixed
    proc = cli("jaxtpu.train", *TINY, *_bad_argv(files, tmp_path, args), env=env)
    one_line(proc, message)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.torch
@pytest.mark.parametrize("name,args,message", TORCH_BAD_ARGS, ids=[b[0] for b in TORCH_BAD_ARGS])
def test_bad_input_through_the_torch_side(files, tmp_path, capsys, name, args, message):
    from torchxla_ref import train as torch_train

    # eager on one device: in this process, spmd would stay on for every later torch test
    argv = [*EAGER, *_bad_argv(files, tmp_path, args)]
    one_line_in_process(capsys, lambda: torch_train.main(argv), message)


@pytest.mark.e2e
def test_texts_far_longer_than_max_len_are_truncated_and_train(files, tmp_path):
    long = JIGSAW_HEADER + "".join(f"{i},{'word ' * 3000},{i % 2},0,0,0,0,0\n" for i in range(64))
    proc = cli(
        "jaxtpu.train",
        *TINY,
        "--train-csv",
        str(write(tmp_path / "long.csv", long)),
        "--workdir",
        str(tmp_path / "run"),
        "--batch-size",
        "2",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
