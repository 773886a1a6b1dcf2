"""The strategies: each places the state and the batches on the devices and runs the compiled
pure steps there. Where things go is decided by `jaxtpu.engine.placement` (pure functions); which
devices and processes take part by `jaxtpu.engine.hosts`; the shared loop reaches a strategy through
`jaxtpu.engine.backend.JaxBackend`.

All strategies wrap the same pure `jaxtpu.engine.steps.train_steps` / `eval_step`:
- `PmapStrategy`: replicated state, per-device batch shards on a leading device axis,
  `lax.pmean` of gradients inside the step, donated state buffers.
- `JitStrategy` (pjit): `jax.jit` with `NamedSharding` over a `Mesh(('data', 'fsdp'))`; the
  batch is split over both axes. `--sharding` says where the fp32 state lives: `replicated`;
  `zero1` (params replicated, AdamW moments split over every device: each updates its slice,
  then the new params are gathered); `fsdp` (params, gradients and moments split over the
  `fsdp` axis; the compiler gathers each weight where a layer needs it and reduce-scatters its
  gradient). The compiler inserts the collectives; the model code does not change.
- `ShardMapStrategy`: pmap's per-device step (`lax.pmean` inside) under `jax.shard_map` over
  the jit mesh's `data` axis, inside `jax.jit`, with the jit path's placement.
A training call always runs K >= 1 stacked batches through `steps.train_steps` (a `lax.scan`,
or a plain step when K = 1); evaluation runs one batch. Every strategy is built the same way,
`STRATEGIES[name](devices, steps.for_task(...), placement, saved)`, and `place(state)` puts a
host state on its devices and builds the compiled steps for that placement: the one `jax.jit`
(or `jax.pmap`) of a run, with its shardings and donation, is in `JitStrategy.place` (and
`PmapStrategy.place`).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtpu.engine import placement as placing
from jaxtpu.engine import steps
from jaxtpu.engine.hosts import Processes
from jaxtpu.engine.placement import Placement

log = logging.getLogger("jaxtpu")

AXIS = "data"  # the device axis of the per-device steps (pmap, shard_map) and of the mesh


class Strategy:
    """Places the state and the batches on the devices and runs the compiled steps.

    The compiled functions are built in `place`, the one moment the state's placement is
    known; subclasses say how, and whether they can build their programs ahead of time
    (`precompile`).

    Args:
      devices: every device of the run (all processes').
      fns: the task's pure steps (`steps.for_task`).
      placement: where the state and the batches go (`placement.Placement`).
      saved: the programs of --programs DIR (`programs.SavedPrograms`), loaded instead of
        compiled where they are the same program.
    """

    def __init__(
        self,
        devices: list[jax.Device],
        fns: steps.Steps,
        placement: Placement,
        saved: Any = None,
    ) -> None:
        if placement.devices != len(devices):
            raise ValueError(f"placement {placement} does not cover {len(devices)} devices")
        self.devices = devices
        self.n = len(devices)  # global: all processes' devices
        self.placement = placement
        self.procs = Processes()
        self.local_devices = [d for d in devices if d.process_index == self.procs.index]
        self.fns = fns
        self.traces = 0  # how often the train step was traced; 1 per call length
        self.loaded = 0  # train programs loaded from --programs instead of compiled
        self.saved = saved
        self._train: Any = None
        self._eval: Any = None
        self._compiled: dict[Any, Any] = {}  # ahead-of-time programs, see `precompile`
        self._lowered: dict[Any, Any] = {}  # what each of them was compiled from

    def _counted(self, fn: Any) -> Any:
        def train_steps(*args: Any) -> Any:
            self.traces += 1  # runs at trace time only
            return fn(*args)

        return train_steps

    def place(self, state: steps.TrainState) -> steps.TrainState:
        """Places a host state on the devices and builds the compiled steps for that
        placement (compiled on first use, or ahead of time by `precompile`)."""
        raise NotImplementedError

    def programs(self) -> dict[Any, tuple[Any, Any]]:
        """Each ahead-of-time program, (kind, input shapes) -> (lowered, compiled)."""
        return {key: (self._lowered[key], c) for key, c in self._compiled.items()}

    def compiled_train_programs(self) -> int:
        """Train programs XLA compiled (traced and not loaded from --programs)."""
        return self.traces - self.loaded

    def put_steps(self, batches: dict[str, np.ndarray]) -> Any:
        """K stacked global batches (leading axis K; this process's rows) for one train call."""
        raise NotImplementedError

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        """One global batch (this process's rows), for evaluation."""
        raise NotImplementedError

    def train(self, state: Any, batches: Any, rng: jax.Array) -> tuple[Any, Any]:
        """K steps in one device call (`steps.train_steps`); metrics with a leading K axis."""
        return self._compiled.get(("train", _shape_key(batches)), self._train)(state, batches, rng)

    def precompile(
        self,
        state: Any,
        rng: jax.Array,
        calls: list[dict[str, np.ndarray]],
        evals: list[dict[str, np.ndarray]],
    ) -> int:
        """Compiles the train call for each of `calls` (stacked host batches, this process's
        rows, as `put_steps` takes them) and the eval step for each of `evals` (as
        `put_batch` takes them) before the run needs them; `train` and `eval` then run those
        programs; with `saved` (--programs DIR) a saved program replaces the compilation of
        the same program. Returns how many programs were compiled."""
        raise NotImplementedError

    def eval(self, state: Any, batch: Any) -> dict[str, np.ndarray]:
        """Per-example outputs of the global batch, on the host of every process."""
        raise NotImplementedError

    def host_state(self, state: Any) -> steps.TrainState:
        """One host copy (numpy) of the state, e.g. for checkpoints."""
        raise NotImplementedError

    def host_metrics(self, metrics: Any) -> list[dict[str, float]]:
        """Per-step host metrics of one train call: one device sync."""
        raise NotImplementedError


class PmapStrategy(Strategy):
    """`jax.pmap` over this process's devices: the state replicated on each."""

    def __init__(
        self, devices: list[jax.Device], fns: steps.Steps, placement: Placement, saved: Any = None
    ) -> None:
        if placement.sharding != "replicated" or placement.fsdp != 1:
            raise ValueError(f"pmap replicates the whole state; got {placement}")
        super().__init__(devices, fns, placement, saved)
        # pmap places the leading axis of each process's arrays on that process's devices
        self._mesh = Mesh(np.array(self.local_devices), (AXIS,))
        self._sharded = NamedSharding(self._mesh, P(AXIS))
        self.n_local = len(self.local_devices)

    def place(self, state: steps.TrainState) -> steps.TrainState:
        """The state replicated on every device; the steps pmapped (compiled on first call)."""
        self._train = jax.pmap(
            self._counted(lambda *a: self.fns.train(*a, axis_name=AXIS)),
            axis_name=AXIS,
            in_axes=(0, 0, None),
            donate_argnums=(0,),
            devices=self.devices,
        )
        self._eval = jax.pmap(self.fns.eval, axis_name=AXIS, devices=self.devices)

        def rep(x: Any) -> jax.Array:
            x = np.asarray(x)
            return jax.device_put(np.broadcast_to(x, (self.n_local, *x.shape)), self._sharded)

        return jax.tree_util.tree_map(rep, state)

    def precompile(self, state: Any, rng: jax.Array, calls: Any, evals: Any) -> int:
        """pmap compiles each program on its first call: nothing is built ahead."""
        return 0

    def put_steps(self, batches: dict[str, np.ndarray]) -> Any:
        """(K, rows, ...) -> (devices, K, rows / devices, ...): each device scans its slices."""
        return {k: self._shard(v, 1) for k, v in batches.items()}

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        return {k: self._shard(v, 0) for k, v in batch.items()}

    def _shard(self, x: np.ndarray, axis: int) -> jax.Array:
        """Splits the rows on `axis` over this process's devices, device axis first."""
        rows = x.shape[axis]
        if rows % self.n_local:
            raise ValueError(f"batch of {rows} does not split over {self.n_local} devices")
        x = x.reshape(*x.shape[:axis], self.n_local, rows // self.n_local, *x.shape[axis + 1 :])
        return jax.device_put(np.ascontiguousarray(np.moveaxis(x, axis, 0)), self._sharded)

    def eval(self, state: Any, batch: Any) -> dict[str, np.ndarray]:
        out = self._eval(state, batch)
        return {k: self.procs.gather(_local_rows(v)) for k, v in out.items()}

    def host_state(self, state: Any) -> steps.TrainState:
        return jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_shards[0].data)[0], state)

    def host_metrics(self, metrics: Any) -> list[dict[str, float]]:
        # pmean-ed: every device holds the global value; (devices, K) -> device 0's K values
        first = {k: np.asarray(v.addressable_shards[0].data)[0] for k, v in metrics.items()}
        return [{k: float(v[i]) for k, v in first.items()} for i in range(len(first["loss"]))]


def _shape_key(batches: dict[str, Any]) -> tuple:
    """What tells one compiled train call from another: the inputs' names, shapes, dtypes."""
    return tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(batches.items()))


