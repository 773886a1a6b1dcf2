"""Configuration parsing, framework-free imports, and metrics against scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from jaxtpu import config as C
from jaxtpu import metrics as M

CONTRACT_FLAGS = [
    "--task", "--train-csv", "--valid-csv", "--model-dir", "--preset", "--num-devices",
    "--parallel", "--precision", "--epochs", "--max-steps", "--batch-size", "--max-len",
    "--lr", "--seed", "--workdir", "--resume",
]  # fmt: skip


def parse(*argv):
    return C.parse_args(list(argv), prog="t", description="t")


def test_defaults_are_the_demo_preset():
    assert parse() == C.demo()


def test_contract_flags_exist_and_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    for flag in CONTRACT_FLAGS:
        assert flag in out
    parser = C.build_parser("t", "t")
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_overrides_are_applied_and_type_checked(capsys):
    cfg = parse("--preset", "tiny", "--lr", "3e-4", "--task", "ranking", "--no-progress")
    assert (cfg.optim.lr, cfg.run.task, cfg.run.progress) == (3e-4, "ranking", False)
    assert cfg.model.num_layers == C.tiny().model.num_layers
    for argv, message in [
        (["--lr", "fast"], "invalid float value: 'fast'"),
        (["--task", "regression"], "invalid choice: 'regression'"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--bogus", "1"], "unrecognized arguments: --bogus 1\nvalid flags: "),
        (["--resume"], "--resume needs --workdir"),
    ]:
        with pytest.raises(SystemExit) as e:
            parse(*argv)
        assert e.value.code == 2
        assert message in capsys.readouterr().err


def test_unknown_config_key_lists_valid_keys():
    with pytest.raises(
        C.ConfigError, match=r"unknown config key 'learning_rate'; valid keys: .*lr"
    ):
        C.tiny().replace(learning_rate=1.0)
    with pytest.raises(C.ConfigError, match=r"epochs=1.5 is not a valid int"):
        C.tiny().replace(epochs=1.5)


def test_config_roundtrips_through_dict():
    cfg = C.minilm().replace(task="ranking", seed=3)
    assert C.from_dict(cfg.to_dict()) == cfg


def test_framework_free_modules_do_not_import_jax_or_torch():
    code = (
        "import sys, jaxtpu.config, jaxtpu.data, jaxtpu.metrics, jaxtpu.schedules, "
        "jaxtpu.run_io\n"
        "bad = [m for m in ('jax', 'torch', 'flax', 'optax') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_auc_matches_sklearn_on_scores_not_thresholds():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500).astype(np.float32)
    scores = labels + rng.normal(0, 1.0, 500)
    assert M.roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    # pad rows (weight 0) are excluded; float labels are binarised at 0.5
    w = np.ones(500, np.float32)
    w[:100] = 0
    soft = labels * 0.8 + 0.1
    assert M.roc_auc(scores, soft, w) == pytest.approx(roc_auc_score(labels[100:], scores[100:]))
    assert np.isnan(M.roc_auc(scores, np.zeros(500)))
    assert np.isnan(M.roc_auc(np.array([np.nan, 1.0]), np.array([0.0, 1.0])))  # diverged model


def test_agreement_counts_ties_as_misses_and_skips_padding():
    less = np.array([0.0, 1.0, 2.0, 5.0])
    more = np.array([1.0, 1.0, 3.0, 0.0])
    assert M.agreement(less, more) == 0.5
    assert M.agreement(less, more, np.array([1, 0, 1, 0])) == 1.0


def test_evaluate_weighted_loss():
    scores = np.array([[0.0, 1.0], [1.0, 0.0], [9.0, 9.0]])
    out = M.evaluate(
        "ranking", scores, np.ones(3), np.array([1.0, 3.0, 100.0]), np.array([1, 1, 0])
    )
    assert out == {"val_loss": 2.0, "val_agreement": 0.5}
