"""Configuration parsing, the framework-free core (proved by importing it without JAX or
torch), the task table, and metrics against scikit-learn."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import jaxtpu.core
from jaxtpu.core import metrics
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags import presets
from jaxtpu.core.flags.cli import build_parser, parse_args
from jaxtpu.core.flags.schema import (
    FIELDS,
    JAX_STRATEGIES,
    TORCH_STRATEGIES,
    Config,
    changed_flags,
    from_dict,
)
from jaxtpu.core.tasks import TASKS, get_task
from parity_tests.harness import ROOT, clean_env, run_side

FRAMEWORKS = ("jax", "jaxlib", "flax", "optax", "orbax", "torch", "torch_xla")

CONTRACT_FLAGS = [
    "--task",
    "--train-csv",
    "--valid-csv",
    "--model-dir",
    "--preset",
    "--num-devices",
    "--parallel",
    "--precision",
    "--epochs",
    "--max-steps",
    "--batch-size",
    "--max-len",
    "--lr",
    "--seed",
    "--workdir",
    "--resume",
]


def parse(*argv):
    return parse_args(list(argv), prog="t", description="t")


def test_defaults_are_the_demo_preset():
    assert parse() == presets.demo()


def test_one_default_per_flag_in_python_in_help_and_in_the_command():
    """`Config()` in Python, the command without flags and the default `--help` prints are one
    thing: the field's default."""
    assert Config() == parse() == presets.demo()
    shown = 0
    for action in build_parser("t", "t", JAX_STRATEGIES)._actions:
        if action.dest in FIELDS and action.dest != "parallel":  # each side's first strategy
            section, _ = FIELDS[action.dest]
            default = getattr(getattr(Config(), section), action.dest)
            assert action.help.endswith(f"[default: {default}]"), action.dest
            shown += 1
    assert shown == len(FIELDS) - 1


def test_contract_flags_exist_and_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    for flag in CONTRACT_FLAGS:
        assert flag in out
    parser = build_parser("t", "t", JAX_STRATEGIES)
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_overrides_are_applied_and_type_checked(capsys):
    cfg = parse("--preset", "tiny", "--lr", "3e-4", "--task", "ranking", "--no-progress")
    assert (cfg.optim.lr, cfg.train.task, cfg.output.progress) == (3e-4, "ranking", False)
    assert cfg.model.num_layers == presets.tiny().model.num_layers
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
    with pytest.raises(ConfigError, match=r"unknown config key 'learning_rate'; valid keys: .*lr"):
        presets.tiny().replace(learning_rate=1.0)
    with pytest.raises(ConfigError, match=r"epochs=1.5 is not a valid int"):
        presets.tiny().replace(epochs=1.5)


def test_config_roundtrips_through_dict():
    cfg = presets.minilm().replace(task="ranking", seed=3)
    assert from_dict(cfg.to_dict()) == cfg


