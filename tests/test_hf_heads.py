"""`--head hf`: every family's own classification head against transformers' class of it.

A run's export of an `hf`-head model is a `*ForSequenceClassification` checkpoint that
`AutoModelForSequenceClassification.from_pretrained` and `pipeline("text-classification")`
load with nothing missing or unexpected, and score as jaxtpu does; such a checkpoint made by
transformers loads back into jaxtpu with its head."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.data.readers import read_comments
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.hf.heads import HF_HEADS, classifier_fields, hf_pooling, read_classifier
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.core.tasks import LABELS
from jaxtpu.engine import weights
from parity_tests.families import FAMILY_NAMES, VARIANTS

torch = pytest.importorskip("torch", reason="transformers' classifiers need torch")
transformers = pytest.importorskip("transformers")

ALL = FAMILY_NAMES + tuple(VARIANTS)


def _texts(n: int = 12) -> list[str]:
    texts = read_comments(SAMPLE_CSV).texts
    return [texts[i] for i in range(0, 40 * n, 40)][:n] + ["ok", "you are a nice person"]


def _raw(texts: list[str]) -> list[str]:
    """The comments as a user hands them to pipeline() or onnxruntime: newlines, tabs and runs
    of spaces where jaxtpu's reader has one space (`normalize_text` gives `texts` back)."""
    return [f"  {t.replace(' ', chr(10) + chr(9) + '  ', 2)}\n" for t in texts]


def _jax_scores(model, tokenizer_dir, texts, max_len: int = 64) -> np.ndarray:
    from jaxtpu.core.data.tokens import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    enc = tok(texts, max_length=max_len, truncation=True, padding="max_length")
    ids = np.asarray(enc["input_ids"], np.int32)
    mask = np.asarray(enc["attention_mask"], np.int32)
    # one compiled program per shape, not a compilation per primitive op by op
    logits = jax.jit(model.module.apply)({"params": model.params}, ids, mask)
    return np.asarray(logits, np.float64)


@pytest.mark.model
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("task", ["multilabel", "toxicity"])
def test_an_hf_head_export_is_transformers_own_classifier(name, task, family_dirs, tmp_path):
    model_dir = family_dirs[name]
    cfg = Config().replace(
        model_dir=str(model_dir), precision="fp32", max_len=64, task=task, head="hf", seed=3
    )
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec)
    labels = spec.task.label_columns
    fields = classifier_fields(
        spec.encoder.model_type, labels, task, cfg.head_dropout, model.module.pooling
    )
    out = weights.save_hf(model.params, model.encoder, tmp_path / "export", model_dir, {}, fields)

    clf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(out), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(clf).__name__.endswith("ForSequenceClassification")
    assert clf.config.id2label == dict(enumerate(labels))
    assert clf.config.problem_type == "multi_label_classification"
    clf.eval()

    texts = _texts()
    ours = _jax_scores(model, model_dir, texts)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    batch = tok(texts, max_length=64, truncation=True, padding="max_length", return_tensors="pt")
    with torch.no_grad():
        theirs = clf(**batch).logits.double().numpy()
    theirs = theirs[:, 0] if len(labels) == 1 else theirs
    assert np.abs(ours - theirs).max() < 1e-5, np.abs(ours - theirs).max()

    # the pipeline gives every label's probability: the sigmoid of jaxtpu's logits, on raw
    # text too (the export's tokenizer collapses whitespace as jaxtpu does; issue 57)
    pipe = transformers.pipeline("text-classification", model=str(out), top_k=None)
    rows = pipe(_raw(texts[:4]), truncation=True, max_length=64)
    probs = 1 / (1 + np.exp(-ours[:4].reshape(4, -1)))
    for row, expected in zip(rows, probs, strict=True):
        got = {r["label"]: r["score"] for r in row}
        assert set(got) == set(labels)
        for j, label in enumerate(labels):
            assert abs(got[label] - expected[j]) < 1e-5

    if task == "multilabel":
        _check_onnx(out, model, spec, tmp_path / "model.onnx")

    # and back: jaxtpu loads the classifier with its head, every tensor as exported
    back, kept = weights.load_params(out, model.params, True, spec.encoder.model_type, head="hf")
    assert not kept
    flat_a, flat_b = weights._flatten(model.params), weights._flatten(back)
    assert all(np.array_equal(flat_a[k], flat_b[k]) for k in flat_a)


ATTENTION_FUSED = ("bert", "distilbert", "electra", "roberta", "xlm-roberta")