def _local_rows(x: jax.Array) -> np.ndarray:
    """This process's part of a pmap output (device axis first), as one batch of rows."""
    shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
    local = np.concatenate([np.asarray(s.data) for s in shards])
    return local.reshape(-1, *local.shape[2:])


class JitStrategy(Strategy):
    """pjit: one global step; shardings on `jax.jit`, the compiler inserts the collectives.

    A per-device strategy on the same mesh (e.g. `shard_map` over `data`) only needs another
    `_step_fns`: the placement of state and batches stays as it is here.
    """

    def __init__(
        self, devices: list[jax.Device], fns: steps.Steps, placement: Placement, saved: Any = None
    ) -> None:
        super().__init__(devices, fns, placement, saved)
        self.mesh = placing.make_mesh(devices, placement.data, placement.fsdp)
        sizes = placement.sizes
        self.batch_sharding = self._named(placing.batch_partition(sizes))
        self.steps_sharding = self._named(placing.batch_partition(sizes, lead=1))  # (K, rows, ...)
        self.replicated = self._named(P())

    def _named(self, spec: P) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def state_sharding(self, state: Any) -> Any:
        """The sharding of every leaf of `state` (arrays or `jax.ShapeDtypeStruct`s)."""
        partitions = placing.state_partitions(state, self.placement.sharding, self.placement.sizes)
        return jax.tree_util.tree_map(self._named, partitions, is_leaf=lambda x: isinstance(x, P))

    def _step_fns(self) -> tuple[Any, Any]:
        """The pure (train, eval) steps that jit compiles: global-batch functions."""
        return self.fns.train, self.fns.eval

    def place(self, state: steps.TrainState) -> steps.TrainState:
        """The state placed as `state_sharding` says; the steps jitted for that placement."""
        shardings = self.state_sharding(state)
        self._train, self._eval = self.jitted(shardings)
        self._compiled, self._lowered = {}, {}
        return jax.device_put(state, shardings)

    def build(self, state: Any) -> None:
        """The steps for a state placed as `state_sharding(state)` says, without placing it
        (`state` may be abstract): what `jaxtpu.preflight` compiles and saves for a target."""
        self._train, self._eval = self.jitted(self.state_sharding(state))
        self._compiled, self._lowered = {}, {}

    def jitted(self, shardings: Any) -> tuple[Any, Any]:
        """The jitted (train, eval) functions for a state placed with `shardings`: its
        shardings in, the batch split over the mesh, the state donated (also what
        `jaxtpu.preflight` lowers and compiles for another target)."""
        train_fn, eval_fn = map(self._traced_on_mesh, self._step_fns())
        train = jax.jit(
            self._counted(train_fn),
            in_shardings=(shardings, self.steps_sharding, self.replicated),
            out_shardings=(shardings, self.replicated),
            donate_argnums=(0,),
        )
        evaluate = jax.jit(
            eval_fn,
            in_shardings=(shardings, self.batch_sharding),
            out_shardings=self.batch_sharding,
        )
        return train, evaluate

    def _traced_on_mesh(self, fn: Any) -> Any:
        """`fn` traced under the placement's logical-axis rules (`placement.logical_rules`:
        with FSDP, the residual stream split by batch rows)."""
        rules = placing.logical_rules(self.placement.sharding, self.placement.sizes)
        if not rules:
            return fn

        def traced(*args: Any) -> Any:
            with (
                jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh),
                nn.logical_axis_rules(rules),
            ):
                return fn(*args)

        return traced

    def precompile(
        self,
        state: Any,
        rng: jax.Array,
        calls: list[dict[str, np.ndarray]],
        evals: list[dict[str, np.ndarray]],
    ) -> int:
        # Lowering traces Python (one at a time, under the GIL); XLA's compilations release it
        # and run side by side. Each program starts compiling as soon as it is lowered, so the
        # next one's tracing overlaps it instead of waiting for every lowering first.
        pending: dict[Any, Any] = {}
        loaded: dict[Any, Any] = {}
        inputs = [("train", h, self.steps_sharding, 1) for h in calls]
        inputs += [("eval", h, self.batch_sharding, 0) for h in evals]
        with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="jaxtpu-compile") as pool:
            for kind, host, sharding, axis in inputs:
                batch = {k: self._abstract(v, sharding, axis) for k, v in host.items()}
                key = (kind, _shape_key(batch))
                if key in pending or key in loaded or key in self._compiled:
                    continue
                if kind == "train":
                    program = self._train.lower(state, batch, rng)
                else:
                    program = self._eval.lower(state, batch)
                self._lowered[key] = program
                found = self.saved.load(kind, key[1], program) if self.saved else None
                if found is not None:
                    loaded[key] = found
                    self.loaded += kind == "train"
                else:
                    pending[key] = pool.submit(program.compile)
            done = {key: future.result() for key, future in pending.items()}
        self._compiled = {**self._compiled, **loaded, **done}
        if loaded:
            log.info(
                "%d programs loaded from %s, %d compiled",
                len(loaded),
                self.saved.directory,
                len(done),
            )
        return len(pending)

    def _global_shape(self, v: Any, axis: int) -> tuple[int, ...]:
        """The shape of the global array whose rows on `axis` are every process's rows `v`."""
        return (*v.shape[:axis], v.shape[axis] * self.procs.count, *v.shape[axis + 1 :])

    def _abstract(self, v: np.ndarray, sharding: NamedSharding, axis: int) -> Any:
        """The global array `_put` makes of this process's rows `v`, as a shape only."""
        return jax.ShapeDtypeStruct(self._global_shape(v, axis), v.dtype, sharding=sharding)

    def put_steps(self, batches: dict[str, np.ndarray]) -> Any:
        return self._put(batches, self.steps_sharding, 1)

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        return self._put(batch, self.batch_sharding, 0)

    def _put(self, batch: dict[str, np.ndarray], sharding: NamedSharding, axis: int) -> Any:
        """This process's rows of global arrays, placed on its devices of the global mesh."""
        if self.procs.count == 1:
            return jax.device_put(batch, sharding)
        return {
            k: jax.make_array_from_process_local_data(sharding, v, self._global_shape(v, axis))
            for k, v in batch.items()
        }

    def eval(self, state: Any, batch: Any) -> dict[str, np.ndarray]:
        fn = self._compiled.get(("eval", _shape_key(batch)), self._eval)
        return {k: self.procs.whole(v) for k, v in fn(state, batch).items()}

    def host_state(self, state: Any) -> steps.TrainState:
        # split optimizer moments may span the processes
        return jax.tree_util.tree_map(self.procs.whole, state)

    def host_metrics(self, metrics: Any) -> list[dict[str, float]]:
        host = jax.device_get(metrics)
        return [{k: float(v[i]) for k, v in host.items()} for i in range(len(host["loss"]))]


