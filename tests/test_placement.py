"""Placement as pure functions (`jaxtpu.engine.placement`, `jaxtpu.core.flags.layout`): which
mesh a run's flags ask for and where every array goes on it, checked on shapes alone: no device is
touched and nothing is compiled."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState
from jax.sharding import PartitionSpec as P

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags import layout
from jaxtpu.engine import placement

MESH_8 = {"data": 8, "fsdp": 1}
FSDP_8 = {"data": 1, "fsdp": 8}
MESH_2x4 = {"data": 2, "fsdp": 4}


@pytest.mark.parametrize(
    "shape, axis, sizes, expected",
    [
        ((1024, 384), "fsdp", FSDP_8, P("fsdp")),  # the largest dimension that 8 divides
        ((384, 1536), "fsdp", FSDP_8, P(None, "fsdp")),
        ((384, 384), "fsdp", FSDP_8, P("fsdp")),  # equals: the first
        ((30522, 384), "fsdp", FSDP_8, P(None, "fsdp")),  # 30522 is not a multiple of 8
        ((384,), "fsdp", FSDP_8, P()),  # under MIN_SPLIT elements: replicated
        ((4097, 3), "fsdp", FSDP_8, P()),  # nothing divides
        ((30522, 384), None, FSDP_8, P()),  # no axis: replicated
        ((30522, 384), "fsdp", MESH_8, P()),  # an axis of size 1: replicated
        ((64, 128), ("data", "fsdp"), MESH_2x4, P(None, ("data", "fsdp"))),  # over all 8
    ],
)
def test_the_fsdp_rule_splits_the_largest_dimension_that_divides(shape, axis, sizes, expected):
    assert placement.split_partition(shape, axis, sizes) == expected


def _state(sizes: dict[str, tuple[int, ...]]) -> TrainState:
    params = {k: np.zeros(v, np.float32) for k, v in sizes.items()}
    return TrainState.create(apply_fn=None, params=params, tx=optax.adamw(1e-3))


def test_state_specs_place_params_and_moments_as_each_sharding_says():
    state = _state({"embedding": (1024, 64), "bias": (64,)})
    moments = lambda specs: specs.opt_state[0].mu  # noqa: E731 - adamw's first moment

    replicated = placement.state_partitions(state, "replicated", MESH_8)
    assert replicated.params == {"embedding": P(), "bias": P()}
    assert moments(replicated) == {"embedding": P(), "bias": P()}

    zero1 = placement.state_partitions(state, "zero1", MESH_8)
    assert zero1.params == {"embedding": P(), "bias": P()}  # params replicated
    assert moments(zero1) == {"embedding": P("data"), "bias": P()}  # moments over every device

    fsdp = placement.state_partitions(state, "fsdp", MESH_2x4)
    assert fsdp.params == {"embedding": P("fsdp"), "bias": P()}
    assert moments(fsdp) == {"embedding": P("fsdp"), "bias": P()}
    assert fsdp.step == P()  # the step count is replicated

    zero1_2x4 = placement.state_partitions(state, "zero1", MESH_2x4)
    assert moments(zero1_2x4)["embedding"] == P(("data", "fsdp"))

    with pytest.raises(ValueError, match="unknown sharding 'auto'"):
        placement.state_partitions(state, "auto", MESH_8)  # resolved before it reaches placement


def test_batches_are_split_by_rows_over_every_device():
    assert placement.batch_partition(MESH_8) == P("data")
    assert placement.batch_partition(MESH_2x4) == P(("data", "fsdp"))
    assert placement.batch_partition(MESH_2x4, lead=1) == P(
        None, ("data", "fsdp")
    )  # (K, rows, ...)
    assert placement.logical_rules("zero1", MESH_8) == ()
    assert dict(placement.logical_rules("fsdp", {"data": 8, "fsdp": 1}))["batch"] == "data"
    assert dict(placement.logical_rules("fsdp", FSDP_8))["batch"] == ("data", "fsdp")
    assert dict(placement.logical_rules("fsdp", MESH_2x4))["batch"] == ("data", "fsdp")


@pytest.mark.parametrize(
    "parallel, flag, mesh, devices, expected",
    [
        ("jit", "auto", "", 8, ("zero1", (8, 1))),
        ("pmap", "auto", "", 8, ("replicated", (8, 1))),
        ("shard_map", "auto", "", 8, ("zero1", (8, 1))),
        ("jit", "fsdp", "", 8, ("fsdp", (1, 8))),
        ("jit", "fsdp", "fsdp=4,data=2", 8, ("fsdp", (2, 4))),
        ("jit", "zero1", "data=4,fsdp=2", 8, ("zero1", (4, 2))),
        ("spmd", "auto", "", 4, ("zero1", (4, 1))),  # the torch side: all on data
    ],
)
@pytest.mark.parametrize("platform", ["cpu", ""])
def test_the_flags_resolve_to_a_sharding_and_a_mesh(
    parallel, flag, mesh, devices, expected, platform
):
    resolved = layout.resolve_sharding(parallel, flag, platform, mesh)
    assert (resolved, layout.mesh_sizes(parallel, flag, mesh, devices, platform)) == expected


@pytest.mark.parametrize(
    "parallel, flag, mesh, expected",
    [
        ("jit", "auto", "", ("fsdp", (1, 8))),  # the TPU cost model's choice
        ("jit", "auto", "data=4,fsdp=2", ("zero1", (4, 2))),  # a mesh given: as elsewhere
        ("jit", "zero1", "", ("zero1", (8, 1))),  # the flag overrides
        ("shard_map", "auto", "", ("zero1", (8, 1))),  # no FSDP under shard_map
        ("pmap", "auto", "", ("replicated", (8, 1))),
    ],
)
def test_on_a_tpu_auto_picks_fsdp_under_jit(parallel, flag, mesh, expected):
    got = layout.resolve_sharding(parallel, flag, "tpu", mesh)
    assert (got, layout.mesh_sizes(parallel, flag, mesh, 8, "tpu")) == expected


def test_matmul_output_auto_is_bf16_on_a_tpu_only():
    assert [layout.resolve_matmul_output("auto", p) for p in ("tpu", "cpu", "gpu", "")] == [
        "bf16",
        "fp32",
        "fp32",
        "fp32",
    ]
    assert layout.resolve_matmul_output("fp32", "tpu") == "fp32"
    assert layout.resolve_matmul_output("bf16", "cpu") == "bf16"


@pytest.mark.parametrize(
    "parallel, flag, mesh, message",
    [
        ("pmap", "fsdp", "", "--sharding fsdp needs --parallel jit"),
        ("pmap", "auto", "data=8", "--mesh data=8 needs --parallel jit"),
        ("shard_map", "fsdp", "", "shard_map's per-device step sees the whole state"),
        ("shard_map", "zero1", "data=4,fsdp=2", "shard_map runs on the data axis only"),
        ("jit", "auto", "data=3,fsdp=3", "data x fsdp = 9, but the run has 8 devices"),
        ("jit", "auto", "data=8,data=1", "each at most once"),
        ("jit", "auto", "model=8", "expected data=D,fsdp=F"),
    ],
)
def test_a_layout_the_strategy_cannot_run_is_refused(parallel, flag, mesh, message):
    with pytest.raises(ConfigError, match=message):
        layout.mesh_sizes(parallel, flag, mesh, 8)


def test_a_mesh_must_cover_the_devices():
    with pytest.raises(ValueError, match="does not cover 8 devices"):
        placement.make_mesh(list(range(8)), 2, 2)
