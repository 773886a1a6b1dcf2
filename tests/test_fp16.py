"""--precision fp16 with dynamic loss scaling: jaxtpu's scale (flax's `DynamicScale`) follows
`torch.amp.GradScaler`'s rule step for step; a skipped step keeps params, optimizer and
schedule; the flags and devices it does not go with are refused in one line; the loss scale
and skipped steps survive a checkpoint. The training trajectories against torch, the forced
overflow included, are `parity_tests` ("trajectory toxicity fp16")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.hardware import MATMUL_PRECISION_ENV, matmul_precision, precision_problem
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.engine import steps
from jaxtpu.engine.backend import _tree, _untree

# finite (True) or not, per step: runs of finite steps longer and shorter than the interval
PATTERN = [True] * 7 + [False] + [True] * 2 + [False, False] + [True] * 7
INTERVAL = 3


def flax_scales(scaler) -> list[float]:
    """The scale each step of `PATTERN` uses under a flax `DynamicScale`: a gradient that is
    inf on the steps marked False."""
    scales = []
    for finite in PATTERN:
        factor = 1.0 if finite else np.inf
        scales.append(float(scaler.scale))
        scaler, is_finite, _, _ = scaler.value_and_grad(lambda p, f=factor: jnp.sum(p * f))(
            jnp.ones(3)
        )
        assert bool(is_finite) == finite
    return scales


@pytest.mark.torch
def test_the_jax_loss_scale_follows_grad_scalers_rule_step_for_step():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=INTERVAL)
    expected = []
    for finite in PATTERN:
        expected.append(scaler.get_scale())
        loss = (p * (1.0 if finite else float("inf"))).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert max(expected) > 2.0**16 and min(expected) < 2.0**16  # grew and backed off
    assert flax_scales(steps.dynamic_scale(2.0**16, INTERVAL)) == expected
    # flax's own interval counts one step more: given GradScaler's number it would differ
    from flax.training.dynamic_scale import DynamicScale

    raw = DynamicScale(growth_interval=INTERVAL, scale=2.0**16)
    assert flax_scales(raw) != expected


def toy_state(scale: float):
    """A one-weight model whose forward runs in fp16 (so a large scale overflows its
    gradient), with AdamW and its step count."""

    def apply_fn(variables, input_ids, attention_mask, deterministic=True, rngs=None):
        w = variables["params"]["w"].astype(jnp.float16)
        return (input_ids.astype(jnp.float16) * w).sum(-1).astype(jnp.float32)

    params = {"w": jnp.full((4,), 0.1, jnp.float32)}
    return steps.create_state(
        apply_fn, params, optax.adamw(1e-2), steps.dynamic_scale(scale, INTERVAL)
    )


def toy_batch():
    return {
        "input_ids": jnp.ones((8, 4), jnp.int32),
        "attention_mask": jnp.ones((8, 4), jnp.int32),
        "label": jnp.ones((8,), jnp.float32),
        "row_weight": jnp.ones((8,), jnp.float32),
    }


def test_a_step_with_an_overflowed_gradient_is_skipped_and_halves_the_scale():
    loss = steps.task_loss("toxicity")
    for scale, skipped in ((2.0**40, True), (2.0**4, False)):
        state = toy_state(scale)
        new, metrics = steps.train_step(state, toy_batch(), jax.random.key(0), loss=loss)
        assert float(metrics["skipped"]) == float(skipped)
        assert float(metrics["loss_scale"]) == scale  # the scale this step used
        count = jax.tree_util.tree_leaves(new.opt_state)[0]  # AdamW's update count
        assert int(new.step) == 1
        if skipped:
            assert float(new.loss_scale.scale) == scale / 2
            np.testing.assert_array_equal(new.params["w"], state.params["w"])
            assert int(count) == 0  # the schedule did not advance
        else:
            assert float(new.loss_scale.scale) == scale
            assert not np.array_equal(new.params["w"], state.params["w"])
            assert int(count) == 1


def test_the_loss_scale_and_skipped_steps_are_checkpointed():
    state = toy_state(2.0**8)
    state = state.replace(
        loss_scale=state.loss_scale.replace(scale=np.float32(512.0), fin_steps=np.int32(2))
    )
    tree = _tree(jax.device_get(state))
    assert tree["loss_scale"] == {"scale": 512.0, "fin_steps": 2}
    back = _untree(toy_state(2.0**8), dict(tree))
    assert float(back.loss_scale.scale) == 512.0 and int(back.loss_scale.fin_steps) == 2
    assert back.loss_scale.growth_interval == INTERVAL - 1  # static, from the flags
    assert "loss_scale" not in _tree(jax.device_get(toy_state(1.0).replace(loss_scale=None)))
    meta = {"step": 12, "best": {"value": 0.5, "step": 10, "bad_evals": 0}}
    assert ResumeState.of({**meta, "skipped_steps": 3}).skipped == 3
    assert ResumeState.of(meta).skipped == 0  # a checkpoint of an older version


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"accumulate": 2}, "--precision fp16 with --accumulate 2"),
        ({"matmul_output": "bf16"}, "--matmul-output bf16"),
    ],
)
def test_what_fp16_does_not_combine_with_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        tiny().replace(precision="fp16", **overrides)
    assert "\n" not in str(e.value)


def test_loss_scaling_flags_without_fp16_are_refused():
    with pytest.raises(ConfigError, match="--loss-scale 1024.0 goes with --precision fp16"):
        tiny().replace(precision="bf16", loss_scale=1024.0)
    with pytest.raises(ConfigError, match="--loss-scale-growth-interval 5 goes with"):
        tiny().replace(precision="fp32", loss_scale_growth_interval=5)
    cfg = tiny().replace(precision="fp16", loss_scale=1024.0, loss_scale_growth_interval=5)
    assert steps.loss_scaler(cfg.train).growth_interval == 4
    assert steps.loss_scaler(tiny().train) is None  # bf16: no loss scale


def test_precision_by_device():
    level, message = precision_problem("bf16", "gpu", "7.5")  # a T4
    assert level == "error" and "--precision fp16" in message and "7.5" in message
    assert precision_problem("bf16", "cuda", "6.0")[0] == "error"  # a P100
    assert precision_problem("bf16", "gpu", "8.0") is None  # an A100
    assert precision_problem("fp16", "gpu", "7.5") is None
    assert precision_problem("fp16", "cpu")[0] == "warning"
    assert precision_problem("bf16", "tpu") is None
    assert precision_problem("fp32", "gpu", "7.5") is None


def test_scoring_upcasts_a_run_only_where_the_cpu_would_emulate_its_type():
    """Issue 89, item 1: a bf16 (or fp16) run is scored in fp32 on a CPU without that type's
    instructions (an AVX2 CPU), as trained on a TPU, a GPU or a CPU that has them."""
    from jaxtpu.core.hardware import cpu_flags, scoring_precision

    avx2, sapphire = {"avx", "avx2", "fma"}, {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert scoring_precision("bf16", "cpu", flags=avx2)[0] == "fp32"
    assert (
        "no bf16 instructions (avx512_bf16 or amx_bf16)"
        in scoring_precision("bf16", "cpu", flags=avx2)[1]
    )
    assert scoring_precision("bf16", "cpu", flags=sapphire) == ("bf16", "")
    assert scoring_precision("fp16", "cpu", flags=sapphire)[0] == "fp32"  # no avx512_fp16
    assert scoring_precision("fp16", "cpu", flags={"avx512_fp16"}) == ("fp16", "")
    assert scoring_precision("bf16", "tpu", flags=avx2) == ("bf16", "")
    assert scoring_precision("fp32", "cpu", flags=avx2) == ("fp32", "")
    assert scoring_precision("bf16", "tpu", "fp32")[0] == "fp32"  # the user's choice
    assert scoring_precision("bf16", "cpu", "run", flags=avx2) == ("bf16", "")
    with pytest.raises(ValueError, match="expected auto, fp32 or run"):
        scoring_precision("bf16", "cpu", "fast")
    assert cpu_flags("processor : 0\nflags\t\t: fpu avx2 avx512_bf16\n") == {
        "fpu",
        "avx2",
        "avx512_bf16",
    }


def test_fp32_matmuls_are_full_fp32_on_a_gpu_unless_the_user_chose(monkeypatch):
    """JAX's GPU default is TF32, torch's fp32 (the H200 measurement is in core/hardware.py):
    the devices' set-up asks for 'highest' on a GPU only, and never over the user's choice."""
    from jaxtpu.engine import hosts

    assert matmul_precision("gpu", {}) == matmul_precision("cuda", {}) == "highest"
    assert matmul_precision("tpu", {}) is None and matmul_precision("cpu", {}) is None
    assert matmul_precision("gpu", {MATMUL_PRECISION_ENV: "tensorfloat32"}) is None
    monkeypatch.delenv(MATMUL_PRECISION_ENV, raising=False)
    before = jax.config.jax_default_matmul_precision
    try:
        hosts.full_fp32_matmuls("cpu")
        assert jax.config.jax_default_matmul_precision == before
        hosts.full_fp32_matmuls("gpu")
        assert jax.config.jax_default_matmul_precision == "highest"
    finally:
        jax.config.update("jax_default_matmul_precision", before)


@pytest.mark.torch
def test_the_torch_xla_side_refuses_fp16_and_names_eager():
    from jaxtpu.core.errors import UserError
    from torchxla_ref.train import train_and_evaluate

    with pytest.raises(UserError, match="--parallel eager"):
        train_and_evaluate(tiny().replace(precision="fp16", parallel="spmd"), "/nonexistent")


@pytest.mark.parametrize(
    ("flags", "parallel", "devices", "said"),
    [
        ([], "eager", 1, "using --parallel eager"),
        (["--num-devices", "1"], "eager", 1, "using --parallel eager (give"),
        (["--parallel", "ddp"], "ddp", 8, ""),  # chosen: kept, nothing implied
        (["--parallel", "spmd"], "spmd", 8, ""),  # chosen: kept, refused by the trainer
        (["--num-devices", "4"], "eager", 4, "using --parallel eager"),  # refused later
    ],
)
def test_fp16_on_the_torch_side_implies_plain_torch_on_one_device(
    flags, parallel, devices, said, capsys
):
    """Issue 86, item 16 (before: refused twice, one flag at a time): what the user did not
    choose is chosen, in one line; what they chose is kept for the trainer's checks."""
    from jaxtpu.core.flags.cli import parse_with
    from torchxla_ref.train import TORCH_STRATEGIES, implied_by_fp16

    argv = ["--preset", "tiny", "--precision", "fp16", *flags]
    cfg, args = parse_with(argv, "torch-train", "", TORCH_STRATEGIES)
    cfg = implied_by_fp16(cfg, args.given)
    assert (cfg.placement.parallel, cfg.placement.num_devices) == (parallel, devices)
    err = capsys.readouterr().err
    assert (said in err) if said else err == ""
    if not flags:
        assert "--parallel eager runs on one device: using --num-devices 1" in err


