"""--layer-lr-decay and --head-lr: the one rule (`layer_lr_scale`) against its written
definition for every family's parameter names, the Flax optimizer against AdamW run at each
leaf's own rate, and the torch side's parameter groups against the Flax side's multipliers.
Both sides training to the same losses with them is parity_tests' family trajectories."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.schema import Config, OptimConfig
from jaxtpu.core.hf.kinds import LAYER_KINDS
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.core.schedules import describe_layer_rates, layer_lr_scale

F, N, HEAD = 0.8, 4, 10.0

# (parameter name as torch's named_parameters gives it, its layer kind, its depth d:
# multiplier F^d or the head)
NAMES = [
    ("bert.embeddings.word_embeddings.weight", "bert", N),  # BERT, RoBERTa, XLM-R, DeBERTa
    ("bert.embeddings.LayerNorm.weight", "bert", N),
    ("bert.embeddings_project.weight", "bert", N),  # ELECTRA's embedding-size projection
    ("bert.embeddings.tok_embeddings.weight", "modernbert", N),
    ("bert.embeddings.norm.weight", "modernbert", N),
    ("bert.embed_tokens.weight", "eurobert", N),
    ("bert.encoder.layer.0.attention.self.query.weight", "bert", N - 1),
    ("bert.encoder.layer.3.output.dense.bias", "bert", 0),
    ("bert.transformer.layer.1.ffn.lin1.weight", "bert", N - 2),  # DistilBERT
    ("bert.layers.2.attn.Wqkv.weight", "modernbert", N - 3),
    ("bert.layers.2.self_attn.q_proj.weight", "eurobert", N - 3),
    ("bert.encoder.layer.10.output.dense.weight", "bert", N - 11),  # (a 12-layer model's)
    ("bert.encoder.rel_embeddings.weight", "bert", 0),  # DeBERTa's table, used by every layer
    ("bert.encoder.LayerNorm.weight", "bert", 0),
    ("bert.final_norm.weight", "modernbert", 0),
    ("bert.norm.weight", "eurobert", 0),
    ("bert.pooler.dense.weight", "bert", 0),
    ("classifier.weight", "bert", "head"),
    ("classifier.bias", "eurobert", "head"),
]


@pytest.mark.parametrize(("name", "kind", "depth"), NAMES)
def test_each_parameter_gets_the_rate_of_its_depth(name, kind, depth):
    embedding = LAYER_KINDS[kind].embedding_modules
    expected = HEAD if depth == "head" else F**depth
    assert layer_lr_scale(name, N, F, HEAD, embedding) == pytest.approx(expected)
    assert layer_lr_scale(name, N, 1.0, 1.0, embedding) == 1.0  # off: every parameter at --lr


def test_bad_values_are_one_line_errors_and_the_head_rate_follows_lr():
    for value in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="--layer-lr-decay"):
            Config().replace(layer_lr_decay=value)
    with pytest.raises(ConfigError, match="--head-lr"):
        Config().replace(head_lr=-1.0)
    cfg = OptimConfig(lr=2e-5, head_lr=1e-3, layer_lr_decay=0.9, scale_lr=True)
    assert cfg.layerwise and cfg.head_scale == pytest.approx(50.0)
    assert not OptimConfig().layerwise and OptimConfig(head_lr=1e-4).head_scale == 1.0
    line = describe_layer_rates(cfg, 2, 8)  # --scale-lr: x8 devices
    assert line.startswith("embeddings 0.00013, layers 0-1 0.000144 to 0.00016 (x0.9 per")
    assert "head 0.008 " in line


def _tree():
    rng = np.random.default_rng(0)
    return {
        "a": {"kernel": rng.normal(size=(3, 2)).astype(np.float32)},
        "b": {"bias": rng.normal(size=(2,)).astype(np.float32)},
        # a scanned leaf: 3 layers stacked on the leading axis, one multiplier each
        "stacked": {"kernel": rng.normal(size=(3, 2, 2)).astype(np.float32)},
    }


@pytest.mark.parametrize("form", ["torch", "transformers"])
def test_each_leaf_steps_as_adamw_at_its_own_rate(form):
    """Three updates with per-leaf multipliers equal, leaf by leaf (and stacked layer by
    stacked layer), AdamW run with lr x that multiplier: decay included, in both forms."""
    import jax
    import optax

    from jaxtpu.core.schedules import Horizon
    from jaxtpu.engine import optim

    cfg = OptimConfig(lr=1e-2, adamw=form, weight_decay=0.1, warmup_frac=0.0, clip_norm=0.0)
    horizon = Horizon(10, 10)
    params = _tree()
    scales = {
        "a": {"kernel": 0.5},
        "b": {"bias": 4.0},
        "stacked": {"kernel": np.array([1, 0.8, 0.64])},
    }
    grads = [jax.tree_util.tree_map(lambda x, k=k: np.sin(x * (k + 1)), params) for k in range(3)]

    def run(tx, p):
        state = tx.init(p)
        for g in grads:
            updates, state = tx.update(g, state, p)
            p = optax.apply_updates(p, updates)
        return p

    scaled = run(optim.make_optimizer(cfg, horizon, 1, scales), params)
    for path, scale in (("a", 0.5), ("b", 4.0)):
        alone = run(optim.make_optimizer(replace(cfg, lr=1e-2 * scale), horizon, 1), params)
        np.testing.assert_allclose(
            jax.tree_util.tree_leaves(scaled[path]),
            jax.tree_util.tree_leaves(alone[path]),
            rtol=2e-6,
        )
    for layer, scale in enumerate((1, 0.8, 0.64)):
        alone = run(optim.make_optimizer(replace(cfg, lr=1e-2 * scale), horizon, 1), params)
        np.testing.assert_allclose(
            scaled["stacked"]["kernel"][layer], alone["stacked"]["kernel"][layer], rtol=2e-6
        )
    plain = run(optim.make_optimizer(cfg, horizon, 1), params)
    assert not np.allclose(plain["b"]["bias"], scaled["b"]["bias"])  # the multipliers did act


@pytest.mark.torch
def test_torch_groups_give_each_parameter_the_flax_sides_rate():
    """Every torch parameter's group rate is --lr times the multiplier the Flax side gives the
    leaf of the same name (names compared, not assumed), and the decay groups are kept."""
    import jax

    from jaxtpu.core.hf.encoder import EncoderConfig
    from jaxtpu.core.schedules import Horizon
    from jaxtpu.engine import weights
    from jaxtpu.models import encoder as models
    from torchxla_ref import optim as torch_optim
    from torchxla_ref.models import Classifier

    enc = EncoderConfig(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=3,
        vocab_size=100,
    )
    cfg = OptimConfig(lr=1e-4, layer_lr_decay=0.7, head_lr=3e-3)
    params = models.init_params(models.create_module(ModelSpec(enc, head_dropout=0.3)), (4,), 0)
    flax = {
        weights.param_name(tuple(k.key for k in path), "bert"): float(s)
        for path, s in jax.tree_util.tree_leaves_with_path(weights.lr_scales(params, enc, cfg))
    }
    model = Classifier(enc, 0.3)
    opt, _ = torch_optim.make_optimizer(model, cfg, Horizon(10, 10), 1)
    rate = {
        id(p): (g["initial_lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]
    }
    names = dict(model.named_parameters())
    assert set(names) <= set(flax) and len(names) > 10
    for name, p in names.items():
        lr, decay = rate[id(p)]
        assert lr == pytest.approx(1e-4 * flax[name]), name
        assert decay == (0.0 if "bias" in name or "LayerNorm" in name else 0.01), name
    assert {round(g["initial_lr"], 12) for g in opt.param_groups} == {
        round(1e-4 * s, 12) for s in (0.7**3, 0.7**2, 0.7, 1.0, 30.0)
    }
