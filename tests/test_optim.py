"""Schedules against PyTorch's own implementations, and the AdamW no-decay groups."""

from __future__ import annotations

import re

import numpy as np
import pytest

from jaxtpu.core.flags.schema import OptimConfig
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.core.schedules import Horizon, learning_rate

torch = pytest.importorskip("torch")


def torch_lrs(make_scheduler, steps: int, peak: float) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sched = make_scheduler(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("warmup_frac", [0.0, 0.2])
def test_linear_matches_transformers(warmup_frac):
    from transformers import get_linear_schedule_with_warmup

    cfg = OptimConfig(schedule="linear", warmup_frac=warmup_frac)
    total = 50
    ref = torch_lrs(
        lambda o: get_linear_schedule_with_warmup(o, int(warmup_frac * total), total), total, 1e-3
    )
    ours = [float(learning_rate(s, Horizon(total, total), cfg, 1e-3)) for s in range(total)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("warmup_frac", [0.0, 0.2])
def test_constant_matches_transformers(warmup_frac):
    """The same warm-up formula as the linear schedule's (transformers uses one for both)."""
    from transformers import get_constant_schedule_with_warmup

    cfg = OptimConfig(schedule="constant", warmup_frac=warmup_frac)
    ref = torch_lrs(lambda o: get_constant_schedule_with_warmup(o, int(warmup_frac * 50)), 50, 1e-3)
    ours = [float(learning_rate(s, Horizon(50, 50), cfg, 1e-3)) for s in range(50)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-12)


def test_cosine_with_a_warmup_is_refused():
    from jaxtpu.core.errors import ConfigError
    from jaxtpu.core.flags.schema import Config

    with pytest.raises(ConfigError, match="cosine schedule has no warm-up"):
        Config().replace(schedule="cosine", warmup_frac=0.1)


def test_cosine_matches_cosine_annealing():
    cfg = OptimConfig(schedule="cosine", eta_min=1e-5)
    ref = torch_lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 40, eta_min=1e-5), 40, 1e-3
    )
    ours = [float(learning_rate(s, Horizon(40, 40), cfg, 1e-3)) for s in range(40)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


@pytest.mark.parametrize("t_mult", [1, 2])
def test_cosine_restarts_match_cosine_annealing_warm_restarts(t_mult):
    cfg = OptimConfig(schedule="cosine-restarts", t0=5, t_mult=t_mult, eta_min=1e-6)
    ref = torch_lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 5, t_mult, 1e-6),
        40,
        1e-3,
    )
    ours = [float(learning_rate(s, Horizon(40, 40), cfg, 1e-3)) for s in range(40)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


def test_cosine_with_a_t_max_shorter_than_the_run_rises_again_as_torchs():
    cfg = OptimConfig(schedule="cosine", t_max=10, eta_min=1e-5)
    ref = torch_lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 10, eta_min=1e-5), 30, 1e-3
    )
    ours = [float(learning_rate(s, Horizon(30, 30), cfg, 1e-3)) for s in range(30)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


def test_a_schedule_stepped_per_epoch_holds_its_rate_through_each_epoch():
    """Lightning steps a scheduler returned without an interval once per epoch: the rate of
    every update of epoch e is the torch scheduler's after e steps."""
    cfg = OptimConfig(schedule="cosine", schedule_interval="epoch", t_max=500, eta_min=1e-6)
    per_epoch, epochs = 7, 4
    by_epoch = torch_lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 500, eta_min=1e-6), epochs, 1e-4
    )
    horizon = Horizon(per_epoch * epochs, per_epoch)
    ours = [float(learning_rate(s, horizon, cfg, 1e-4)) for s in range(per_epoch * epochs)]
    np.testing.assert_allclose(ours, np.repeat(by_epoch, per_epoch), rtol=1e-6)
    # without --t-max the horizon is the run's epochs
    run_long = OptimConfig(schedule="cosine", schedule_interval="epoch")
    assert float(learning_rate(3 * per_epoch, horizon, run_long, 1.0)) == pytest.approx(
        (1 + np.cos(np.pi * 3 / 4)) / 2, rel=1e-6
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"schedule": "cosine", "t_max": 0}, "--t-max must be >= 1 or -1, got 0"),
        # the default's warm-up (0.1) would be refused first: the cosine schedules have none
        ({"schedule": "cosine-restarts", "warmup_frac": 0}, "cosine-restarts needs --t0"),
        ({"schedule": "linear", "t_max": 9}, "--t-max goes with --schedule cosine, not linear"),
        ({"adam_eps": 0.0}, "--adam-eps must be > 0, got 0.0"),
        ({"adam_beta1": 1.0}, "--adam-beta1 must be < 1, got 1.0"),
        ({"adam_beta2": -0.1}, "--adam-beta2 must be >= 0, got -0.1"),
        ({"margin": 0.2}, "--margin 0.2 applies to --task ranking only"),
    ],
)
def test_recipe_flags_out_of_range_are_one_line(flags, message):
    from jaxtpu.core.errors import ConfigError
    from jaxtpu.core.flags.schema import Config

    with pytest.raises(ConfigError, match=re.escape(message)):
        Config().replace(**flags)