class ShardMapStrategy(JitStrategy):
    """jit + `jax.shard_map`: pmap's per-device step (`lax.pmean` over the `data` axis) on the
    jit path's mesh and placement, the migration target of pmap-era code.

    The state is placed as `JitStrategy` places it (params replicated, AdamW moments split over
    `data` at rest); inside the step every device sees the whole state, as under pmap, so the
    compiler gathers the moments on entry and keeps each device's slice on exit.
    """

    def __init__(
        self, devices: list[jax.Device], fns: steps.Steps, placement: Placement, saved: Any = None
    ) -> None:
        if placement.sharding == "fsdp" or placement.fsdp != 1:
            raise ValueError(f"shard_map's per-device step sees the whole state; got {placement}")
        super().__init__(devices, fns, placement, saved)

    def _step_fns(self) -> tuple[Any, Any]:
        train = jax.shard_map(
            lambda *a: self.fns.train(*a, axis_name=AXIS),
            mesh=self.mesh,
            in_specs=(P(), P(None, AXIS), P()),  # state, (K, rows, ...), rng
            out_specs=(P(), P()),  # pmean-ed: the same on every device
            # Unchecked, as under pmap: with varying-value checks on, the gradient of the
            # replicated params would already be summed over devices before the step's pmean.
            check_vma=False,
        )
        evaluate = jax.shard_map(
            self.fns.eval,
            mesh=self.mesh,
            in_specs=(P(), P(AXIS)),
            out_specs=P(AXIS),
            check_vma=False,
        )
        return train, evaluate


STRATEGIES: dict[str, type[Strategy]] = {  # the order of `core.layout.JAX_STRATEGIES`
    "jit": JitStrategy,
    "pmap": PmapStrategy,
    "shard_map": ShardMapStrategy,
}


def make_strategy(
    name: str,
    devices: list[jax.Device],
    fns: steps.Steps,
    placement: Placement | None = None,
    saved: Any = None,
) -> Strategy:
    """The strategy `--parallel name` (names are checked with the flags, before any work) on
    `devices`, running the task's steps `fns`, with `placement` (default: replicated over a
    data axis of every device) and the programs `saved` of --programs DIR."""
    placement = placement or Placement("replicated", len(devices))
    return STRATEGIES[name](devices, fns, placement, saved)