@pytest.mark.e2e
def test_every_core_module_imports_without_any_framework():
    """Everything the torch side may import lives in jaxtpu.core; importing all of it in a
    fresh interpreter must load none of JAX, Flax, optax, orbax, torch or torch_xla."""
    names = sorted(
        m.name for m in pkgutil.walk_packages(jaxtpu.core.__path__, "jaxtpu.core.") if not m.ispkg
    )
    expected = {"flags.schema", "run.loop", "hf.directory", "data.tokens", "tasks"}
    assert {f"jaxtpu.core.{name}" for name in expected} <= set(names)
    code = (
        f"import importlib, sys\nfor name in {names!r}: importlib.import_module(name)\n"
        f"bad = [m for m in {FRAMEWORKS!r} if m in sys.modules]\nassert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.e2e
@pytest.mark.torch
def test_torch_side_trains_with_jax_unimportable(tmp_path):
    """`python -m torchxla_ref.train` runs a tiny job with every JAX package blocked
    (`sys.modules[name] = None` makes `import name` fail), so the torch side cannot lean on
    JAX, however indirectly."""
    pytest.importorskip("torch_xla", reason="the torch_xla reference needs torch_xla")
    blocked = ("jax", "jaxlib", "flax", "optax", "orbax")
    code = (
        "import runpy, sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "sys.argv = ['torchxla_ref.train', '--preset', 'tiny', '--max-steps', '2', "
        "'--num-devices', '8', '--no-progress', '--workdir', sys.argv[1]]\n"
        "runpy.run_module('torchxla_ref.train', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize(
    "side,own,other",
    [("jax", JAX_STRATEGIES, TORCH_STRATEGIES), ("torch", TORCH_STRATEGIES, JAX_STRATEGIES)],
)
@pytest.mark.e2e
@pytest.mark.torch
def test_each_side_lists_and_accepts_only_its_own_strategies(tmp_path, side, own, other):
    module = {"jax": "jaxtpu.train", "torch": "torchxla_ref.train"}[side]
    help_text = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
    ).stdout
    help_text = " ".join(help_text.split())  # argparse wraps lines
    assert f"One of: {', '.join(own)}." in help_text
    assert f"[default: {own[0]}]" in help_text
    run = run_side(side, tmp_path / "run", "--preset", "tiny", "--parallel", other[0])
    assert run.returncode == 2 and "invalid choice" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()  # refused before anything is created


def test_jax_strategy_names_match_the_strategy_classes():
    from jaxtpu.engine.parallel import STRATEGIES

    assert tuple(STRATEGIES) == JAX_STRATEGIES


def test_task_table_drives_shapes_metrics_and_dropout():
    assert presets.tiny().head_dropout == TASKS["toxicity"].head_dropout == 0.3
    assert presets.tiny().replace(task="ranking").head_dropout == 0.2
    assert presets.tiny().replace(task="ranking", dropout=0.0).head_dropout == 0.0
    assert get_task("toxicity").example_shape(16) == (16,)
    assert get_task("ranking").example_shape(16) == (2, 16)
    with pytest.raises(SystemExit):
        parse("--task", "nope")


def test_auc_matches_sklearn_on_scores_not_thresholds():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500).astype(np.float32)
    scores = labels + rng.normal(0, 1.0, 500)
    assert metrics.roc_auc(scores, labels) == pytest.approx(
        roc_auc_score(labels, scores), abs=1e-12
    )
    # pad rows (weight 0) are excluded; float labels are binarised at 0.5
    w = np.ones(500, np.float32)
    w[:100] = 0
    soft = labels * 0.8 + 0.1
    assert metrics.roc_auc(scores, soft, w) == pytest.approx(
        roc_auc_score(labels[100:], scores[100:])
    )
    assert np.isnan(metrics.roc_auc(scores, np.zeros(500)))
    assert np.isnan(
        metrics.roc_auc(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    )  # diverged model


@pytest.mark.parametrize("seed", range(5))
def test_auc_with_ties_matches_sklearn(seed):
    """Rounded scores (many ties, as bf16 logits have) and unbalanced classes."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 3000))
    labels = (rng.random(n) < rng.uniform(0.02, 0.5)).astype(np.float32)
    labels[:2] = [0, 1]
    scores = np.round(labels * rng.uniform(0, 2) + rng.normal(0, 1.0, n), int(rng.integers(0, 3)))
    assert metrics.roc_auc(scores, labels) == pytest.approx(
        roc_auc_score(labels, scores), abs=1e-12
    )


def test_agreement_counts_ties_as_misses_and_skips_padding():
    less = np.array([0.0, 1.0, 2.0, 5.0])
    more = np.array([1.0, 1.0, 3.0, 0.0])
    assert metrics.agreement(less, more) == 0.5
    assert metrics.agreement(less, more, np.array([1, 0, 1, 0])) == 1.0


def test_evaluate_weighted_loss():
    scores = np.array([[0.0, 1.0], [1.0, 0.0], [9.0, 9.0]])
    out = get_task("ranking").validation_metrics(
        scores, np.ones(3), np.array([1.0, 3.0, 100.0]), np.array([1, 1, 0])
    )
    assert out == {"val_loss": 2.0, "val_agreement": 0.5}


def test_one_probability_for_every_report():
    """`metrics.probability` is the sigmoid in float64 that validation scores, predict and the
    Python API all report; a classification task's predictions are it, a ranker's are raw."""
    from scipy.special import expit

    logits = np.array([-30.0, -2.5, 0.0, 0.3, 12.0], np.float32)
    probs = metrics.probability(logits)
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, expit(logits.astype(np.float64)), rtol=1e-15)
    toxicity, ranking = get_task("toxicity"), get_task("ranking")
    np.testing.assert_array_equal(toxicity.predictions(logits)[:, 0], probs)
    np.testing.assert_array_equal(ranking.predictions(logits)[:, 0], logits)


def test_a_config_recorded_before_the_sections_split_still_reads_and_compares():
    """Runs recorded before the train/placement/output split hold those flags under `run`:
    --config and --resume read them by field name, and a changed one is still named."""
    cfg = presets.tiny().replace(task="ranking", max_steps=7, sharding="fsdp", log_every=1)
    old = cfg.to_dict()
    old["run"] = {**old.pop("train"), **old.pop("placement"), **old.pop("output")}
    assert from_dict(old) == cfg
    assert changed_flags(old, cfg) == []
    assert changed_flags(old, cfg.replace(max_steps=9)) == [("max_steps", 7, 9)]


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_scoring_flags_come_from_the_schema_with_its_bounds(command, capsys, tmp_path):
    """predict's and evaluate's --num-devices and --batch-size are the schema's ScoringConfig
    fields: one default, one bound, one message, on every command that scores."""
    import importlib

    from jaxtpu.core.flags.schema import SCORING

    main = importlib.import_module(f"jaxtpu.{command}").main
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Devices to score on; 0: every local accelerator, or on a machine without one" in out
    assert f"docs/elsewhere.md). [default: {SCORING.num_devices}]" in out
    assert f"[default: {SCORING.batch_size}]" in out
    base = ["--workdir", str(tmp_path), "--input", str(tmp_path / "in.csv")]
    if command == "predict":
        base += ["--output", str(tmp_path / "out.csv")]
    with pytest.raises(SystemExit) as e:
        main([*base, "--batch-size", "0"])
    assert e.value.code == 2
    assert "error: --batch-size must be >= 1, got 0\n" == capsys.readouterr().err