def _check_onnx(export: Path, model, spec, path: Path) -> None:
    """The export as ONNX (torch's exporter on the torch side's model of it), as exported and
    as fused for onnxruntime, scores as jaxtpu does in fp32, within 1e-4, at two batch sizes
    and lengths it was not traced at."""
    pytest.importorskip("onnxruntime", reason="the ONNX export needs onnxruntime")
    from torchxla_ref import onnxexport
    from torchxla_ref.weights import load_model

    mine = ModelSpec(spec.encoder, pooling=spec.pooling, outputs=spec.task.outputs, head="hf")
    torch_model = load_model(mine, export, 0).eval()
    onnxexport.export_onnx(torch_model, path, spec.encoder)
    fused_path = path.with_name("fused.onnx")
    fused = onnxexport.optimize_for_onnxruntime(path, fused_path)
    if spec.encoder.model_type in ATTENTION_FUSED:  # the fusions the deployed graph relies on
        assert fused.get("Attention") == spec.encoder.num_hidden_layers, fused
    for graph in (path, fused_path):
        _check_onnx_graph(export, model, spec, onnxexport.session(graph))


def _check_onnx_graph(export: Path, model, spec, session) -> None:
    texts = _texts()
    tok = transformers.AutoTokenizer.from_pretrained(str(export))
    for n, length in ((3, 40), (len(texts), 24)):
        ours = _jax_scores(model, export, texts[:n], length)
        # raw text through the export's own tokenizer, as an onnxruntime user feeds it
        enc = tok(_raw(texts[:n]), max_length=length, truncation=True, padding="max_length")
        feeds = {k: np.asarray(enc[k], np.int64) for k in ("input_ids", "attention_mask")}
        theirs = session.run(None, feeds)[0]
        assert theirs.shape == (n, spec.task.outputs)
        assert np.abs(theirs - ours.reshape(n, -1)).max() < 1e-4


@pytest.mark.model
def test_a_classifier_made_by_transformers_keeps_its_head(family_dirs, tmp_path):
    """A 6-label RobertaForSequenceClassification saved by transformers: --head hf scores it
    as transformers does; --head jaxtpu keeps its encoder and starts a new head."""
    model_dir = family_dirs["roberta"]
    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    config.num_labels = len(LABELS)
    config.id2label = dict(enumerate(LABELS))
    config.label2id = {v: k for k, v in config.id2label.items()}
    config.problem_type = "multi_label_classification"
    torch.manual_seed(0)
    clf = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    out = tmp_path / "clf"
    clf.save_pretrained(str(out))
    transformers.AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))

    cfg = Config().replace(
        model_dir=str(out), precision="fp32", max_len=64, task="multilabel", head="hf"
    )
    model = weights.load_model(cfg, RunSpec.resolve(cfg, 1), head_required=True)
    texts = _texts(6)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    batch = tok(texts, max_length=64, truncation=True, padding="max_length", return_tensors="pt")
    with torch.no_grad():
        theirs = clf(**batch).logits.double().numpy()
    assert np.abs(_jax_scores(model, out, texts) - theirs).max() < 1e-5

    # a toxicity run cannot take its 6-output head
    one = cfg.replace(task="toxicity")
    with pytest.raises(Exception, match="6 outputs per comment"):
        weights.load_model(one, RunSpec.resolve(one, 1))


def _transformers_classifier(model_dir: Path, out: Path, labels: tuple[str, ...]) -> Path:
    """A random RobertaForSequenceClassification of `labels` saved by transformers itself."""
    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {v: k for k, v in config.id2label.items()}
    config.problem_type = "multi_label_classification"
    torch.manual_seed(0)
    clf = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    clf.save_pretrained(str(out))
    transformers.AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))
    return out


