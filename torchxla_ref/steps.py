"""Losses and the training/eval step bodies of the torch side (device-agnostic)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from jaxtpu.core.tasks import RANKING_MARGIN, Task, get_task


def _bce(scores: torch.Tensor, label: torch.Tensor, margin: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(scores, label, reduction="none")


def _margin_ranking(scores: torch.Tensor, label: torch.Tensor, margin: float) -> torch.Tensor:
    ones = torch.ones_like(scores[:, 0])
    return F.margin_ranking_loss(scores[:, 1], scores[:, 0], ones, margin=margin, reduction="none")


def _masked_bce(scores: torch.Tensor, label: torch.Tensor, margin: float) -> torch.Tensor:
    # scores, label (B, 6); a blank label (NaN) is not scored: the mean over the known ones.
    known = ~torch.isnan(label)
    per = _bce(scores, torch.where(known, label, torch.zeros_like(label)), margin)
    return torch.where(known, per, torch.zeros_like(per)).sum(-1) / known.sum(-1).clamp(min=1)


# Per-example loss of each task of `jaxtpu.core.tasks.TASKS`, as `jaxtpu.engine.steps.LOSSES`:
# (scores, label, margin) -> (B,); only the ranking loss reads `margin` (--margin).
LOSSES = {
    "toxicity": _bce,
    "ranking": _margin_ranking,
    "multilabel": _masked_bce,
    "rules": _bce,
}


def task_loss(
    task: Task | str, scores: torch.Tensor, label: torch.Tensor, margin: float
) -> torch.Tensor:
    """Per-example loss of a task (a `Task` or a task name), as `jaxtpu.engine.steps.task_loss`: its
    `LOSSES` entry, plus `aux_weight` x the masked BCE of the auxiliary outputs."""
    task = get_task(task) if isinstance(task, str) else task
    own = LOSSES[task.name]
    if not task.aux_columns:
        return own(scores, label, margin)
    k = task.main_outputs
    mine = (lambda a: a[..., 0]) if k == 1 else (lambda a: a[..., :k])  # noqa: E731
    aux = _masked_bce(scores[..., k:], label[..., k:], margin)
    return own(mine(scores), mine(label), margin) + task.aux_weight * aux


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """bf16 or fp16 compute with fp32 master weights (torch.autocast), like the JAX side's
    policy; fp32 as it is."""
    if precision in AUTOCAST:
        return torch.autocast(device_type, dtype=AUTOCAST[precision])
    return contextlib.nullcontext()


def grad_scaler(precision: str, device_type: str, init_scale: float, growth_interval: int):
    """--precision fp16's dynamic loss scaling: `torch.amp.GradScaler` (growth x2, backoff
    x0.5, its defaults and Lightning's); None for bf16 and fp32."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device_type, init_scale=init_scale, growth_interval=growth_interval)


def loss_fn(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    task: Task | str,
    precision: str,
    device_type: str,
    margin: float = RANKING_MARGIN,
) -> torch.Tensor:
    """Mean loss of one (per-replica or global) batch weighted by its row weights
    (`jaxtpu.core.tasks.Task.batch_layout`): sum(w x) / sum(w), 0 when every weight is 0."""
    with autocast(precision, device_type):
        scores = model(batch["input_ids"], batch["attention_mask"])
    losses = task_loss(task, scores.float(), batch["label"], margin)
    weight = batch["row_weight"]
    total = weight.sum()
    return (losses * weight).sum() / torch.where(total > 0, total, torch.ones_like(total))


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: dict[str, torch.Tensor],
    *,
    task: Task | str,
    precision: str,
    device_type: str,
    accumulate: int,
    update: bool,
    clip_norm: float,
    reduce_gradients: Callable[[torch.optim.Optimizer], None] | None = None,
    margin: float = RANKING_MARGIN,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward + backward (gradients summed over `accumulate` micro-steps); on `update`,
    all-reduce gradients across replicas (spawn path: `xm.reduce_gradients`, i.e. the first
    half of `xm.optimizer_step`, split off so clipping sees the global gradient), clip, step
    the optimizer and the schedule, and zero the grads.

    With a `scaler` (--precision fp16, `grad_scaler`) the loss is scaled before the backward
    pass and the gradients unscaled before clipping, as torch's AMP recipe does; a step whose
    gradients are not finite is skipped by `GradScaler.step`, and then the schedule is not
    stepped either (it counts the updates made, as optax's count does on the JAX side).

    Returns:
      (loss, grad_norm or None): the micro-batch loss and, on updates, the pre-clip norm.
    """
    loss = loss_fn(model, batch, task, precision, device_type, margin)
    scaled = loss / accumulate
    (scaled if scaler is None else scaler.scale(scaled)).backward()
    grad_norm = None
    if update:
        if reduce_gradients is not None:
            reduce_gradients(optimizer)
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for p in model.parameters() if p.grad is not None]
        if clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
        else:
            grad_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
            )
        if scaler is None:
            optimizer.step()
            scheduler.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() >= before:  # a skipped step always halves the scale
                scheduler.step()
        optimizer.zero_grad(set_to_none=False)
    return loss.detach(), grad_norm


@torch.no_grad()
def eval_step(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    task: Task | str,
    precision: str,
    device_type: str,
    margin: float = RANKING_MARGIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    with autocast(precision, device_type):
        scores = model(batch["input_ids"], batch["attention_mask"])
    scores = scores.float()
    return scores, task_loss(task, scores, batch["label"], margin)
