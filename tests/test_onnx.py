"""`jaxtpu export --format onnx [--quantize int8]`: a directory onnxruntime scores on a CPU as
jaxtpu does (fp32, dynamic batch and length), checked as it is written, and nothing left
behind when the check fails. Every family's graph is checked in `tests/test_hf_heads.py`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import one_line_exit_2

from jaxtpu.core.errors import UserError
from jaxtpu.core.hf.modelspec import ModelSpec

pytest.importorskip("onnxruntime", reason="the ONNX export needs onnxruntime (jaxtpu[onnx])")

TEXTS = [
    "you are an idiot and everybody knows it",
    "thank you for the citation",
    "please stop vandalising the page, or you will be blocked from editing",
    "?",
    "the article needs a source for the second paragraph; I have tagged it",
]


def _scores(session, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
    return session.run(None, feeds)[0]


@pytest.mark.e2e
@pytest.mark.model
def test_onnx_export_scores_as_jaxtpu_in_fp32_and_int8_runs(finished_run, onnx_export):
    import jax

    from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
    from jaxtpu.engine.scoring import load_trained
    from jaxtpu.models.encoder import create_module
    from torchxla_ref.onnxexport import session

    out = onnx_export.out  # the export, with --quantize int8, from an empty working directory
    assert onnx_export.left == []  # the exporter and the quantizer wrote nothing outside --out
    printed = onnx_export.printed
    assert "model.onnx, model_int8.onnx; onnxruntime's fused ops in model.onnx: " in printed
    meta = json.loads((out / "jaxtpu_onnx.json").read_text())
    assert meta["fused_for_onnxruntime"]["Attention"] >= 1  # model.onnx is the fused graph
    # the exporter's own graph went with the temporary directory it was written to
    assert not [p for p in out.iterdir() if p.is_dir() or p.suffix == ".data"]
    assert meta["files"] == {"fp32": "model.onnx", "int8": "model_int8.onnx"}
    assert meta["labels"] == ["toxic"] and meta["head"] == "jaxtpu" and meta["opset"] == 18
    assert meta["check"]["max_abs_logit_diff_fp32_vs_jaxtpu_fp32"] <= 1e-4
    assert (out / "tokenizer.json").exists() and not list(out.parent.glob(".onnx.*"))
    # what `jaxtpu serve --onnx` reads: the run's text format, attributes and metrics
    assert meta["text_format"] == {"kind": "comment", "template": "", "rules": False}
    assert meta["attributes"] == [{"name": "TOXICITY", "column": "toxic"}]
    assert set(meta["metrics"]) >= {"val_auc", "val_loss"}
    # the run's model card travels with it (GET /v1/model's fields)
    card = json.loads((out / "model_card.json").read_text())
    assert card["version"].startswith("jaxtpu-") and card["columns"] == ["toxic"]
    assert card["validation"]["auc"] == {"toxic": meta["metrics"]["val_auc"]}
    assert card["attributes"] == meta["attributes"] and card["languages"] == ["en"]
    assert card["calibration"] == meta["calibration"] and card["config"]

    model = load_trained(finished_run)
    spec = model.spec
    fp32 = create_module(ModelSpec(spec.encoder, pooling=spec.pooling, head=spec.head))
    tok = load_tokenizer(out)  # the tokenizer the export ships
    fp32_session, int8_session = session(out / "model.onnx"), session(out / "model_int8.onnx")
    # the scores and the vector sown under the head, one compiled program per shape
    scored = jax.jit(lambda p, i, m: fp32.apply({"params": p}, i, m, mutable=["intermediates"]))
    for n, length in ((1, 9), (len(TEXTS), 16), (3, 12)):  # batches and lengths never traced
        ids, mask = encode_texts(TEXTS[:n], tok, length)
        logits, sown = scored(model.params, ids, mask)
        ours = np.asarray(logits, np.float64)
        theirs = _scores(fp32_session, ids, mask)
        assert theirs.shape == (n, 1)
        np.testing.assert_allclose(theirs[:, 0], ours, atol=1e-4, rtol=0)
        int8 = _scores(int8_session, ids, mask)[:, 0]
        assert np.isfinite(int8).all() and np.abs(int8 - ours).max() < 0.05
        # issue 96: each comment's vector under the head, beside the logits (a community's
        # head on `jaxtpu serve --onnx --communities`), as jaxtpu's model computes it
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
        (vector,) = fp32_session.run(["pooled"], feeds)
        want = np.asarray(sown["intermediates"]["pooled"][0])
        np.testing.assert_allclose(vector, want, atol=1e-4, rtol=0)
        assert np.isfinite(int8_session.run(["pooled"], feeds)[0]).all()

    # benchmarks.serving.onnx_profile: kernel time by op type, the fused graph's Attention among
    # them
    from benchmarks.serving.onnx_profile import profile

    ids, mask = encode_texts(TEXTS, tok, 16)
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
    total, by_op = profile(out / "model.onnx", [feeds])
    assert total > 0 and "Attention" in by_op and abs(sum(by_op.values()) - total) < 1e-9


@pytest.mark.e2e
@pytest.mark.model
def test_an_onnx_export_that_fails_its_check_writes_nothing(finished_run, tmp_path, monkeypatch):
    """The check can fail: with no tolerance at all, the float rounding of torch's graph is
    refused, and neither `--out` nor its staging directory is left."""
    from jaxtpu import export
    from jaxtpu.engine import exports

    monkeypatch.setattr(exports, "ONNX_TOLERANCE", -1.0)
    out = tmp_path / "onnx"
    with pytest.raises(SystemExit) as e:
        export.main(["--workdir", str(finished_run), "--out", str(out), "--format", "onnx"])
    assert e.value.code == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_quantize_needs_the_onnx_format(tmp_path, capsys):
    from jaxtpu import export

    argv = ["--workdir", str(tmp_path), "--out", str(tmp_path / "x"), "--quantize", "int8"]
    err = one_line_exit_2(capsys, lambda: export.main(argv))
    assert "--quantize int8 quantizes an ONNX export: add --format onnx" in err


@pytest.mark.parametrize(
    "recorded, kind, template",
    [
        ({"kind": "prompt", "template": "Rule: {rule} {comment}", "rules": True}, "prompt", "R"),
        # an export written before the TextFormat record named its two templates
        ({"rule_template": "{rule} r/{subreddit}", "prompt_template": ""}, "pair", "{rule} r/"),
        ({"rule_template": "{rule}", "prompt_template": "Rule: {rule} {comment}"}, "prompt", "R"),
    ],
)
def test_an_onnx_exports_text_format_is_read_from_its_record_or_its_templates(
    tmp_path, recorded, kind, template
):
    from jaxtpu.serve.onnxmodel import read_export

    meta = {"files": {"fp32": "model.onnx"}, "task": "rules", "max_len": 64}
    meta |= {"labels": ["rule_violation"], "text_format": recorded}
    (tmp_path / "jaxtpu_onnx.json").write_text(json.dumps(meta))
    fmt = read_export(tmp_path).spec.text_format
    assert fmt.kind == kind and fmt.template.startswith(template) and fmt.rules
    meta["text_format"] = {"kind": "sentinel"}
    (tmp_path / "jaxtpu_onnx.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="text_format: text format 'sentinel': not one of"):
        read_export(tmp_path)
