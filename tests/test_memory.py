"""Memory options of the jit path: --sharding replicated/zero1/fsdp over a --mesh, --remat and
--scan-layers compute the same training run as the replicated model, and bad combinations are
refused before anything is created."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxtpu import train
from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags import presets
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import jax_only_options
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.models import encoder as models
from jaxtpu.models import layers


def _losses(workdir) -> list[float]:
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x.get("event") == "train"]


def _run(tmp_path, name: str, **overrides) -> list[float]:
    """21 fp32 steps of the tiny model on 8 devices, jit, dropout off."""
    cfg = presets.tiny().replace(
        workdir=str(tmp_path / name),
        log_every=1,
        precision="fp32",
        dropout=0.0,
        encoder_dropout=0.0,
        epochs=3,
        parallel="jit",
        **overrides,
    )
    train.train_and_evaluate(cfg)
    return _losses(tmp_path / name)


# Each variant is one more placement/recompute of the same computation.
VARIANTS = {
    "toxicity": {
        "zero1": dict(sharding="zero1"),
        "fsdp over 8": dict(sharding="fsdp"),
        "fsdp data=2,fsdp=4 + remat layer": dict(
            sharding="fsdp", mesh="data=2,fsdp=4", remat="layer"
        ),
        "scan + remat dots": dict(scan_layers=True, remat="dots"),
    },
    "ranking": {
        "fsdp + scan + remat layer": dict(sharding="fsdp", scan_layers=True, remat="layer"),
    },
}


@pytest.mark.model
@pytest.mark.parametrize("task", list(VARIANTS))
def test_memory_options_give_the_replicated_trajectory_fp32(tmp_path, task):
    ref = _run(tmp_path, "replicated", task=task, sharding="replicated")
    assert len(ref) == 21
    for name, overrides in VARIANTS[task].items():
        losses = _run(tmp_path, name.replace(" ", "_"), task=task, **overrides)
        np.testing.assert_allclose(losses, ref, rtol=1e-5, err_msg=name)


@pytest.mark.model
def test_stacking_layers_is_lossless_and_names_stay_hugging_face():
    enc = EncoderConfig(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
    )
    plain = models.init_params(models.create_module(ModelSpec(enc)), (8,), 0)
    stacked = layers.stack_layers(plain)
    scanned_shapes = models.param_shapes(models.create_module(ModelSpec(enc, scan=True)), (8,))
    # the stacked tree is exactly the scanned model's tree
    assert jax.tree_util.tree_structure(stacked) == jax.tree_util.tree_structure(scanned_shapes)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(stacked), leaves(scanned_shapes), strict=True):
        assert a.shape == b.shape
    back = layers.unstack_layers(stacked)
    assert set(back["bert"]["encoder"]) == {"layer_0", "layer_1", "layer_2"}
    for a, b in zip(leaves(back), leaves(plain), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(parallel="pmap", sharding="fsdp"), "--sharding fsdp needs --parallel jit"),
        (dict(parallel="pmap", mesh="data=4,fsdp=2"), "--mesh data=4,fsdp=2 needs --parallel jit"),
        (dict(parallel="shard_map", sharding="fsdp"), "--sharding fsdp needs --parallel jit"),
        (dict(parallel="jit", mesh="data=3,fsdp=3"), "data x fsdp = 9, but the run has 8"),
        (dict(parallel="jit", mesh="data=2,model=4"), "expected data=D,fsdp=F"),
        (dict(parallel="jit", mesh="data=0,fsdp=8"), "axis data must be >= 1"),
        (dict(parallel="shard_map", mesh="data=2,fsdp=4"), "shard_map runs on the data axis"),
    ],
)
def test_unsupported_memory_configs_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        presets.tiny().replace(**overrides)
    assert "\n" not in str(e.value)


def test_bad_mesh_on_the_command_line_creates_nothing(tmp_path, capsys):
    wd = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(
            [
                "--preset",
                "tiny",
                "--parallel",
                "jit",
                "--mesh",
                "data=3,fsdp=2",
                "--workdir",
                str(wd),
            ]
        )
    assert e.value.code == 2
    assert "data x fsdp = 6, but the run has 8" in capsys.readouterr().err
    assert not wd.exists()


def test_mesh_defaults():
    cfg = presets.tiny().replace(parallel="jit")
    mesh_shape = lambda c: RunSpec.resolve(c).mesh  # noqa: E731
    assert mesh_shape(cfg) == (8, 1)
    assert mesh_shape(cfg.replace(sharding="fsdp")) == (1, 8)
    assert mesh_shape(cfg.replace(sharding="fsdp", mesh="fsdp=4,data=2")) == (2, 4)


def test_torch_reference_refuses_jax_only_memory_flags():
    from torchxla_ref import train as torch_train

    cfg = presets.tiny().replace(parallel="spmd", remat="layer", scan_layers=True)
    assert jax_only_options(cfg) == ["--remat layer", "--scan-layers True"]
    with pytest.raises(UserError, match="jaxtpu-only options; the torch_xla reference replicates"):
        torch_train.train_and_evaluate(cfg)