def test_onecycle_matches_torch():
    cfg = OptimConfig(schedule="onecycle", warmup_frac=0.3)
    ref = torch_lrs(
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=1e-3, total_steps=40, pct_start=0.3, cycle_momentum=False
        ),
        40,
        1e-3,
    )
    ours = [float(learning_rate(s, Horizon(40, 40), cfg, 1e-3)) for s in range(40)]
    np.testing.assert_allclose(ours, ref, rtol=1e-4)


def test_jax_schedule_equals_the_numpy_one_used_by_torch():
    import jax.numpy as jnp

    for cfg in (
        OptimConfig(schedule="constant", warmup_frac=0.1),
        OptimConfig(schedule="linear", warmup_frac=0.1),
        OptimConfig(schedule="cosine", eta_min=1e-6, t_max=12, schedule_interval="epoch"),
        OptimConfig(schedule="cosine-restarts", eta_min=1e-6, t0=4, t_mult=2),
        OptimConfig(schedule="onecycle", warmup_frac=0.1),
    ):
        horizon = Horizon(30, 2.5)
        a = [float(learning_rate(s, horizon, cfg, 2e-4, xp=jnp)) for s in range(30)]
        b = [float(learning_rate(s, horizon, cfg, 2e-4)) for s in range(30)]
        np.testing.assert_allclose(a, b, rtol=1e-5)  # float32 (jax) vs numpy's promotions


@pytest.mark.model
def test_no_decay_groups_match_between_sides():
    import jax

    from jaxtpu.engine import optim
    from jaxtpu.models import encoder as models
    from torchxla_ref import optim as torch_optim
    from torchxla_ref.models import Classifier

    enc = EncoderConfig(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
        vocab_size=100,
    )
    params = models.init_params(models.create_module(ModelSpec(enc, head_dropout=0.3)), (4,), 0)
    mask = optim.decay_mask(params)
    jax_decay = sum(
        x.size
        for x, m in zip(
            jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(mask), strict=True
        )
        if m
    )
    groups = torch_optim.param_groups(Classifier(enc, 0.3), 0.01)
    torch_decay = sum(p.numel() for p in groups[0]["params"])
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
    assert jax_decay == torch_decay > 0
    # --decay-params all: every parameter decays, on both sides
    total = sum(x.size for x in jax.tree_util.tree_leaves(params))
    assert all(jax.tree_util.tree_leaves(optim.decay_mask(params, "all")))
    groups = torch_optim.param_groups(Classifier(enc, 0.3), 0.01, "all")
    assert sum(p.numel() for p in groups[0]["params"]) == total > jax_decay
    assert not groups[1]["params"]


