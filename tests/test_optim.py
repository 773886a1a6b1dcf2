"""Schedules against PyTorch's own implementations, and the AdamW no-decay groups."""

from __future__ import annotations

import numpy as np
import pytest

from jaxtpu.core.config import OptimConfig
from jaxtpu.core.encoder import EncoderConfig
from jaxtpu.core.schedules import learning_rate

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
    ref = torch_lrs(lambda o: get_linear_schedule_with_warmup(o, int(warmup_frac * total), total),
                    total, 1e-3)  # fmt: skip
    ours = [float(learning_rate(s, total, cfg, 1e-3)) for s in range(total)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("warmup_frac", [0.0, 0.2])
def test_constant_matches_transformers(warmup_frac):
    """The same warm-up formula as the linear schedule's (transformers uses one for both)."""
    from transformers import get_constant_schedule_with_warmup

    cfg = OptimConfig(schedule="constant", warmup_frac=warmup_frac)
    ref = torch_lrs(lambda o: get_constant_schedule_with_warmup(o, int(warmup_frac * 50)), 50, 1e-3)
    ours = [float(learning_rate(s, 50, cfg, 1e-3)) for s in range(50)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-12)


def test_cosine_with_a_warmup_is_refused():
    from jaxtpu.core.config import Config
    from jaxtpu.core.errors import ConfigError

    with pytest.raises(ConfigError, match="cosine schedule has no warm-up"):
        Config().replace(schedule="cosine", warmup_frac=0.1)


def test_cosine_matches_cosine_annealing():
    cfg = OptimConfig(schedule="cosine", eta_min=1e-5)
    ref = torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 40, eta_min=1e-5),
                    40, 1e-3)  # fmt: skip
    ours = [float(learning_rate(s, 40, cfg, 1e-3)) for s in range(40)]
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


def test_onecycle_matches_torch():
    cfg = OptimConfig(schedule="onecycle", warmup_frac=0.3)
    ref = torch_lrs(
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-3, total_steps=40,
                                                      pct_start=0.3, cycle_momentum=False),
        40, 1e-3,
    )  # fmt: skip
    ours = [float(learning_rate(s, 40, cfg, 1e-3)) for s in range(40)]
    np.testing.assert_allclose(ours, ref, rtol=1e-4)


def test_jax_schedule_equals_the_numpy_one_used_by_torch():
    import jax.numpy as jnp

    for schedule in ("constant", "linear", "cosine", "onecycle"):
        cfg = OptimConfig(schedule=schedule, warmup_frac=0.1, eta_min=1e-6)
        a = [float(learning_rate(s, 30, cfg, 2e-4, xp=jnp)) for s in range(30)]
        b = [float(learning_rate(s, 30, cfg, 2e-4)) for s in range(30)]
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_no_decay_groups_match_between_sides():
    import jax

    from jaxtpu import models, optim
    from torchxla_ref import optim as torch_optim
    from torchxla_ref.models import Classifier

    enc = EncoderConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                          num_hidden_layers=1, vocab_size=100)  # fmt: skip
    params = models.init_params(models.create_module(enc, 0.3, "fp32"), (4,), 0)
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


# clips; leaves the gradients alone; clips tiny gradients, where torch's 1e-6 shows
@pytest.mark.parametrize(("scale", "max_norm"), [(1.0, 0.5), (1.0, 1e3), (1e-5, 1e-5)])
def test_clipping_is_torchs_clip_grad_norm(scale, max_norm):
    """`optim.clip_by_global_norm` against `torch.nn.utils.clip_grad_norm_` on one gradient
    tree: the same scalar coefficient min(1, max_norm / (norm + 1e-6)) on every leaf."""
    import jax

    from jaxtpu import optim

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
