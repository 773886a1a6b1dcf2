"""The model a run trains, built: `create_module` (an encoder config, precision, head and
layer options -> the Flax `Classifier`), `for_run` (the same from a run's flags), and its
params initialised, abstract (shapes only) or as zeros. The layers are in `jaxtpu.models.bert`
(the layer kind of every supported family), `layers` (what every layer kind shares) and
`head` (pooling and the classifier)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.models import layers
from jaxtpu.models.head import Classifier

# --precision -> the compute dtype (params stay fp32)
COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def create_module(spec: ModelSpec) -> Classifier:
    """The Flax model of `spec` (`jaxtpu.core.hf.modelspec.ModelSpec`), with fp32 storage and
    the compute dtype of its precision (every task shares it; `Task.example_shape` says what
    its inputs look like); its `remat` a key of `REMAT` or 'none', `scan` the layers as one
    `nn.scan` (params as `stack_layers` makes them), `lora` its adapters on the dense layers
    (`jaxtpu.models.layers.LoraDense`)."""
    return Classifier(
        layers.LayerConfig.of(spec.encoder, spec.lora),
        head_dropout=spec.head_dropout,
        dtype=COMPUTE_DTYPES[spec.precision],
        param_dtype=jnp.float32,
        matmul_out=jnp.bfloat16 if spec.matmul_output == "bf16" else jnp.float32,
        remat=spec.remat,
        scan=spec.scan,
        pooling=spec.pooling or spec.encoder.default_pooling,
        outputs=spec.outputs,
        head=spec.head,
        segment_sep=spec.segment_sep,
    )


def for_run(cfg: Config, spec: RunSpec, scan: bool | None = None) -> Classifier:
    """The module a run trains (`RunSpec.model_spec`); `scan` defaults to --scan-layers."""
    return create_module(spec.model_spec(cfg, scan))


def stack_for_scan(enc: EncoderConfig, params: dict) -> dict:
    """The unscanned model's params in the layout of the scanned one (`--scan-layers`,
    `scan_layout`): every layer stacked (BERT's layer kind), ModernBERT's layer 0 kept and the
    rest stacked in groups of its layer-kind period, EuroBERT's layers in groups of one."""
    return layers.stack_layers(params, *enc.family.kind.scan_layout(enc.layer_types))


def init_params(module: nn.Module, example_shape: tuple[int, ...], seed: int) -> dict:
    """Freshly initialised fp32 params of `module` for inputs of one example's shape, on the
    host (numpy)."""
    dummy = jnp.zeros((1, *example_shape), jnp.int32)
    init = jax.jit(lambda key: module.init(key, dummy, dummy)["params"])
    return jax.device_get(init(jax.random.key(seed)))


def abstract_params(module: nn.Module, example_shape: tuple[int, ...]) -> dict:
    """The param tree of `module` as `jax.ShapeDtypeStruct`s: no init is computed."""
    dummy = jnp.zeros((1, *example_shape), jnp.int32)
    return jax.eval_shape(lambda: module.init(jax.random.key(0), dummy, dummy)["params"])


def param_shapes(module: nn.Module, example_shape: tuple[int, ...]) -> dict:
    """The param tree of `module` as zeros, without computing an init (a restore template)."""
    shapes = abstract_params(module, example_shape)
    return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
