"""`JaxBackend`: the JAX side of the shared loop (`jaxtpu.core.run.protocol.Backend`): a strategy
(pmap, jit or shard_map), the train state on its devices, and the run's checkpoints.

A library module: `jaxtpu.train` builds one per run, `jaxtpu.predict` one to score with, the
benchmark worker one to time steps with.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.engine.parallel import Strategy

log = logging.getLogger("jaxtpu")


class JaxBackend:
    """The train state of one run on the strategy's devices, and what the loop asks of it.

    Built with the state on the host; `restore_latest` (with --resume) replaces it there, and
    `start` places it on the devices and builds the steps (`Strategy.place`), once."""

    name = "jaxtpu"

    def __init__(
        self,
        strategy: Strategy,
        state: Any,
        seed: int,
        ckpts: Any = None,
        steps_per_call: int = 1,
    ) -> None:
        self.strategy = strategy
        self.steps_per_call = steps_per_call  # K: every train call holds K batch slots
        self._host_state: Any = state
        self.state: Any = None  # on the devices, from `start` on
        self.num_devices = strategy.n
        self.device_kind = strategy.devices[0].device_kind  # e.g. "TPU v3", for the MFU
        self.procs = strategy.procs
        self.num_processes = self.procs.count
        self.primary = self.procs.primary
        self.rng = jax.random.key(seed)
        self.ckpts = ckpts

    def start(self) -> None:
        """Places the state on the devices and builds the compiled steps for it."""
        if self.state is not None:
            raise RuntimeError("the backend has started already")
        self.state = self.strategy.place(self._host_state)
        self._host_state = None

    def restore_latest(self, model_key: dict[str, Any]) -> ResumeState:
        """Continues from the run's latest checkpoint (a fresh start when there is none)."""
        if self.state is not None:
            raise RuntimeError("restore_latest must come before start")
        if self.ckpts.latest_step() is None:
            log.info("--resume: no checkpoint in %s yet, starting at step 0", self.ckpts.root)
            return ResumeState()
        host = self._host_state
        restored, meta = self.ckpts.restore_latest(_tree(host), model_key)
        self._host_state = _untree(host, restored)
        log.info("resumed from %s at step %d", self.ckpts.latest_dir, int(meta["step"]))
        return ResumeState.of(meta)

    def compile_count(self) -> int:
        """Train programs compiled so far (one per call length; none for a program loaded
        from --programs)."""
        return self.strategy.compiled_train_programs()

    def local_rows(self, n: int) -> slice:
        return self.procs.rows(n)

    def any_process(self, flag: bool) -> bool:
        return self.procs.any(flag)

    def preemption_point(self, index: int) -> bool:
        return self.procs.preemption_point(index)

    def stack(self, batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return stack_steps(batches, self.steps_per_call)

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> Any:
        """The call's batches stacked in K slots and placed on the devices."""
        return self.strategy.put_steps(self.stack(batches)), len(batches)

    def precompile(
        self, calls: list[list[dict[str, np.ndarray]]], evals: list[dict[str, np.ndarray]]
    ) -> int:
        """Compiles, before the first step, the train call of each of `calls` and the eval
        step of each of `evals` (one of each shape the run will use), several at a time.
        Returns the number of programs compiled (0 under pmap, which compiles on first use;
        a program loaded from --programs is not compiled)."""
        stacked = [self.stack(c) for c in calls]
        return self.strategy.precompile(self.state, self.rng, stacked, evals)

    def train_steps(self, prepared: Any) -> list[Any]:
        """One device call over the K stacked batches (K >= 1, `steps.train_steps`)."""
        placed, real = prepared
        self.state, metrics = self.strategy.train(self.state, placed, self.rng)
        return [(metrics, real)]

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        """The metrics of the real steps of each call (padding slots left out)."""
        return [m for metrics, real in handles for m in self.strategy.host_metrics(metrics)[:real]]

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.strategy.eval(self.state, self.strategy.put_batch(batch))

    def save_latest(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save_latest(step, _tree(self.strategy.host_state(self.state)), meta)

    def save_best(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save_best(step, self.strategy.host_state(self.state).params, meta)

    def wait_for_checkpoints(self) -> None:
        self.ckpts.wait()

    def profile_start(self, directory: Path) -> None:
        """Starts a `jax.profiler` trace into `directory` (`--profile-steps`)."""
        jax.profiler.start_trace(str(directory))

    def profile_stop(self) -> None:
        jax.profiler.stop_trace()

    def device_memory_mb(self) -> list[float] | None:
        """Peak memory per device of this process, where the backend reports it (TPU/GPU; not
        XLA:CPU)."""
        stats = [d.memory_stats() or {} for d in self.strategy.local_devices]
        peaks = [s.get("peak_bytes_in_use") for s in stats]
        return None if None in peaks else [round(p / 2**20, 1) for p in peaks]


def stack_steps(batches: list[dict[str, np.ndarray]], k: int) -> dict[str, np.ndarray]:
    """The batches of one call stacked on a leading axis of `k` slots: a call of fewer batches
    (the end of a bucket, an epoch, a run) fills the rest with weight-0 copies of its first
    batch, which the step skips. So one program serves every call of a length."""
    slots = batches + [_padding(batches[0])] * (k - len(batches))
    return {name: np.stack([b[name] for b in slots]) for name in batches[0]}


def _padding(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A padding slot: `batch` with every row's weight 0 (`steps.train_steps` skips it)."""
    return {
        **batch,
        "weight": np.zeros_like(batch["weight"]),
        "row_weight": np.zeros_like(batch["weight"]),
    }


def _tree(state: Any) -> dict[str, Any]:
    """What a latest checkpoint holds of a train state: step, params, optimizer state and, in
    a --precision fp16 run, the loss scale and its count of finite steps (the torch side
    saves `GradScaler.state_dict()`)."""
    tree = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    if state.loss_scale is not None:
        scale = state.loss_scale
        tree["loss_scale"] = {"scale": scale.scale, "fin_steps": scale.fin_steps}
    return tree


def _untree(state: Any, tree: dict[str, Any]) -> Any:
    """`state` with what `_tree` saved restored into it."""
    scale = tree.pop("loss_scale", None)
    state = state.replace(**tree)
    if scale is None:
        return state
    return state.replace(loss_scale=state.loss_scale.replace(**scale))
