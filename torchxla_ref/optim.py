"""torch AdamW (or the transformers.AdamW the Kaggle notebooks ran) with the same parameter
groups and step-for-step the same schedule as optax."""

from __future__ import annotations

import math

import numpy as np
import torch

from jaxtpu.core.flags.schema import OptimConfig
from jaxtpu.core.schedules import Horizon, learning_rate, peak_lr

# The seeds' no_decay list: biases and LayerNorm parameters get no weight decay.
NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def param_groups(
    model: torch.nn.Module, weight_decay: float, which: str = "not-bias-or-norm"
) -> list[dict]:
    """The decayed and the undecayed parameters (`--decay-params`)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        skip = which != "all" and any(nd in name for nd in NO_DECAY)
        (no_decay if skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class TransformersAdamW(torch.optim.Optimizer):
    """`transformers.AdamW` (removed in transformers 5), `correct_bias=True`: eps added to
    sqrt(v) before the bias correction, weight decay applied to the stepped weights (see
    `jaxtpu.optim.transformers_adamw`, the same formula)."""

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
    """AdamW (`--adamw`, `--adam-beta1/2`, `--adam-eps`, `--decay-params`) and a LambdaLR
    evaluating `jaxtpu.core.schedules`."""
    peak = peak_lr(cfg, num_devices)
    groups = param_groups(model, cfg.weight_decay, cfg.decay_params)
    betas, eps = (cfg.adam_beta1, cfg.adam_beta2), cfg.adam_eps
    if cfg.adamw == "transformers":
        opt: torch.optim.Optimizer = TransformersAdamW(groups, lr=peak, betas=betas, eps=eps)
    else:
        opt = torch.optim.AdamW(groups, lr=peak, betas=betas, eps=eps)

    def factor(step: int) -> float:
        return float(learning_rate(step, horizon, cfg, peak, xp=np)) / peak

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
