"""torch AdamW (or the transformers.AdamW the Kaggle notebooks ran) with the same parameter
groups and step-for-step the same schedule as optax."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from jaxtpu.core.flags.schema import OptimConfig
from jaxtpu.core.hf.families import get_family
from jaxtpu.core.lora import peft_key
from jaxtpu.core.schedules import Horizon, layer_lr_scale, learning_rate, peak_lr

# The seeds' no_decay list: biases and LayerNorm parameters get no weight decay.
NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def param_groups(
    model: torch.nn.Module,
    weight_decay: float,
    which: str = "not-bias-or-norm",
    scale: Callable[[str], float] | None = None,
) -> list[dict]:
    """The decayed and the undecayed parameters (`--decay-params`), and with `scale` (a
    parameter name -> its learning-rate multiplier, `layer_lr_scale`) one such pair per
    multiplier, each group's `lr_scale` set (`make_optimizer` turns it into the group's lr)."""
    groups: dict[tuple[float, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue  # LoRA's frozen base: no group, no optimizer state
        if name.startswith("bert."):  # a peft-wrapped encoder's parameters by their plain keys
            name = "bert." + peft_key(name.removeprefix("bert."))
        skip = which != "all" and any(nd in name for nd in NO_DECAY)
        key = (scale(name) if scale else 1.0, not skip)
        groups.setdefault(key, []).append(p)
    if scale is None:  # the notebooks' two groups, in their order, even when one is empty
        groups.setdefault((1.0, True), [])
        groups.setdefault((1.0, False), [])
    return [
        {"params": ps, "weight_decay": weight_decay if decayed else 0.0, "lr_scale": s}
        for (s, decayed), ps in sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1]))
    ]


class TransformersAdamW(torch.optim.Optimizer):
    """`transformers.AdamW` (removed in transformers 5), `correct_bias=True`: eps added to
    sqrt(v) before the bias correction, weight decay applied to the stepped weights (see
    `jaxtpu.engine.optim.transformers_adamw`, the same formula)."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                step_size = group["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-step_size)
                if group["weight_decay"]:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])


def make_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, horizon: Horizon, num_devices: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (`--adamw`, `--adam-beta1/2`, `--adam-eps`, `--decay-params`, with
    --layer-lr-decay/--head-lr a parameter group per rate) and a LambdaLR evaluating
    `jaxtpu.core.schedules` (it scales every group's own peak rate)."""
    peak = peak_lr(cfg, num_devices)
    scale = None
    if cfg.layerwise:
        layers = model.bert.config.num_hidden_layers
        embedding = get_family(model.bert.config.model_type).kind.embedding_modules

        def scale(name: str) -> float:
            return layer_lr_scale(name, layers, cfg.layer_lr_decay, cfg.head_scale, embedding)

    groups = param_groups(model, cfg.weight_decay, cfg.decay_params, scale)
    for group in groups:
        group["lr"] = peak * group.pop("lr_scale")
    betas, eps = (cfg.adam_beta1, cfg.adam_beta2), cfg.adam_eps
    if cfg.adamw == "transformers":
        opt: torch.optim.Optimizer = TransformersAdamW(groups, lr=peak, betas=betas, eps=eps)
    else:
        opt = torch.optim.AdamW(groups, lr=peak, betas=betas, eps=eps)

    def factor(step: int) -> float:
        return float(learning_rate(step, horizon, cfg, peak, xp=np)) / peak

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