def test_the_fp16_parity_check_fails_a_scaler_that_never_skips(tmp_path):
    """The comparison itself (`parity_tests.fp16.fp16_result`) on metrics lines written
    here: equal scales and skips pass; a jaxtpu side that never skipped, or one whose run
    did not finish, fails. (The real broken scaler: `python -m parity_tests.breaks --check
    fp16`.)"""
    import json

    from parity_tests.fp16 import fp16_result
    from parity_tests.harness import Run

    def run(name, skipped, finished=True):
        wd = tmp_path / name
        wd.mkdir()
        scale, lines = 2.0**16, []
        for step, skip in enumerate(skipped, 1):
            lines.append({"event": "train", "step": step, "loss": 0.6, "loss_scale": scale})
            lines[-1]["skipped"] = int(skip)
            scale = scale / 2 if skip else scale
        (wd / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        if finished:
            (wd / "summary.json").write_text(json.dumps({"skipped_steps": sum(skipped)}))
        return Run(wd, 0, "", "loss became nan at step 3")

    pattern = [1, 1, 0] + [0] * 18
    ref = run("torch", pattern)
    assert fp16_result("", run("same", pattern), ref).passed
    never = fp16_result("", run("never", [0] * 21), ref)
    assert not never.passed and "0 (jaxtpu)" in never.detail and "differ" in never.detail
    died = fp16_result("", run("died", [0, 0], finished=False), ref)
    assert not died.passed and "nan" in died.detail
