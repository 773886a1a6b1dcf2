"""The PyTorch/XLA notebook's checkpoints in and back out: `--init-from` reads the state dict of
a module built like the notebook's `BERTBaseUncased` (`bert`, `bert_drop`, `fc1`) or a
Lightning checkpoint (`model`, `fc`); `predict` and training continue from it; `export
--format state-dict` writes a file that the module class loads strictly."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from helpers import notebook_class, notebook_model  # noqa: E402
from torch import nn  # noqa: E402
from transformers import BertConfig  # noqa: E402

from jaxtpu import export, predict, train  # noqa: E402
from jaxtpu.core.data.tokens import load_tokenizer, tokenize  # noqa: E402
from jaxtpu.core.errors import CheckpointError, ConfigError  # noqa: E402
from jaxtpu.core.flags import presets  # noqa: E402
from jaxtpu.core.hf.directory import write_hf_dir  # noqa: E402
from jaxtpu.core.hf.statedict import read_notebook_checkpoint  # noqa: E402
from parity_tests.forward import encoder  # noqa: E402
from parity_tests.harness import shared_init  # noqa: E402

NotebookModel = notebook_class()
MAX_LEN = 32
TEXTS = [
    "you are a wonderful person",
    "this is the worst idea I have ever read, idiot",
    "ok",
    "Thanks for the edit. I reverted the vandalism on the talk page and left a note for the "
    "user who keeps adding unsourced claims about the band's second album.",
    "shut up",
    "I disagree with the deletion; the article cites three independent sources.",
    "what a stupid stupid comment",
    "Please stop.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny BERT directory (config.json + tokenizer + its own random weights)."""
    return shared_init(tmp_path_factory.mktemp("hf") / "tiny", "toxicity", "tiny", seed=3)


def torch_scores(model: NotebookModel, model_dir: Path) -> np.ndarray:
    ids, mask, _ = tokenize(TEXTS, load_tokenizer(model_dir), MAX_LEN)
    with torch.no_grad():
        return model(torch.from_numpy(ids).long(), torch.from_numpy(mask).long()).numpy()


def write_texts(path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["comment_id", "text"])
        w.writerows((str(i), t) for i, t in enumerate(TEXTS))
    return path


def read_scores(path: Path) -> np.ndarray:
    with path.open() as f:
        return np.array([float(r["score"]) for r in csv.DictReader(f)])


def save_lightning(model: NotebookModel, path: Path) -> None:
    """A Lightning checkpoint's layout: the weights under 'state_dict', with bookkeeping."""
    torch.save(
        {
            "epoch": 2,
            "global_step": 300,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": model.state_dict(),
            "optimizer_states": [],
            "lr_schedulers": [],
        },
        path,
    )


@pytest.mark.model
@pytest.mark.parametrize("kind", ["state-dict", "lightning"])
def test_predict_from_a_notebook_checkpoint_matches_the_pytorch_module(tmp_path, model_dir, kind):
    if kind == "state-dict":
        model = notebook_model(model_dir)
        source = tmp_path / "model.bin"
        torch.save(model.state_dict(), source)  # what xm.save(model.state_dict()) writes
    else:
        model = notebook_model(model_dir, encoder="model", head="fc")
        source = tmp_path / "last.ckpt"
        save_lightning(model, source)
    found = read_notebook_checkpoint(source)
    assert (found.encoder_prefix, found.head_name) == (
        ("bert.", "fc1") if kind == "state-dict" else ("model.", "fc")
    )
    out = tmp_path / "scores.csv"
    argv = [
        "--init-from",
        str(source),
        "--model-dir",
        str(model_dir),
        "--max-len",
        str(MAX_LEN),
        "--input",
        str(write_texts(tmp_path / "in.csv")),
        "--output",
        str(out),
    ]
    assert predict.main(argv) == 0
    ours, theirs = read_scores(out), torch_scores(model, model_dir)
    assert np.abs(theirs).max() > 1e-3  # a real signal, not a zero head
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)


@pytest.mark.model
def test_train_from_a_notebook_checkpoint_then_export_it_back(tmp_path, model_dir):
    """A run from --init-from starts from the file's weights (the same run as from a Hugging
    Face directory holding them), and its export loads strictly into the notebook's class."""
    model = notebook_model(model_dir)
    source = tmp_path / "model.bin"
    torch.save(model.state_dict(), source)
    found = read_notebook_checkpoint(source)
    as_hf = write_hf_dir(
        tmp_path / "as-hf", encoder(str(model_dir)), found.encoder, found.head, model_dir
    )
    kw = dict(precision="fp32", parallel="jit", max_steps=3, log_every=1, max_len=MAX_LEN)
    base = presets.tiny().replace(**kw)
    train.train_and_evaluate(
        base.replace(workdir=str(tmp_path / "run"), model_dir=str(model_dir), init_from=str(source))
    )
    train.train_and_evaluate(base.replace(workdir=str(tmp_path / "ref"), model_dir=str(as_hf)))
    losses = [_losses(tmp_path / name) for name in ("run", "ref")]
    assert len(losses[0]) == 3
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)

    out = tmp_path / "exported.bin"
    assert (
        export.main(
            ["--workdir", str(tmp_path / "run"), "--out", str(out), "--format", "state-dict"]
        )
        == 0
    )
    reloaded = notebook_model(model_dir, seed=11)
    reloaded.load_state_dict(torch.load(out, weights_only=True), strict=True)
    scored = tmp_path / "scores.csv"
    argv = [
        "--workdir",
        str(tmp_path / "run"),
        "--input",
        str(write_texts(tmp_path / "in.csv")),
        "--output",
        str(scored),
    ]
    assert predict.main(argv) == 0
    np.testing.assert_allclose(read_scores(scored), torch_scores(reloaded, model_dir), atol=2e-5)
    # trained: no longer the notebook's scores
    assert np.abs(torch_scores(reloaded, model_dir) - torch_scores(model, model_dir)).max() > 1e-4