# clips; leaves the gradients alone; clips tiny gradients, where torch's 1e-6 shows
@pytest.mark.parametrize(("scale", "max_norm"), [(1.0, 0.5), (1.0, 1e3), (1e-5, 1e-5)])
def test_clipping_is_torchs_clip_grad_norm(scale, max_norm):
    """`optim.clip_by_global_norm` against `torch.nn.utils.clip_grad_norm_` on one gradient
    tree: the same scalar coefficient min(1, max_norm / (norm + 1e-6)) on every leaf."""
    import jax

    from jaxtpu.engine import optim

    rng = np.random.default_rng(0)
    grads = {"a": rng.normal(size=(7, 5)) * scale, "b": {"c": rng.normal(size=(11,)) * scale}}
    grads = jax.tree_util.tree_map(lambda g: g.astype(np.float32), grads)
    tx = optim.clip_by_global_norm(max_norm)
    ours, _ = tx.update(jax.tree_util.tree_map(jax.numpy.asarray, grads), tx.init(grads))
    params = [torch.nn.Parameter(torch.zeros(7, 5)), torch.nn.Parameter(torch.zeros(11))]
    params[0].grad, params[1].grad = torch.from_numpy(grads["a"]), torch.from_numpy(grads["b"]["c"])
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    assert (norm > max_norm) == (max_norm < 1.0)  # the case these parameters mean to test
    np.testing.assert_allclose(np.asarray(ours["a"]), params[0].grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ours["b"]["c"]), params[1].grad.numpy(), rtol=1e-6)
    if max_norm > norm:  # unclipped: exactly the gradients
        np.testing.assert_array_equal(np.asarray(ours["a"]), grads["a"])


def reference_transformers_adamw(params, grads_seq, lr, b1, b2, eps, wd, decays):
    """transformers.AdamW's step (transformers < 5, correct_bias=True) from its published
    code, in numpy: eps on sqrt(v) before the bias correction, decay after the step."""
    p = {k: v.astype(np.float64).copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, grads in enumerate(grads_seq, start=1):
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            step_size = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            p[k] = p[k] - step_size * m[k] / (np.sqrt(v[k]) + eps)
            if decays[k]:
                p[k] = p[k] - lr * wd * p[k]
    return p


def test_the_transformers_adamw_form_is_its_formula_on_both_sides():
    import jax
    import optax

    from jaxtpu.engine import optim
    from torchxla_ref.optim import TransformersAdamW

    rng = np.random.default_rng(0)
    params = {
        "kernel": rng.normal(size=(5, 3)).astype(np.float32),
        "bias": rng.normal(size=(3,)).astype(np.float32),
    }
    grads_seq = [
        {k: rng.normal(size=x.shape).astype(np.float32) for k, x in params.items()}
        for _ in range(4)
    ]
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-6, 0.1
    want = reference_transformers_adamw(
        params, grads_seq, lr, b1, b2, eps, wd, {"kernel": True, "bias": False}
    )

    tx = optim.transformers_adamw(optax.constant_schedule(lr), b1, b2, eps, wd, optim.decay_mask)
    p = jax.tree_util.tree_map(jax.numpy.asarray, params)
    state = tx.init(p)
    for g in grads_seq:
        updates, state = tx.update(jax.tree_util.tree_map(jax.numpy.asarray, g), state, p)
        p = optax.apply_updates(p, updates)
    for k in params:
        np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=1e-5, atol=1e-7)

    tp = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    groups = [
        {"params": [tp["kernel"]], "weight_decay": wd},
        {"params": [tp["bias"]], "weight_decay": 0.0},
    ]
    opt = TransformersAdamW(groups, lr=lr, betas=(b1, b2), eps=eps)
    for g in grads_seq:
        for k in tp:
            tp[k].grad = torch.from_numpy(g[k])
        opt.step()
    for k in params:
        np.testing.assert_allclose(tp[k].detach().numpy(), want[k], rtol=1e-5, atol=1e-7)
    # and it is not torch's AdamW (the notebooks' gap)
    torch_p = torch.nn.Parameter(torch.from_numpy(params["kernel"].copy()))
    plain = torch.optim.AdamW([torch_p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for g in grads_seq:
        torch_p.grad = torch.from_numpy(g["kernel"])
        plain.step()
    assert np.abs(torch_p.detach().numpy() - want["kernel"]).max() > 1e-5
