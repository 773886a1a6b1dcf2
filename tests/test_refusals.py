"""Reliability, second pass: the newer features under bad input, kills and stale state. Each
refusal is one line before anything is created (exit code 2 through a command), nothing
half-written stays behind, and no run silently trains something else. Both sides read
checkpoints, tokenizers, files and run directories through the same framework-free code
(`jaxtpu.core`); the torch side is also driven through its own command where it has one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from jaxtpu import export, train
from jaxtpu.core import files
from jaxtpu.core.data import demo, readers, taskdata, tokens
from jaxtpu.core.errors import CheckpointError, ConfigError, DataError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.hf.directory import read_torch_file
from jaxtpu.core.hf.encoder import EncoderConfig, read_encoder
from jaxtpu.preflight import command as pf_command
from jaxtpu.preflight import fit as pf_fit
from jaxtpu.preflight import report as pf_report

HEADER = "id,comment_text,toxic,severe_toxic,obscene,threat,insult,identity_hate\n"


def one_line_exit_2(capsys, call) -> str:
    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def torch_main(argv):
    from torchxla_ref import train as torch_train

    return torch_train.main(["--parallel", "eager", "--num-devices", "1", *argv])


SIDES = {"jaxtpu": train.main, "torchxla_ref": torch_main}


# 1. silently training something else ------------------------------------------------------


def test_a_config_without_model_type_takes_its_family_from_architectures_or_is_refused(caplog):
    roberta = {
        "architectures": ["RobertaForSequenceClassification"],
        "pad_token_id": 1,
        "max_position_embeddings": 130,
        "type_vocab_size": 1,
    }
    with caplog.at_level(logging.WARNING, logger="jaxtpu"):
        assert EncoderConfig.from_hf_dict(roberta).model_type == "roberta"
    assert "no model_type; roberta from architectures" in caplog.text
    assert EncoderConfig.from_hf_dict({"architectures": ["XLMRobertaModel"]}).model_type == (
        "xlm-roberta"
    )
    with pytest.raises(ConfigError, match='no model_type and no architectures; add "model_type"'):
        EncoderConfig.from_hf_dict({"hidden_size": 64})
    with pytest.raises(ConfigError, match="name no supported family"):
        EncoderConfig.from_hf_dict({"architectures": ["GPT2Model"]})


@pytest.fixture(scope="module")
def two_layers_said_one(tmp_path_factory, minilm_dir) -> Path:
    """MiniLM's directory whose config.json says 5 layers: its 6th layer has no place."""
    d = tmp_path_factory.mktemp("five") / "model"
    shutil.copytree(minilm_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 5}))
    return d


@pytest.mark.parametrize("side", SIDES)
def test_tensors_the_config_does_not_describe_are_refused(
    two_layers_said_one, capsys, tmp_path, side
):
    wd = tmp_path / "run"
    err = one_line_exit_2(
        capsys,
        lambda: SIDES[side](
            [
                "--preset",
                "tiny",
                "--model-dir",
                str(two_layers_said_one),
                "--max-steps",
                "1",
                "--workdir",
                str(wd),
            ]
        ),
    )
    assert "tensor(s) the model has no place for (first: encoder.layer.5." in err
    assert not wd.exists()  # a refused run leaves nothing


@pytest.mark.parametrize("side", SIDES)
def test_a_tokenizer_beyond_the_embedding_table_is_refused_and_leaves_nothing(
    capsys, tmp_path, side
):
    wd = tmp_path / "run"
    err = one_line_exit_2(
        capsys,
        lambda: SIDES[side](
            ["--preset", "tiny", "--vocab-size", "1000", "--max-steps", "1", "--workdir", str(wd)]
        ),
    )
    assert "has 30522 tokens but the encoder's embedding table has 1000 rows" in err
    assert not wd.exists()


