"""Model directories (`jaxtpu.core.hf`, `jaxtpu.engine.weights`): a config's family, tensors and
tokenizer checked against each other, heads and `--init-from` files said for what they are,
before anything runs."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    JIGSAW_HEADER,
    SIDE_MAINS,
    one_line_exit_2,
)

from jaxtpu import export
from jaxtpu.core.errors import CheckpointError, ConfigError
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.statedict import read_torch_file


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


@pytest.mark.parametrize(
    "side", [pytest.param("jaxtpu", marks=pytest.mark.model), "torchxla_ref"]
)  # jaxtpu's refusal comes after its model is initialized (a compile)
def test_tensors_the_config_does_not_describe_are_refused(
    two_layers_said_one, capsys, tmp_path, side
):
    wd = tmp_path / "run"
    err = one_line_exit_2(
        capsys,
        lambda: SIDE_MAINS[side](
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


@pytest.mark.parametrize("side", SIDE_MAINS)
def test_a_tokenizer_beyond_the_embedding_table_is_refused_and_leaves_nothing(
    capsys, tmp_path, side
):
    wd = tmp_path / "run"
    err = one_line_exit_2(
        capsys,
        lambda: SIDE_MAINS[side](
            ["--preset", "tiny", "--vocab-size", "1000", "--max-steps", "1", "--workdir", str(wd)]
        ),
    )
    assert "has 30522 tokens but the encoder's embedding table has 1000 rows" in err
    assert not wd.exists()


def test_bisect_checks_the_model_directory_as_the_trainers_do(tmp_path, capsys, minilm_dir):
    from parity_tests import bisect

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "head.safetensors").write_bytes(b"")
    (bad / "config.json").write_text("{oops")
    csv = tmp_path / "c.csv"
    csv.write_text(JIGSAW_HEADER + "1,hello,0,0,0,0,0,0\n")
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