@pytest.mark.model
def test_a_transformers_classifier_is_evaluated_trained_on_and_exported(
    family_dirs, tmp_path, capsys
):
    """ "How does this published model do on my labelled file?": evaluate --model-dir gives
    the Kaggle metric of transformers' own scores; then a run trains its head on and exports
    a classifier transformers loads."""
    from jaxtpu import evaluate, export, predict, train
    from jaxtpu.core import metrics
    from jaxtpu.core.data.readers import read_comments
    from jaxtpu.core.flags import presets

    clf_dir = _transformers_classifier(family_dirs["roberta"], tmp_path / "clf", LABELS)
    labelled = tmp_path / "labelled.csv"
    with open(SAMPLE_CSV, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[:301]
    with open(labelled, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    report = tmp_path / "report.json"
    argv = ["--model-dir", str(clf_dir), "--input", str(labelled), "--max-len", "64"]
    assert evaluate.main([*argv, "--num-devices", "2", "--out", str(report)]) == 0
    got = json.loads(report.read_text())
    assert got["metric"] == "mean_column_auc" and got["examples"] == 300

    clf = transformers.AutoModelForSequenceClassification.from_pretrained(str(clf_dir)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(clf_dir))
    data = read_comments(str(labelled))
    batch = tok(data.texts, max_length=64, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = clf(**batch).logits.double().numpy()
    labels = np.concatenate([data.labels[:, None], data.sublabels], 1).astype(np.float64)
    aucs = metrics.column_aucs(theirs, labels, np.ones(len(theirs)))
    expected = float(np.nanmean(aucs))
    assert abs(got["value"] - expected) < 1e-6, (got["value"], expected)

    # predict scores it the same way, into the Kaggle columns
    scores = tmp_path / "scores.csv"
    predict.main([*argv, "--output", str(scores), "--num-devices", "2"])
    header = scores.read_text().splitlines()[0]
    assert header.split(",")[1:] == list(LABELS)

    cfg = presets.tiny().replace(
        model_dir=str(clf_dir),
        head="hf",
        task="multilabel",
        train_csv="sample",
        max_rows=160,
        max_len=32,
        parallel="jit",
        epochs=1,
        workdir=str(tmp_path / "run"),
    )
    summary = train.train_and_evaluate(cfg)
    assert np.isfinite(summary["final"]["val_mean_auc"])
    out = tmp_path / "export"
    assert export.main(["--workdir", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert "RobertaForSequenceClassification" in capsys.readouterr().out
    again, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(out), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert again.config.id2label == dict(enumerate(LABELS))
    # the run trained the head it was given: the exported head is not the one it started from
    before = clf.classifier.out_proj.weight.detach().numpy()
    assert not np.allclose(again.classifier.out_proj.weight.detach().numpy(), before)


def test_a_model_dir_without_a_classification_head_is_refused_in_one_line(family_dirs, capsys):
    from jaxtpu import evaluate
    from tests.helpers import one_line_exit_2

    bert = family_dirs["bert"]
    capsys.readouterr()  # (what building it printed)
    argv = ["--model-dir", str(bert), "--input", str(SAMPLE_CSV)]
    err = one_line_exit_2(capsys, lambda: evaluate.main(argv))
    assert "no classification head" in err and "jaxtpu train --model-dir DIR" in err


@pytest.mark.parametrize("family", sorted(HF_HEADS))
def test_every_family_head_is_described_by_its_transformers_class(family):
    """The table's modules and dropout key are the attributes transformers' class has."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    head = HF_HEADS[family]
    kwargs = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=4)
    if family == "distilbert":
        kwargs = dict(n_layers=1, dim=32, n_heads=4, hidden_dim=64)
    config = AutoConfig.for_model(family, **kwargs, intermediate_size=64, num_labels=3)
    model = AutoModelForSequenceClassification.from_config(config)
    children = dict(model.named_children())
    assert head.prefix in children
    params = {k for k, _ in model.named_parameters() if not k.startswith(head.prefix + ".")}
    assert {k.split(".")[0] for k in params} == set(head.modules)
    assert f"{head.output}.weight" in params
    assert dict(model.named_parameters())[f"{head.output}.weight"].shape[0] == 3
    if head.dropout_key:
        assert hasattr(config, head.dropout_key) or head.dropout_key == "cls_dropout"


def test_hf_head_poolings_and_classifier_configs_are_checked():
    assert hf_pooling("roberta", "auto") == "cls"
    assert hf_pooling("bert", "auto") == "pooler"
    assert hf_pooling("modernbert", "mean") == "mean"
    with pytest.raises(ConfigError, match="--pooling mean with --head hf: roberta's own"):
        hf_pooling("roberta", "mean")
    with pytest.raises(ConfigError, match="2-label softmax classifier"):
        read_classifier("bert", {"id2label": {"0": "ok", "1": "toxic"}}, "c.json")
    with pytest.raises(ConfigError, match="classifier_pooling='late' is not supported"):
        read_classifier("eurobert", {"classifier_pooling": "late", "num_labels": 1}, "c.json")
    with pytest.raises(ConfigError, match="classifier_activation='silu' is not supported"):
        read_classifier("modernbert", {"classifier_activation": "silu", "num_labels": 1}, "c")
    found = read_classifier(
        "modernbert",
        {"classifier_pooling": "mean", "id2label": {str(i): n for i, n in enumerate(LABELS)}},
        "c",
    )
    assert found.labels == LABELS and found.pooling == "mean"
    fields = classifier_fields("eurobert", ("toxic",), "ranking", 0.2, "cls")
    assert fields["classifier_pooling"] == "bos" and fields["problem_type"] == "regression"
    assert json.dumps(fields)  # config.json material