@pytest.mark.model
def test_a_refused_run_leaves_no_tokenizer_and_a_run_writes_its_own(tmp_path, capsys, minilm_dir):
    wd = tmp_path / "run"
    wd.mkdir()  # made by the user: kept, but emptied of what the refused run added
    one_line_exit_2(
        capsys,
        lambda: train.main(["--preset", "tiny", "--vocab-size", "1000", "--workdir", str(wd)]),
    )
    assert sorted(p.name for p in wd.iterdir()) == []
    stale = wd / "tokenizer"
    stale.mkdir()
    (stale / "tokenizer.json").write_text("{}")  # an earlier run's, not this one's
    assert train.main(["--preset", "tiny", "--max-steps", "2", "--workdir", str(wd)]) == 0
    written = json.loads((stale / "tokenizer.json").read_text())
    source = json.loads((Path(minilm_dir) / "tokenizer.json").read_text())
    assert written["model"]["vocab"] == source["model"]["vocab"]


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


# 2. tracebacks where one line is promised ------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "holds a JSON list, expected an object"),
    ],
)
def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, text, message, capsys):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_encoder(str(tmp_path))
    for side in SIDES:  # both commands, before anything is created
        wd = tmp_path / f"run-{side}"
        err = one_line_exit_2(
            capsys,
            lambda s=side, w=wd: SIDES[s](
                ["--preset", "tiny", "--model-dir", str(tmp_path), "--workdir", str(w)]
            ),
        )
        assert f"{tmp_path / 'config.json'}: {message.split(',')[0]}" in err
        assert not wd.exists()


def test_a_damaged_token_cache_entry_is_dropped_and_rebuilt(tmp_path, tokenizer, caplog):
    texts = ["a comment", "another comment"]
    ids = np.array(tokens.tokenize(texts, tokenizer, 16, tmp_path)[0])  # a copy: it is mapped
    (entry,) = tmp_path.glob("*.npy")
    entry.write_bytes(entry.read_bytes()[:40])  # truncated, as a full disk or a crash leaves it
    with caplog.at_level(logging.WARNING):
        again, _, hit = tokens.tokenize(texts, tokenizer, 16, tmp_path)
    assert not hit and np.array_equal(ids, again)
    assert "is damaged (ValueError); dropped, tokenizing again" in caplog.text
    assert tokens.tokenize(texts, tokenizer, 16, tmp_path)[2]  # rebuilt: a hit now


def test_a_stale_temporary_of_a_killed_writer_is_removed(tmp_path, tokenizer):
    dead = 2**22 + 12345  # beyond pid_max's default: no such process
    stale = tmp_path / f".abc.npy.{dead}.0123abcd.tmp"
    stale.write_bytes(b"half")
    live = tmp_path / f".abc.npy.{os.getpid()}.0123abcd.tmp"  # a writer still at work
    live.write_bytes(b"half")
    tokens.tokenize(["a comment"], tokenizer, 16, tmp_path)
    assert not stale.exists() and live.exists()
    assert files.remove_stale_temporaries(tmp_path) == 0


def test_a_full_disk_while_saving_the_tokenizer_is_one_line_and_leaves_nothing(
    tmp_path, tokenizer, monkeypatch
):
    import errno

    def full(path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_text("{")  # half written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tokenizer, "save_pretrained", full)
    with pytest.raises(DataError, match="no space left on device writing the tokenizer"):
        tokens.save_tokenizer(tokenizer, tmp_path / "tokenizer")
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_csv_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "train.csv"
    path.write_text(HEADER + "1,hello,0,0,0,0,0,0\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)  # root reads anything: make it fail
    with pytest.raises(DataError, match=r"train.csv: cannot be read \(Permission denied\)"):
        readers.read_comments(path)


def test_preflight_refuses_a_json_path_it_cannot_create_before_compiling(capsys):
    err = one_line_exit_2(
        capsys, lambda: pf_command.main(["--preset", "tiny", "--json", "/proc/jaxtpu-no/out.json"])
    )
    assert "cannot create anything in /proc" in err and "preflight:" not in err


def test_bisect_checks_the_model_directory_as_the_trainers_do(tmp_path, capsys, minilm_dir):
    from parity_tests import bisect

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "head.safetensors").write_bytes(b"")
    (bad / "config.json").write_text("{oops")
    csv = tmp_path / "c.csv"
    csv.write_text(HEADER + "1,hello,0,0,0,0,0,0\n")
    common = ["--out", str(tmp_path / "o"), "--csv", str(csv)]
    with pytest.raises(SystemExit):
        bisect.main(["--model-dir", str(bad), *common])
    assert f"{bad / 'config.json'}: not valid JSON" in capsys.readouterr().err
    short = tmp_path / "short"
    short.mkdir()
    (short / "head.safetensors").write_bytes(b"")
    cfg = json.loads((Path(minilm_dir) / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 128}))
    with pytest.raises(SystemExit):
        bisect.main(["--model-dir", str(short), *common, "--max-len", "200"])
    assert "--max-len 200: the bert encoder's position table" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# 3. interrupts and leftovers ---------------------------------------------------------------


