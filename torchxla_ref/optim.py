"""torch AdamW with the same parameter groups and step-for-step the same schedule as optax."""

from __future__ import annotations

import numpy as np
import torch

from jaxtpu.core.config import OptimConfig
from jaxtpu.core.schedules import learning_rate, peak_lr

# The seeds' no_decay list: biases and LayerNorm parameters get no weight decay.
NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if any(nd in name for nd in NO_DECAY) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_updates: int, num_devices: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (betas 0.9/0.999, eps 1e-8) and a LambdaLR evaluating `jaxtpu.core.schedules`."""
    peak = peak_lr(cfg, num_devices)
    opt = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=peak, betas=(0.9, 0.999), eps=1e-8
    )

    def factor(step: int) -> float:
        return float(learning_rate(step, total_updates, cfg, peak, xp=np)) / peak

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
