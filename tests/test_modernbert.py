"""The ModernBERT layer kind's own pieces, on tiny shapes in fp32: the sliding window, its
banded form against the masked full matrix, and the rotary tables. (The whole encoder against
transformers' `ModernBertModel` is tests/test_families.py's.)"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.models import modernbert

pytestmark = pytest.mark.model  # every test here runs layers of the Flax model

ENC = EncoderConfig(
    model_type="modernbert",
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=128,
    pad_token_id=0,
    layer_types=("full_attention", "sliding_attention"),
    local_attention=8,
    global_rope_theta=1000.0,
    local_rope_theta=100.0,
    type_vocab_size=0,
)


def _attention(form: str, length: int, seed: int = 0):
    """A sliding-window attention layer of `ENC` in `form`, its params, inputs and padding
    bias (the last rows padded)."""
    module = modernbert.Attention(ENC, sliding=True, local_form=form)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(3, length, ENC.hidden_size)), jnp.float32)
    mask = np.ones((3, length), np.int32)
    mask[1, length // 2 :] = 0
    mask[2, length - 3 :] = 0
    pad_bias = jnp.where(jnp.asarray(mask)[:, None, None, :] > 0, 0.0, modernbert.NEG)
    params = module.init(jax.random.key(seed), x, pad_bias, True)
    return module, params, x, pad_bias, mask


@pytest.mark.parametrize("length", [5, 12, 29, 40])
def test_banded_sliding_window_is_the_masked_full_matrix_forward_and_backward(length):
    """Lengths shorter than, a multiple of and not a multiple of the chunk (4 = the half window),
    with padded rows: outputs at real tokens and every gradient agree to fp32 rounding."""
    full, params, x, pad_bias, mask = _attention("full", length)
    banded = dataclasses.replace(full, local_form="banded")

    def loss(module):
        def f(p, x):
            out = module.apply(p, x, pad_bias, True)
            return jnp.sum(jnp.where(jnp.asarray(mask)[..., None] > 0, out, 0.0) ** 2), out

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, x)

    (_, a), ga = loss(full)
    (_, b), gb = loss(banded)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(b)[real], np.asarray(a)[real], rtol=1e-5, atol=1e-6)
    for u, v in zip(jax.tree_util.tree_leaves(gb), jax.tree_util.tree_leaves(ga), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["full", "banded"])
def test_a_sliding_layer_sees_exactly_the_keys_within_half_the_window(form):
    """Changing the token at distance d from query 10 changes its output iff d <= 4
    (local_attention 8 // 2), in either form; a global layer sees every token."""
    module, params, x, pad_bias, _ = _attention(form, 24)
    base = np.asarray(module.apply(params, x, pad_bias, True))[0, 10]
    for d in (3, 4, 5, 9):
        moved = x.at[0, 10 + d].add(1.0)
        out = np.asarray(module.apply(params, moved, pad_bias, True))[0, 10]
        assert (np.abs(out - base).max() > 1e-6) == (d <= 4), (form, d)
    glob = dataclasses.replace(module, sliding=False)
    base = np.asarray(glob.apply(params, x, pad_bias, True))[0, 10]
    out = np.asarray(glob.apply(params, x.at[0, 19].add(1.0), pad_bias, True))[0, 10]
    assert np.abs(out - base).max() > 1e-6


def test_auto_uses_the_banded_form_from_eight_half_windows():
    assert not modernbert.banded(511, 64) and modernbert.banded(512, 64)


def test_rotary_tables_rotate_each_pair_by_position_times_frequency():
    """Position p, frequency k: angle p * theta^(-2k/D), used in both halves (the pairs
    `_rotate_half` forms); relative positions only: q(m).k(n) depends on m - n."""
    cos, sin = modernbert.rotary_tables(6, 8, 100.0)
    inv = 100.0 ** (-np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(cos[5, :4], np.cos(5 * inv), atol=1e-6)
    np.testing.assert_allclose(sin[5, 4:], np.sin(5 * inv), atol=1e-6)
    q = np.random.default_rng(0).normal(size=(1, 8)).astype(np.float32)
    k = np.random.default_rng(1).normal(size=(1, 8)).astype(np.float32)

    def dot(m, n):
        qm = modernbert.apply_rotary(jnp.asarray(q), cos[m : m + 1], sin[m : m + 1])
        kn = modernbert.apply_rotary(jnp.asarray(k), cos[n : n + 1], sin[n : n + 1])
        return float(jnp.sum(qm * kn))

    assert dot(3, 1) == pytest.approx(dot(4, 2), rel=1e-5)
    assert dot(3, 1) != pytest.approx(dot(3, 2), rel=1e-3)


def test_a_scanned_stack_of_several_groups_is_the_unscanned_model():
    """7 layers, every third global: layer 0, then 2 groups of (sliding, sliding, global),
    each group's weights at their own index of the stacked axis; with --remat too."""
    from jaxtpu.core.hf.kinds import scan_period
    from jaxtpu.models import encoder as models
    from jaxtpu.models import layers

    kinds = tuple("sliding_attention" if i % 3 else "full_attention" for i in range(7))
    enc = dataclasses.replace(ENC, num_hidden_layers=7, layer_types=kinds)
    assert scan_period(kinds) == 3
    plain = models.init_params(models.create_module(ModelSpec(enc)), (20,), 0)
    stacked = models.stack_for_scan(enc, plain)
    assert set(stacked["bert"]["encoder"]) == {"layer_0", "layers"}
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 50, size=(2, 20)), jnp.int32)
    mask = jnp.ones_like(ids).at[1, 15:].set(0)
    want = models.create_module(ModelSpec(enc)).apply({"params": plain}, ids, mask)
    for remat in ("none", "layer"):
        module = models.create_module(ModelSpec(enc, remat=remat, scan=True))
        got = module.apply({"params": stacked}, ids, mask)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    back = layers.unstack_layers(stacked)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(plain), strict=True):
        np.testing.assert_array_equal(a, b)