@pytest.mark.model
def test_sigterm_while_the_programs_compile_stops_with_the_documented_exit(
    tmp_path, monkeypatch, caplog
):
    from jaxtpu.backend import JaxBackend

    real = JaxBackend.precompile

    def preempted(self, calls, evals):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the programs are built
        return real(self, calls, evals)

    monkeypatch.setattr(JaxBackend, "precompile", preempted)
    caplog.set_level("INFO", logger="jaxtpu")
    wd = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--workdir", str(wd), "--epochs", "2"]) == 0
    assert "SIGTERM before the first step: nothing trained, nothing to save" in caplog.text
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 0
    assert not (wd / "checkpoints").exists()


# 4. round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefix, head, message",
    [
        ("", "fc1", "--encoder-prefix '': not a module attribute"),
        ("bert", "bert", "--head-name 'bert' is inside --encoder-prefix 'bert'"),
        ("model", "model.fc", "--head-name 'model.fc' is inside --encoder-prefix 'model'"),
        ("bert", "fc-1", "--head-name 'fc-1': not a module attribute"),
    ],
)
def test_export_refuses_names_no_module_can_hold(prefix, head, message):
    from jaxtpu.core.errors import UserError

    with pytest.raises(UserError, match=message):
        export._check_module_names(prefix, head)


def test_a_head_of_another_width_is_said_to_be_one(tmp_path):
    from jaxtpu.core.hf.directory import fit_state_dict

    d = tmp_path / "multilabel-export"
    d.mkdir()
    from safetensors.numpy import save_file

    hidden = 8
    save_file(
        {"embeddings.word_embeddings.weight": np.zeros((10, hidden), np.float32)},
        str(d / "model.safetensors"),
    )
    head = {
        "classifier.weight": np.zeros((6, hidden), np.float32),
        "classifier.bias": np.zeros(6, np.float32),
    }
    save_file(head, str(d / "head.safetensors"))
    expected = {
        "embeddings.word_embeddings.weight": (10, hidden),
        "classifier.weight": (1, hidden),
        "classifier.bias": (1,),
    }
    with pytest.raises(CheckpointError, match="its head scores 6 outputs per comment"):
        fit_state_dict(d, expected)


@pytest.mark.parametrize("content", [b"", b"id,comment_text\n1,x\n"], ids=["empty", "csv"])
def test_init_from_a_file_that_is_not_a_torch_checkpoint_says_so(tmp_path, content):
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="so not a PyTorch checkpoint"):
        read_torch_file(path)


def test_an_empty_sweep_is_refused():
    with pytest.raises(ConfigError, match="--sweep '': empty"):
        pf_fit.options(tiny(), "")
    assert pf_fit.options(tiny(), None) == [tiny()]


def test_find_batch_where_nothing_fits_says_so(monkeypatch):
    def refused(cfg, target, devices, capacity, flops):
        r = pf_report.Report(target, "zero1", "none", "data=8,fsdp=1", cfg.train.batch_size, 16)
        r.error = "RESOURCE_EXHAUSTED: out of memory"
        return r

    monkeypatch.setattr(pf_fit, "check", refused)
    best = pf_fit.find_batch(tiny().replace(batch_size=4), "v3-8", [], 0, lambda r: None)
    row = pf_report.table([best], find=True).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "none (batch 1 refused)" in cells and "refused" in cells
    # not measured: params, optimizer, temporary, eval step, GFLOP, and the six speed columns
    assert cells.count("-") == 11
