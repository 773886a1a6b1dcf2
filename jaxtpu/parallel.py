"""The only device-aware module: device set-up, and the pmap and sharded-jit wrappers.

Both strategies wrap the same pure `jaxtpu.steps.train_step` / `eval_step`:
- `PmapStrategy`: replicated state, per-device batch shards on a leading device axis,
  `lax.pmean` of gradients inside the step, donated state buffers.
- `JitStrategy` (pjit): `jax.jit` with `NamedSharding` over a `Mesh(('data', 'fsdp'))`; the
  batch is sharded on `data`, params are replicated (`fsdp` has size 1 today, so params can be
  sharded on it later without touching model code). The compiler inserts the all-reduce.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtpu import steps
from jaxtpu.config import UserError

log = logging.getLogger(__name__)


class DeviceError(UserError):
    """The requested devices are not available."""


def init_devices(num_devices: int) -> list[jax.Device]:
    """The first `num_devices` devices of the default backend.

    On a machine without accelerators this asks JAX for `num_devices` virtual CPU devices,
    which must happen before the backend starts; on TPU/GPU the setting is ignored and the
    first `num_devices` real devices are used.
    """
    user_fixed = "JAX_NUM_CPU_DEVICES" in os.environ or (
        "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    )
    if not user_fixed:  # a count the user set for this machine is respected
        try:
            jax.config.update("jax_num_cpu_devices", max(num_devices, 1))
        except RuntimeError:
            pass  # backend already started (e.g. a second run in one process): use what it has
    devices = jax.local_devices()
    if num_devices > len(devices):
        raise DeviceError(
            f"--num-devices {num_devices}: only {len(devices)} {devices[0].platform} device(s) "
            f"available; use --num-devices {len(devices)} or fewer"
        )
    return devices[:num_devices]


class Strategy:
    """Common interface of the two data-parallel strategies."""

    name = "base"

    def __init__(self, devices: list[jax.Device], task: str) -> None:
        self.devices = devices
        self.n = len(devices)
        self.task = task
        self.traces = 0  # how often the train step was traced (compiled); 1 after warm-up

    def _counted(self, fn: Any) -> Any:
        def traced(*args: Any) -> Any:
            self.traces += 1  # runs at trace time only
            return fn(*args)

        return traced

    def put_state(self, state: steps.TrainState) -> steps.TrainState:
        raise NotImplementedError

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def train_step(self, state: Any, batch: Any, rng: jax.Array) -> tuple[Any, Any]:
        raise NotImplementedError

    def eval_step(self, state: Any, batch: Any) -> dict[str, np.ndarray]:
        """Runs the eval step and returns per-example outputs of the global batch on the host."""
        raise NotImplementedError

    def host_state(self, state: Any) -> steps.TrainState:
        """One host copy (numpy) of the state, e.g. for checkpoints."""
        raise NotImplementedError

    def host_metrics(self, metrics: Any) -> dict[str, float]:
        raise NotImplementedError


class PmapStrategy(Strategy):
    name = "pmap"
    axis = "batch"

    def __init__(self, devices: list[jax.Device], task: str) -> None:
        super().__init__(devices, task)
        self._mesh = Mesh(np.array(devices), (self.axis,))
        self._sharded = NamedSharding(self._mesh, P(self.axis))
        self._train = jax.pmap(
            self._counted(partial(steps.train_step, task=task, axis_name=self.axis)),
            axis_name=self.axis,
            in_axes=(0, 0, None),
            donate_argnums=(0,),
            devices=devices,
        )
        self._eval = jax.pmap(
            partial(steps.eval_step, task=task), axis_name=self.axis, devices=devices
        )

    def put_state(self, state: steps.TrainState) -> steps.TrainState:
        def rep(x: Any) -> jax.Array:
            x = np.asarray(x)
            return jax.device_put(np.broadcast_to(x, (self.n, *x.shape)), self._sharded)

        return jax.tree_util.tree_map(rep, state)

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        def shard(x: np.ndarray) -> jax.Array:
            if x.shape[0] % self.n:
                raise ValueError(f"batch of {x.shape[0]} does not split over {self.n} devices")
            return jax.device_put(x.reshape(self.n, -1, *x.shape[1:]), self._sharded)

        return {k: shard(v) for k, v in batch.items()}

    def train_step(self, state: Any, batch: Any, rng: jax.Array) -> tuple[Any, Any]:
        return self._train(state, batch, rng)

    def eval_step(self, state: Any, batch: Any) -> dict[str, np.ndarray]:
        out = jax.device_get(self._eval(state, batch))
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in out.items()}

    def host_state(self, state: Any) -> steps.TrainState:
        return jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_shards[0].data)[0], state)

    def host_metrics(self, metrics: Any) -> dict[str, float]:
        return {k: float(np.asarray(v)[0]) for k, v in jax.device_get(metrics).items()}


class JitStrategy(Strategy):
    name = "jit"

    def __init__(self, devices: list[jax.Device], task: str) -> None:
        super().__init__(devices, task)
        # Explicit Auto axes: classic pjit semantics (shardings on jit, compiler propagates).
        self.mesh = Mesh(np.array(devices).reshape(self.n, 1), ("data", "fsdp"))
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        self.replicated = NamedSharding(self.mesh, P())
        self._train: Any = None
        self._eval: Any = None

    def _state_sharding(self, state: Any) -> Any:
        return jax.tree_util.tree_map(lambda _: self.replicated, state)

    def put_state(self, state: steps.TrainState) -> steps.TrainState:
        shardings = self._state_sharding(state)
        self._train = jax.jit(
            self._counted(partial(steps.train_step, task=self.task)),
            in_shardings=(shardings, self.batch_sharding, self.replicated),
            out_shardings=(shardings, self.replicated),
            donate_argnums=(0,),
        )
        self._eval = jax.jit(
            partial(steps.eval_step, task=self.task),
            in_shardings=(shardings, self.batch_sharding),
            out_shardings=self.batch_sharding,
        )
        return jax.device_put(state, shardings)

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        return jax.device_put(batch, self.batch_sharding)

    def train_step(self, state: Any, batch: Any, rng: jax.Array) -> tuple[Any, Any]:
        return self._train(state, batch, rng)

    def eval_step(self, state: Any, batch: Any) -> dict[str, np.ndarray]:
        return jax.device_get(self._eval(state, batch))

    def host_state(self, state: Any) -> steps.TrainState:
        return jax.device_get(state)

    def host_metrics(self, metrics: Any) -> dict[str, float]:
        return {k: float(v) for k, v in jax.device_get(metrics).items()}


STRATEGIES = {"pmap": PmapStrategy, "jit": JitStrategy}


def make_strategy(name: str, devices: list[jax.Device], task: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(
            f"--parallel {name!r} is not a jaxtpu strategy; choose one of {', '.join(STRATEGIES)}"
        )
    return STRATEGIES[name](devices, task)
