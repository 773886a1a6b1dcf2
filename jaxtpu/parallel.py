"""The only device-aware module: device set-up, the processes of a run, and the strategies
that run the pure steps on the devices.

Three nouns: a `Strategy` places the state and the batches on the devices and runs the
compiled steps; `Processes` is this process's place in a multi-host run (host-level
collectives); the shared loop talks to both through `jaxtpu.train.JaxBackend`.

All strategies wrap the same pure `jaxtpu.steps.train_steps` / `eval_step`:
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
or a plain step when K = 1); evaluation runs one batch.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtpu import steps
from jaxtpu.core.errors import DeviceError
from jaxtpu.core.tokens import cache_root

log = logging.getLogger(__name__)


def init_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Joins a multi-process JAX run (`jax.distributed.initialize`, what TPU pods use).

    Must run before anything touches the devices. `coordinator` is process 0's HOST:PORT, or
    'auto' for JAX's cluster detection (TPU pod, SLURM); empty means one process, no set-up.
    On CPU the processes talk through gloo collectives.
    """
    if not coordinator:
        return
    if jax.distributed.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if coordinator != "auto":
        kwargs = dict(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=120)
    except (RuntimeError, ValueError) as e:
        raise DeviceError(
            f"--coordinator-address {coordinator}: could not join the multi-process run as "
            f"process {process_id} of {num_processes} ({str(e).splitlines()[0]})"
        ) from None
    log.info(
        "multi-process: process %d of %d, %d local of %d devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def init_devices(num_devices: int) -> list[jax.Device]:
    """The first `num_devices` devices of the default backend on each process.

    On a machine without accelerators this asks JAX for `num_devices` virtual CPU devices,
    which must happen before the backend starts; on TPU/GPU the setting is ignored and the
    first `num_devices` real devices are used. With several processes the result is the
    global device list, each process's devices contiguous and in process order, so process
    p's rows of a global batch are one contiguous block.
    """
    set_cpu_device_count(num_devices)
    local = sorted(jax.local_devices(), key=lambda d: d.id)
    if num_devices > len(local):
        raise DeviceError(
            f"--num-devices {num_devices}: only {len(local)} {local[0].platform} device(s) "
            f"available{' per process' if jax.process_count() > 1 else ''}; use "
            f"--num-devices {len(local)} or fewer"
        )
    if jax.process_count() == 1:
        return local[:num_devices]
    by_process: dict[int, list[jax.Device]] = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    return [d for p in sorted(by_process) for d in by_process[p][:num_devices]]


def set_cpu_device_count(num_devices: int) -> None:
    """Asks for `num_devices` virtual CPU devices, unless the user fixed a count already."""
    user_fixed = "JAX_NUM_CPU_DEVICES" in os.environ or (
        "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    )
    if not user_fixed:  # a count the user set for this machine is respected
        try:
            jax.config.update("jax_num_cpu_devices", max(num_devices, 1))
        except RuntimeError:
            pass  # backend already started (e.g. a second run in one process): use what it has


def use_compilation_cache() -> str | None:
    """Turns on JAX's persistent compilation cache in <cache root>/xla, so that a run whose
    programs an earlier run compiled (same model, shapes, flags, devices and jax version: the
    cache key) loads them instead of compiling again. A directory the user chose
    (JAX_COMPILATION_CACHE_DIR) is kept; JAXTPU_COMPILE_CACHE=0 turns it off. Returns the
    directory in use, or None."""
    if not jax.config.jax_compilation_cache_dir and os.environ.get("JAXTPU_COMPILE_CACHE") != "0":
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
    return jax.config.jax_compilation_cache_dir or None


class Processes:
    """This process's place in a (possibly multi-process) run, and the few host-level
    collectives the loop needs. With one process every method is the identity."""

    def __init__(self) -> None:
        self.count = jax.process_count()
        self.index = jax.process_index()
        self.primary = self.index == 0

    def rows(self, n: int) -> slice:
        """This process's contiguous block of a global batch of `n` rows."""
        if n % self.count:
            raise ValueError(f"global batch {n} does not split over {self.count} processes")
        per = n // self.count
        return slice(self.index * per, (self.index + 1) * per)

    def whole(self, x: jax.Array) -> np.ndarray:
        """The whole value of a (possibly sharded) global array, on the host of every
        process."""
        if self.count == 1 or x.is_fully_replicated:
            return np.asarray(jax.device_get(x))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    def gather(self, local: np.ndarray) -> np.ndarray:
        """Concatenates every process's block along axis 0, in process order."""
        if self.count == 1:
            return local
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(local, tiled=True))

    def any(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (e.g. one got SIGTERM)."""
        if self.count == 1:
            return flag
        return bool(np.any(self.gather(np.array([flag]))))

    def broadcast(self, tree: Any) -> Any:
        """Process 0's value of a tree of arrays, on every process (same shapes everywhere)."""
        if self.count == 1:
            return tree
        from jax.experimental import multihost_utils

        out = multihost_utils.broadcast_one_to_all(tree, is_source=self.primary)
        return jax.tree_util.tree_map(np.asarray, out)

    def broadcast_json(self, value: Any) -> Any:
        """Process 0's JSON-serialisable value, on every process."""
        if self.count == 1:
            return value
        raw = np.frombuffer(json.dumps(value).encode(), np.uint8) if self.primary else None
        size = int(self.broadcast(np.array([0 if raw is None else raw.size], np.int64))[0])
        buf = raw if raw is not None else np.zeros(size, np.uint8)
        return json.loads(self.broadcast(buf).tobytes().decode())


class Strategy:
    """Places the state and the batches on the devices and runs the compiled steps.

    The compiled functions are built in `put_state`, the one moment the state's placement is
    known; subclasses say how to place (`_place_state`, `_put`) and how to compile (`_compile`).
    """

    def __init__(self, devices: list[jax.Device], task: str) -> None:
        self.devices = devices
        self.n = len(devices)  # global: all processes' devices
        self.procs = Processes()
        self.local_devices = [d for d in devices if d.process_index == self.procs.index]
        self.task = task
        self.traces = 0  # how often the train step was traced (compiled); 1 per call length
        self._train: Any = None
        self._eval: Any = None
        self._compiled: dict[Any, Any] = {}  # ahead-of-time programs, see `precompile`

    def _counted(self, fn: Any) -> Any:
        def traced(*args: Any) -> Any:
            self.traces += 1  # runs at trace time only
            return fn(*args)

        return traced

    def put_state(self, state: steps.TrainState) -> steps.TrainState:
        """Places a host state on the devices and compiles the steps for that placement."""
        placed, self._train, self._eval = self._compile(state)
        self._compiled = {}
        return placed

    def _compile(self, state: steps.TrainState) -> tuple[steps.TrainState, Any, Any]:
        """(placed state, train function, eval function)."""
        raise NotImplementedError

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
        evals: list[dict[str, np.ndarray]] = (),  # type: ignore[assignment]
    ) -> int:
        """Compiles the train call for each of `calls` (stacked host batches, this process's
        rows, as `put_steps` takes them) and the eval step for each of `evals` (as
        `put_batch` takes them) before the run needs them, several compilations at a time;
        `train` and `eval` then run those programs. Returns how many programs were compiled
        (0: this strategy compiles on first use only)."""
        return 0

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
    axis = "batch"

    def __init__(self, devices: list[jax.Device], task: str) -> None:
        super().__init__(devices, task)
        # pmap places the leading axis of each process's arrays on that process's devices
        self._mesh = Mesh(np.array(self.local_devices), (self.axis,))
        self._sharded = NamedSharding(self._mesh, P(self.axis))
        self.n_local = len(self.local_devices)

    def _compile(self, state: steps.TrainState) -> tuple[steps.TrainState, Any, Any]:
        train = jax.pmap(
            self._counted(partial(steps.train_steps, task=self.task, axis_name=self.axis)),
            axis_name=self.axis,
            in_axes=(0, 0, None),
            donate_argnums=(0,),
            devices=self.devices,
        )
        evaluate = jax.pmap(
            partial(steps.eval_step, task=self.task), axis_name=self.axis, devices=self.devices
        )

        def rep(x: Any) -> jax.Array:
            x = np.asarray(x)
            return jax.device_put(np.broadcast_to(x, (self.n_local, *x.shape)), self._sharded)

        return jax.tree_util.tree_map(rep, state), train, evaluate

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

    # Arrays smaller than this stay replicated: splitting a bias saves nothing and costs a
    # collective.
    MIN_SPLIT = 4096

    def __init__(
        self,
        devices: list[jax.Device],
        task: str,
        sharding: str = "zero1",
        mesh: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(devices, task)
        data, fsdp = mesh or (self.n, 1)
        if data * fsdp != self.n:
            raise DeviceError(f"mesh data={data},fsdp={fsdp} does not cover {self.n} devices")
        self.sharding = sharding
        # Explicit Auto axes: classic pjit semantics (shardings on jit, compiler propagates).
        self.mesh = Mesh(np.array(devices).reshape(data, fsdp), ("data", "fsdp"))
        rows = ("data", "fsdp") if fsdp > 1 else "data"  # the batch: over every device
        self.batch_sharding = NamedSharding(self.mesh, P(rows))
        self.steps_sharding = NamedSharding(self.mesh, P(None, rows))  # (K, rows, ...)
        self.replicated = NamedSharding(self.mesh, P())
        self._all = rows

    def state_sharding(self, state: Any) -> Any:
        """The sharding of every leaf of `state` (arrays or `jax.ShapeDtypeStruct`s)."""
        params_axis = "fsdp" if self.sharding == "fsdp" else None
        moments_axis = {"replicated": None, "zero1": self._all, "fsdp": "fsdp"}[self.sharding]
        params = jax.tree_util.tree_map(lambda x: self._split(x, params_axis), state.params)
        opt = jax.tree_util.tree_map(lambda x: self._split(x, moments_axis), state.opt_state)
        rest = jax.tree_util.tree_map(lambda _: self.replicated, state)
        return rest.replace(params=params, opt_state=opt)

    def _split(self, x: Any, axis: Any) -> NamedSharding:
        """`x` split over mesh `axis` on its largest dimension that divides evenly (the first
        of equals); replicated when `axis` is None, `x` is small, or nothing divides."""
        shape = tuple(getattr(x, "shape", np.shape(x)))
        axes = () if axis is None else axis if isinstance(axis, tuple) else (axis,)
        size = int(np.prod([self.mesh.shape[a] for a in axes]))
        if size == 1 or int(np.prod(shape, dtype=np.int64)) < self.MIN_SPLIT:
            return self.replicated
        fits = [d for d in range(len(shape)) if shape[d] % size == 0]
        if not fits:
            return self.replicated
        dim = max(fits, key=lambda d: (shape[d], -d))
        return NamedSharding(self.mesh, P(*[None] * dim, axis))

    def _step_fns(self) -> tuple[Any, Any]:
        """The pure (train_steps, eval_step) that jit compiles: global-batch functions."""
        return (
            partial(steps.train_steps, task=self.task),
            partial(steps.eval_step, task=self.task),
        )

    def _compile(self, state: steps.TrainState) -> tuple[steps.TrainState, Any, Any]:
        shardings = self.state_sharding(state)
        train, evaluate = self.jitted(shardings)
        return jax.device_put(state, shardings), train, evaluate

    def jitted(self, shardings: Any) -> tuple[Any, Any]:
        """The jitted (train, eval) functions for a state placed with `shardings` (also what
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
        """With FSDP, `fn` traced with the model's residual stream split by batch rows over
        every device (`models.RESIDUAL`): left to itself, the compiler may follow the weights'
        split and shard activations by hidden unit instead, with far more temporary memory
        (`jaxtpu.preflight` shows it)."""
        if self.sharding != "fsdp":
            return fn
        rules = (("batch", self._all), ("length", None), ("embed", None))

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
        evals: list[dict[str, np.ndarray]] = (),  # type: ignore[assignment]
    ) -> int:
        # Lowering traces Python (one at a time, under the GIL; about a quarter of a MiniLM
        # train program's build on this CPU); XLA's compilations release it and run side by
        # side. Each program starts compiling as soon as it is lowered, so the next one's
        # tracing overlaps it instead of waiting for every lowering first.
        pending: dict[Any, Any] = {}
        inputs = [("train", h, self.steps_sharding, 1) for h in calls]
        inputs += [("eval", h, self.batch_sharding, 0) for h in evals]
        with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="jaxtpu-compile") as pool:
            for kind, host, sharding, axis in inputs:
                batch = {k: self._abstract(v, sharding, axis) for k, v in host.items()}
                key = (kind, _shape_key(batch))
                if key in pending or key in self._compiled:
                    continue
                if kind == "train":
                    program = self._train.lower(state, batch, rng)
                else:
                    program = self._eval.lower(state, batch)
                pending[key] = pool.submit(program.compile)
            done = {key: future.result() for key, future in pending.items()}
        self._compiled = {**self._compiled, **done}
        return len(pending)

    def _abstract(self, v: np.ndarray, sharding: NamedSharding, axis: int) -> Any:
        """The global array `_put` makes of this process's rows `v`, as a shape only."""
        shape = (*v.shape[:axis], v.shape[axis] * self.procs.count, *v.shape[axis + 1 :])
        return jax.ShapeDtypeStruct(shape, v.dtype, sharding=sharding)

    def put_steps(self, batches: dict[str, np.ndarray]) -> Any:
        return self._put(batches, self.steps_sharding, 1)

    def put_batch(self, batch: dict[str, np.ndarray]) -> Any:
        return self._put(batch, self.batch_sharding, 0)

    def _put(self, batch: dict[str, np.ndarray], sharding: NamedSharding, axis: int) -> Any:
        """This process's rows of global arrays, placed on its devices of the global mesh."""
        if self.procs.count == 1:
            return jax.device_put(batch, sharding)

        def global_shape(v: np.ndarray) -> tuple[int, ...]:
            return (*v.shape[:axis], v.shape[axis] * self.procs.count, *v.shape[axis + 1 :])

        return {
            k: jax.make_array_from_process_local_data(sharding, v, global_shape(v))
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

    def _step_fns(self) -> tuple[Any, Any]:
        train = jax.shard_map(
            partial(steps.train_steps, task=self.task, axis_name="data"),
            mesh=self.mesh,
            in_specs=(P(), P(None, "data"), P()),  # state, (K, rows, ...), rng
            out_specs=(P(), P()),  # pmean-ed: the same on every device
            # Unchecked, as under pmap: with varying-value checks on, the gradient of the
            # replicated params would already be summed over devices before the step's pmean.
            check_vma=False,
        )
        evaluate = jax.shard_map(
            partial(steps.eval_step, task=self.task),
            mesh=self.mesh,
            in_specs=(P(), P("data")),
            out_specs=P("data"),
            check_vma=False,
        )
        return train, evaluate


STRATEGIES: dict[str, type[Strategy]] = {
    "pmap": PmapStrategy,
    "jit": JitStrategy,
    "shard_map": ShardMapStrategy,
}


def make_strategy(
    name: str,
    devices: list[jax.Device],
    task: str,
    sharding: str = "zero1",
    mesh: tuple[int, int] | None = None,
) -> Strategy:
    """The strategy `--parallel name` (names are checked with the flags, before any work);
    `sharding` and `mesh` (data, fsdp) apply to the jit-placed strategies."""
    if name == "pmap":
        return PmapStrategy(devices, task)
    return STRATEGIES[name](devices, task, sharding, mesh)  # type: ignore[call-arg]


def strategy_for(cfg: Any, devices: list[jax.Device]) -> Strategy:
    """The strategy a run's flags ask for (--parallel, --sharding, --mesh) on `devices`."""
    from jaxtpu.core.config import mesh_shape, param_sharding

    sharding = param_sharding(cfg)
    return make_strategy(
        cfg.run.parallel, devices, cfg.run.task, sharding, mesh_shape(cfg, len(devices))
    )
