"""Where things live on the device mesh, as pure functions of shapes, the `--sharding` choice
and the mesh's axis sizes: the mesh itself, the partition of every state leaf (the FSDP and
ZeRO-1 rule), and the partition of the batch.

Nothing here touches a device or runs a program; the strategies (`jaxtpu.engine.parallel`) turn
these partitions into `NamedSharding`s on their mesh. Tested directly (`tests/test_placement.py`),
as big_vision's `sharding.py` is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp")  # the mesh of the jit path: batch rows over both, params over fsdp
# Arrays smaller than this stay replicated: splitting a bias saves nothing and costs a
# collective.
MIN_SPLIT = 4096
# Which mesh axes the params and the AdamW moments are split over, per `--sharding`
# ("rows" = every axis the batch rows are split over: ZeRO-1 splits moments over all devices).
PLACEMENT = {
    "replicated": {"params": None, "moments": None},
    "zero1": {"params": None, "moments": "rows"},
    "fsdp": {"params": "fsdp", "moments": "fsdp"},
}


def make_mesh(devices: Sequence[Any], data: int, fsdp: int) -> Mesh:
    """The ('data', 'fsdp') mesh over `devices`, in their order. Axes are Auto (classic pjit:
    shardings given to `jax.jit`, the compiler propagates them), not JAX 0.10's default
    Explicit axes of `jax.make_mesh`."""
    if data * fsdp != len(devices):
        raise ValueError(f"mesh data={data},fsdp={fsdp} does not cover {len(devices)} devices")
    return Mesh(np.array(devices).reshape(data, fsdp), AXES)


def row_axes(sizes: Mapping[str, int]) -> str | tuple[str, ...]:
    """The mesh axes a batch's rows are split over: every device, so `data` alone unless the
    mesh has an fsdp axis too."""
    return ("data", "fsdp") if sizes.get("fsdp", 1) > 1 else "data"


def batch_partition(sizes: Mapping[str, int], lead: int = 0) -> P:
    """The partition of a batch array whose rows are dimension `lead` (0 for one batch, 1 for
    the K stacked batches of a train call)."""
    return P(*[None] * lead, row_axes(sizes))


def split_partition(shape: Sequence[int], axis: Any, sizes: Mapping[str, int]) -> P:
    """The FSDP / ZeRO-1 rule: an array split over mesh `axis` (a name, a tuple of names, or
    None) on its largest dimension that the axis size divides (the first of equals);
    replicated (P()) when `axis` is None or of size 1, the array is under `MIN_SPLIT`
    elements, or no dimension divides."""
    axes = () if axis is None else axis if isinstance(axis, tuple) else (axis,)
    size = math.prod(sizes[a] for a in axes)
    if size == 1 or math.prod(shape) < MIN_SPLIT:
        return P()
    fits = [d for d in range(len(shape)) if shape[d] % size == 0]
    if not fits:
        return P()
    dim = max(fits, key=lambda d: (shape[d], -d))
    return P(*[None] * dim, axis)


def state_partitions(state: Any, sharding: str, sizes: Mapping[str, int]) -> Any:
    """The partition of every leaf of a train state (arrays or shapes): params and AdamW
    moments as `PLACEMENT[sharding]` says, everything else (the step count) replicated."""
    if sharding not in PLACEMENT:
        raise ValueError(f"unknown sharding {sharding!r}; one of {', '.join(PLACEMENT)}")
    axis = {k: row_axes(sizes) if v == "rows" else v for k, v in PLACEMENT[sharding].items()}

    def split(tree: Any, ax: Any) -> Any:
        return jax.tree_util.tree_map(lambda x: split_partition(_shape(x), ax, sizes), tree)

    rest = jax.tree_util.tree_map(lambda _: P(), state)
    return rest.replace(
        params=split(state.params, axis["params"]),
        opt_state=split(state.opt_state, axis["moments"]),
    )


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(getattr(x, "shape", np.shape(x)))


def logical_rules(sharding: str, sizes: Mapping[str, int]) -> tuple[tuple[str, Any], ...]:
    """Flax logical-axis rules for the model's residual stream
    (`jaxtpu.models.layers.RESIDUAL`): with FSDP the stream is kept split by batch rows over
    every device; left to itself, the compiler may follow the weights' split and shard
    activations by hidden unit instead, with far more temporary memory (`jaxtpu.preflight`
    shows it). Empty: no constraint."""
    if sharding != "fsdp":
        return ()
    return (("batch", row_axes(sizes)), ("length", None), ("embed", None))


@dataclass(frozen=True)
class Placement:
    """A run's placement: `--sharding` (resolved: replicated, zero1 or fsdp) on a data x fsdp
    mesh of every device (`jaxtpu.core.flags.runspec.RunSpec` resolves it from the flags)."""

    sharding: str
    data: int
    fsdp: int = 1

    @property
    def sizes(self) -> dict[str, int]:
        return {"data": self.data, "fsdp": self.fsdp}

    @property
    def devices(self) -> int:
        return self.data * self.fsdp