def _losses(workdir: Path) -> list[float]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r.get("event") == "train"]


class WideHead(NotebookModel):
    """Mean and max pooling concatenated into Linear(2 * hidden, 1): not jaxtpu's head."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.fc1 = nn.Linear(2 * config.hidden_size, 1)


class TwoHeads(NotebookModel):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.aux = nn.Linear(config.hidden_size, 6)


def test_notebook_checkpoints_jaxtpu_cannot_hold_are_refused_by_name(tmp_path, model_dir):
    config = BertConfig(**json.loads((model_dir / "config.json").read_text()))
    cases = {
        "wide.bin": (WideHead(config).state_dict(), "head fc1 is Linear(128, 1) but the encoder's"),
        "two.bin": (TwoHeads(config).state_dict(), "cannot hold: aux.bias, aux.weight"),
        "none.bin": ({"fc1.weight": torch.zeros(1, 64)}, "expected one encoder"),
        "empty.bin": ({"note": "hi"}, "no tensors"),
    }
    for name, (sd, message) in cases.items():
        torch.save(sd, tmp_path / name)
        with pytest.raises(CheckpointError, match=re.escape(message)):
            read_notebook_checkpoint(tmp_path / name)
    # a pickled object (Lightning's hyper_parameters often are) is refused, never executed
    torch.save({"state_dict": {}, "hparams": argparse_namespace()}, tmp_path / "objects.ckpt")
    with pytest.raises(CheckpointError, match="not loadable as tensors only.*weights_only=False"):
        read_notebook_checkpoint(tmp_path / "objects.ckpt")
    with pytest.raises(CheckpointError, match="no such file"):
        read_notebook_checkpoint(tmp_path / "missing.bin")


@pytest.mark.model
def test_a_notebook_checkpoint_of_another_size_or_without_its_config_is_a_one_line_error(
    tmp_path, model_dir, capsys
):
    bigger = BertConfig(
        **{**json.loads((model_dir / "config.json").read_text()), "intermediate_size": 96}
    )
    torch.save(NotebookModel(bigger).state_dict(), tmp_path / "other.bin")
    argv = [
        "--init-from",
        str(tmp_path / "other.bin"),
        "--model-dir",
        str(model_dir),
        "--input",
        str(write_texts(tmp_path / "in.csv")),
        "--output",
        str(tmp_path / "o.csv"),
    ]
    with pytest.raises(SystemExit) as exit_:
        predict.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has shape (96,), the model expects (128,)" in err
    assert not (tmp_path / "o.csv").exists()
    with pytest.raises(ConfigError, match="--init-from .* needs --model-dir"):
        presets.tiny().replace(init_from=str(tmp_path / "other.bin"), model_dir=None)


def argparse_namespace():
    import argparse

    return argparse.Namespace(lr=3e-5)


@pytest.mark.model
def test_predict_init_from_a_six_output_state_dict_scores_the_six_labels(tmp_path, model_dir):
    """A notebook state dict whose head has six outputs (a multi-label model, as `export
    --format state-dict` of a multilabel run writes) is scored as one: its task comes from the
    head, since predict has no --task."""
    import torch

    from jaxtpu.core.tasks import LABELS

    model = notebook_model(model_dir)
    torch.manual_seed(5)
    model.fc1 = nn.Linear(model.fc1.in_features, len(LABELS)).eval()
    source = tmp_path / "six.bin"
    torch.save(model.state_dict(), source)
    src = tmp_path / "in.csv"
    with src.open("w", newline="") as f:
        csv.writer(f).writerows(
            [("id", "comment_text"), *((str(i), t) for i, t in enumerate(TEXTS))]
        )
    out = tmp_path / "out.csv"
    argv = ["--init-from", str(source), "--model-dir", str(model_dir), "--max-len", str(MAX_LEN)]
    argv += ["--input", str(src), "--output", str(out), "--num-devices", "1"]
    assert predict.main(argv) == 0
    with out.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", *LABELS] and len(rows) == len(TEXTS) + 1
    ids, mask, _ = tokenize(TEXTS, load_tokenizer(model_dir), MAX_LEN)
    with torch.no_grad():
        pooled = model.bert(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()
        ).pooler_output
        want = torch.sigmoid(model.fc1(pooled)).numpy()
    np.testing.assert_allclose(np.array(rows[1:], float)[:, 1:], want, atol=2e-5)
