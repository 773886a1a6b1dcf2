"""`TrainState` and the pure train/eval steps shared by the pmap and the jit path, built once
per task (`for_task`) with the task's loss and its hyperparameters closed over.

The steps know nothing of devices. Under `pmap` (or `shard_map`) they are called with
`axis_name`, and average gradients and metrics over that axis with `lax.pmean`; under `jit`
with shardings the batch is global and XLA inserts the reductions itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct, traverse_util
from flax.training import train_state
from flax.training.dynamic_scale import DynamicScale

from jaxtpu.core.errors import UserError
from jaxtpu.core.lora import has_adapters, trains
from jaxtpu.core.serving.heads import POOLED
from jaxtpu.core.tasks import RANKING_MARGIN, Task, get_task

Batch = dict[str, jax.Array]
Loss = Callable[[jax.Array, jax.Array], jax.Array]  # (scores, label) -> per-example loss (B,)

__all__ = [
    "LOSSES",
    "Steps",
    "TrainState",
    "create_state",
    "dynamic_scale",
    "eval_step",
    "for_task",
    "loss_scaler",
    "merge_trained",
    "split_trained",
    "train_step",
    "train_steps",
]


def _bce(scores: jax.Array, label: jax.Array, margin: float) -> jax.Array:
    return optax.sigmoid_binary_cross_entropy(scores, label)  # BCE with logits


def _margin_ranking(scores: jax.Array, label: jax.Array, margin: float) -> jax.Array:
    # torch.nn.MarginRankingLoss(x1=more, x2=less, y=1): max(0, -(more - less) + margin)
    return jax.nn.relu(margin - (scores[:, 1] - scores[:, 0]))


def _masked_bce(scores: jax.Array, label: jax.Array, margin: float) -> jax.Array:
    # scores, label (B, 6); a blank label (NaN) is not scored: the mean over the known ones.
    # The label is made finite before the loss, so no NaN reaches the gradient.
    known = ~jnp.isnan(label)
    per = optax.sigmoid_binary_cross_entropy(scores, jnp.where(known, label, 0.0))
    return jnp.where(known, per, 0.0).sum(-1) / jnp.maximum(known.sum(-1), 1)


# Per-example loss of each task of `jaxtpu.core.tasks.TASKS`: (scores, label, margin) -> (B,);
# `margin` is --margin, which only the ranking loss reads.
LOSSES = {
    "toxicity": _bce,  # BCE with logits (soft targets allowed)
    "ranking": _margin_ranking,  # scores (B, 2): less, more toxic
    "multilabel": _masked_bce,  # BCE with logits per label, blank labels masked
    "rules": _bce,  # BCE with logits of rule_violation
}


def _weighted_mean(values: jax.Array, weight: jax.Array) -> jax.Array:
    """sum(w x) / sum(w); 0 when every weight is 0 (weights may be fractions, so no clamp at
    1: the torch side's `loss_fn` is the same)."""
    total = jnp.sum(weight)
    return jnp.sum(values * weight) / jnp.where(total > 0, total, 1.0)


@dataclass(frozen=True)
class Steps:
    """A task's pure steps, its loss closed over: what every strategy compiles.

    `train(state, batches, rng, axis_name=None)` is `train_steps`; `eval(state, batch)` is
    `eval_step`."""

    train: Callable[..., tuple[TrainState, dict[str, jax.Array]]]
    eval: Callable[..., dict[str, jax.Array]]


def task_loss(task: Task | str, margin: float = RANKING_MARGIN) -> Loss:
    """The per-example loss of a task (a `Task`, or a name of `jaxtpu.core.tasks.TASKS`): its
    `LOSSES` entry with the ranking `margin` (--margin, which only the ranking loss reads),
    plus, with auxiliary targets, `aux_weight` x the masked BCE of the outputs after the
    task's own (`Task.aux_columns`; `torchxla_ref.steps.task_loss` is the same)."""
    task = get_task(task) if isinstance(task, str) else task
    own = partial(LOSSES[task.name], margin=margin)
    if not task.aux_columns:
        return own
    k, weight = task.main_outputs, task.aux_weight

    def loss(scores: jax.Array, label: jax.Array) -> jax.Array:
        mine = (lambda a: a[..., 0]) if k == 1 else (lambda a: a[..., :k])  # noqa: E731
        aux = _masked_bce(scores[..., k:], label[..., k:], margin)
        return own(mine(scores), mine(label)) + weight * aux

    return loss


def for_task(task: Task | str, margin: float = RANKING_MARGIN, pooled: bool = False) -> Steps:
    """The steps of a task (a `Task` or a name of `jaxtpu.core.tasks.TASKS`) with its loss
    (`task_loss`) closed over; `pooled`: the eval step also gives each comment's vector."""
    loss = task_loss(task, margin)
    return Steps(partial(train_steps, loss=loss), partial(eval_step, loss=loss, pooled=pooled))


def split_trained(params: Any) -> tuple[Any, Any]:
    """(what trains, what is frozen) of a model's params: under LoRA (the params hold
    adapters) the adapters and the head, and the base (`jaxtpu.core.lora.trains`); else
    (params, None). The split is by name, so it is the same inside a compiled step."""
    flat = traverse_util.flatten_dict(params)
    if not has_adapters(flat):
        return params, None
    trained = {path: x for path, x in flat.items() if trains(path)}
    frozen = {path: x for path, x in flat.items() if not trains(path)}
    return traverse_util.unflatten_dict(trained), traverse_util.unflatten_dict(frozen)


def merge_trained(trained: Any, frozen: Any) -> Any:
    """The inverse of `split_trained`."""
    if frozen is None:
        return trained
    flat = {**traverse_util.flatten_dict(trained), **traverse_util.flatten_dict(frozen)}
    return traverse_util.unflatten_dict(flat)


class TrainState(train_state.TrainState):
    """flax's train state, plus `loss_scale`: the dynamic loss scale of a --precision fp16 run
    (`dynamic_scale`; None otherwise, which adds no leaf)."""

    loss_scale: DynamicScale | None = struct.field(default=None)


def dynamic_scale(scale: float, growth_interval: int) -> DynamicScale:
    """flax's `DynamicScale` behaving as `torch.amp.GradScaler(init_scale=scale,
    growth_interval=growth_interval)` (growth x2, backoff x0.5), which the torch side runs.

    flax's and torch's rules differ by one in the interval: GradScaler doubles the scale on
    the `growth_interval`-th finite step in a row, `DynamicScale` on the step after
    `growth_interval` finite ones (it checks the count before adding the step). So flax is
    given `growth_interval - 1`. The scale and the count are fp32 and int32 arrays, so a
    step's carry keeps one type (a Python float would be weakly typed)."""
    return DynamicScale(
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=growth_interval - 1,
        fin_steps=np.int32(0),
        scale=np.float32(scale),
    )


def loss_scaler(train: Any) -> DynamicScale | None:
    """The dynamic loss scale of a run's `TrainConfig` (--precision fp16: --loss-scale,
    --loss-scale-growth-interval), None for bf16 and fp32 runs."""
    if train.precision != "fp16":
        return None
    return dynamic_scale(train.loss_scale, train.loss_scale_growth_interval)


def create_state(
    apply_fn: Callable[..., Any], params: Any, tx: Any, loss_scale: DynamicScale | None = None
) -> TrainState:
    """A train state at step 0 whose optimizer holds state for what trains only
    (`split_trained`): under LoRA no moments for the frozen base. `loss_scale`: an fp16 run's
    `dynamic_scale`."""
    return TrainState(
        step=0,
        apply_fn=apply_fn,
        params=params,
        tx=tx,
        opt_state=tx.init(split_trained(params)[0]),
        loss_scale=loss_scale,
    )


def train_step(
    state: TrainState,
    batch: Batch,
    rng: jax.Array,
    *,
    loss: Loss,
    axis_name: str | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step (or one accumulation micro-step under optax.MultiSteps).

    Args:
      state: the train state (replicated under pmap).
      batch: this device's (pmap) or the global (jit) batch, see `jaxtpu.core.data.taskdata`.
      rng: the run's base key; dropout uses fold_in(rng, step) (and the device index).
      loss: the task's per-example loss (`for_task`).
      axis_name: the device axis to average over, under pmap/shard_map.
    Returns:
      (new_state, {'loss', 'grad_norm'}), metrics averaged over all devices; with a loss
      scale (--precision fp16) also 'loss_scale' (the scale this step's loss was multiplied
      by) and 'skipped' (1 when a gradient was not finite: params, optimizer and schedule
      are kept as they were, as `torch.amp.GradScaler.step` skips the optimizer).
    """
    rng = jax.random.fold_in(rng, state.step)
    if axis_name is not None:
        rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))

    def loss_fn(params: Any) -> jax.Array:
        scores = state.apply_fn(
            {"params": params},
            batch["input_ids"],
            batch["attention_mask"],
            deterministic=False,
            rngs={"dropout": rng},
        )
        return _weighted_mean(loss(scores, batch["label"]), batch["row_weight"])

    trained, frozen = split_trained(state.params)
    scaler = state.loss_scale

    def of_trained(p: Any) -> jax.Array:
        return loss_fn(merge_trained(p, frozen))

    if scaler is None:
        value, grads = jax.value_and_grad(of_trained)(trained)
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
    else:  # the gradients of scale x loss, unscaled (and averaged over axis_name)
        scaler, finite, value, grads = scaler.value_and_grad(of_trained, axis_name=axis_name)(
            trained
        )
    if axis_name is not None:
        value = jax.lax.pmean(value, axis_name)
    metrics = {"loss": value, "grad_norm": optax.tree.norm(grads)}
    updates, opt_state = state.tx.update(grads, state.opt_state, trained)
    stepped = optax.apply_updates(trained, updates)
    if scaler is not None:  # a skipped step: what trains and its optimizer kept as they were
        keep = partial(jnp.where, finite)
        stepped = jax.tree_util.tree_map(keep, stepped, trained)
        opt_state = jax.tree_util.tree_map(keep, opt_state, state.opt_state)
        metrics.update(loss_scale=state.loss_scale.scale, skipped=(~finite).astype(jnp.float32))
    params = merge_trained(stepped, frozen)
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return (new if scaler is None else new.replace(loss_scale=scaler)), metrics


def train_steps(
    state: TrainState,
    batches: Batch,
    rng: jax.Array,
    *,
    loss: Loss,
    axis_name: str | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """K `train_step`s in one device call (`lax.scan` over the leading axis of `batches`), as
    Keras' `steps_per_execution` does: one dispatch and one host round trip per K steps. The
    only training entry point of every strategy; K = 1 is a plain step. A call of fewer real
    batches fills its other slots with weight-0 batches, which are skipped (no step).
    Returns the final state and each step's metrics stacked on a leading K axis (zeros for
    skipped slots)."""

    def step(st: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        return train_step(st, batch, rng, loss=loss, axis_name=axis_name)

    if jax.tree_util.tree_leaves(batches)[0].shape[0] == 1:
        # K = 1 (a static shape): a plain step, because a scan of length one ran slower on
        # XLA:CPU (`python -m benchmarks.training.compare` measures steps per call).
        state, metrics = step(state, jax.tree_util.tree_map(lambda x: x[0], batches))
        return state, jax.tree_util.tree_map(lambda x: x[None], metrics)

    def body(st: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        # A slot whose batch has no weight anywhere is padding (a call of fewer than K
        # batches; a training batch always holds a real row): the state passes through
        # unchanged, so every call of one sequence length runs the same compiled program.
        # Only the taken branch runs.
        real = jnp.sum(batch["weight"])
        if axis_name is not None:
            real = jax.lax.psum(real, axis_name)
        scaled = st.loss_scale is not None
        names = ["loss", "grad_norm", *(("loss_scale", "skipped") if scaled else ())]
        padding = {name: jnp.zeros((), jnp.float32) for name in names}
        return jax.lax.cond(real > 0, step, lambda st, _: (st, padding), st, batch)

    return jax.lax.scan(body, state, batches)


def eval_step(
    state: TrainState, batch: Batch, *, loss: Loss, pooled: bool = False
) -> dict[str, jax.Array]:
    """Per-example scores and losses (deterministic: no dropout). Reduction happens on the host
    over the whole evaluation set, see `jaxtpu.core.tasks.Task.validation_metrics`. `pooled`:
    also each example's vector under the head (`POOLED`, what a community's head reads), from
    the same forward pass."""
    variables = {"params": state.params}
    args = (batch["input_ids"], batch["attention_mask"])
    if not pooled:
        scores = state.apply_fn(variables, *args, deterministic=True)
        return {"score": scores, "loss": loss(scores, batch["label"])}
    scores, sown = state.apply_fn(variables, *args, deterministic=True, mutable=["intermediates"])
    if POOLED not in sown.get("intermediates", {}):
        raise UserError(
            "this model's classification head gives no vector (a --head hf run's is "
            "transformers' own): a community's head and a readout of Perspective's attributes "
            "read the vector of jaxtpu's head (--head jaxtpu)"
        )
    (vector,) = sown["intermediates"][POOLED]
    return {"score": scores, "loss": loss(scores, batch["label"]), POOLED: vector}
