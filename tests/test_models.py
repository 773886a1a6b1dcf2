"""Flax BERT vs Hugging Face on the real pretrained checkpoint; weight conversion both ways."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtpu.core.data import readers
from jaxtpu.core.data.tokens import tokenize
from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.flags.presets import minilm
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.hf import directory as hf
from jaxtpu.core.hf import tokenizer_dir
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.engine import weights
from jaxtpu.models import bert, ops
from jaxtpu.models import encoder as models

torch = pytest.importorskip("torch", reason="the Hugging Face reference needs torch")
transformers = pytest.importorskip("transformers")

# bf16 tolerance, measured on these 16 real comments at max_len 64 (max abs error vs fp32 HF):
# last hidden state at real (non-padding) tokens 0.020, pooled output 0.0014. bf16 keeps 8
# bits of mantissa: each rounding of a matmul operand is off by up to 2^-9 relative, on hidden
# activations up to ~10 in magnitude, and six layers compound it. The bounds leave ~3x headroom.
# (Hidden states at padding positions are never used and drift more: not compared.)
BF16_HIDDEN_ATOL = 0.05
BF16_POOLED_ATOL = 0.005


@pytest.fixture(scope="module")
def real_batch(tokenizer, real_csv):
    comments = readers.read_comments(real_csv)
    texts = comments.texts[:16]
    ids, mask, _ = tokenize(texts, tokenizer, 64)
    assert (mask.sum(1) < 64).any() and (mask.sum(1) == 64).any()  # padded and truncated rows
    return ids, mask


@pytest.fixture(scope="module")
def hf_model(minilm_dir):
    return transformers.BertModel.from_pretrained(minilm_dir).eval()


@pytest.fixture(scope="module")
def flax_params(minilm_dir):
    enc = RunSpec.resolve(minilm()).encoder
    module = models.create_module(ModelSpec(enc, head_dropout=0.3))
    template = models.init_params(module, (8,), 0)
    params, kept = weights.load_params(minilm_dir, template)
    assert sorted(kept) == ["classifier.bias", "classifier.weight"]  # only the new head
    return enc, params


def hf_forward(hf_model, ids, mask):
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask)
        )
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


@pytest.mark.compile
def test_forward_matches_hugging_face_fp32_and_bf16(real_batch, hf_model, flax_params):
    ids, mask = real_batch
    enc, params = flax_params
    ref_h, ref_p = hf_forward(hf_model, ids, mask)
    h, p = bert.Backbone(enc).apply({"params": params["bert"]}, ids, mask)
    assert np.abs(np.asarray(h) - ref_h).max() <= 1e-4
    assert np.abs(np.asarray(p) - ref_p).max() <= 1e-4
    h16, p16 = bert.Backbone(enc, dtype=jnp.bfloat16).apply({"params": params["bert"]}, ids, mask)
    real = mask.astype(bool)
    assert np.abs(np.asarray(h16) - ref_h)[real].max() <= BF16_HIDDEN_ATOL
    assert np.abs(np.asarray(p16) - ref_p).max() <= BF16_POOLED_ATOL


@pytest.mark.model
def test_roundtrip_hf_flax_hf_is_bit_identical(minilm_dir, flax_params, tmp_path, hf_model):
    enc, params = flax_params
    out = weights.save_hf(params, enc, tmp_path / "export", tokenizer_dir=minilm_dir)
    original = hf.read_state_dict(minilm_dir)
    encoder, head = weights.to_state_dicts(params)
    assert set(encoder) == set(original)
    for key, value in original.items():
        assert np.array_equal(encoder[key], value), key
    assert set(head) == {"classifier.weight", "classifier.bias"}
    assert head["classifier.weight"].shape == (1, enc.hidden_size)  # nn.Linear layout
    # transformers loads the exported encoder with nothing missing or unexpected
    model, info = transformers.AutoModel.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for key, value in model.state_dict().items():
        if key in original:
            assert np.array_equal(value.numpy(), original[key]), key
    # and the export loads back into Flax, head included, bit for bit
    back, kept = weights.load_params(out, params, head_required=True)
    assert kept == []
    for a, b in zip(
        jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params), strict=True
    ):
        assert np.array_equal(a, b)


@pytest.mark.model
def test_checkpoint_of_another_size_names_the_first_mismatched_tensor(minilm_dir):
    enc = EncoderConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128)
    module = models.create_module(ModelSpec(enc, head_dropout=0.3))
    template = models.init_params(module, (8,), 0)
    with pytest.raises(
        CheckpointError,
        match=r"tensor embeddings\.LayerNorm\.bias has shape \(384,\), the model expects \(64,\)",
    ):
        weights.load_params(minilm_dir, template)


@pytest.mark.model
def test_ranker_scores_each_comment_of_a_pair_with_the_same_head(flax_params, real_batch):
    enc, params = flax_params
    ids, mask = real_batch
    model = models.create_module(ModelSpec(enc, head_dropout=0.2))
    single = model.apply({"params": params}, ids[:4], mask[:4])
    pairs = model.apply({"params": params}, ids[:4].reshape(2, 2, -1), mask[:4].reshape(2, 2, -1))
    assert pairs.shape == (2, 2) and pairs.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(pairs).reshape(-1), np.asarray(single), atol=1e-5)


@pytest.mark.model
def test_hash_dropout_keeps_the_right_fraction_independently_and_scales():
    rate, shape = 0.1, (8, 12, 128, 128)
    x = jnp.ones(shape, jnp.float32)
    drop = ops.Dropout(rate)

    def apply(seed: int) -> np.ndarray:
        return np.asarray(drop.apply({}, x, False, rngs={"dropout": jax.random.key(seed)}))

    a, b = apply(0), apply(1)
    n = a.size
    kept = a != 0
    # Binomial(n, 0.9): standard deviation sqrt(n * 0.09) / n = 2e-4 of the fraction.
    assert abs(kept.mean() - (1 - rate)) < 6 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(a[kept], 1 / (1 - rate), rtol=1e-6)  # inverted dropout
    # Masks of two keys, and neighbouring elements of one mask, are uncorrelated.
    for u, v in [(a != 0, b != 0), (kept[..., :-1], kept[..., 1:]), (kept[:-1], kept[1:])]:
        corr = np.corrcoef(u.ravel().astype(np.float32), v.ravel().astype(np.float32))[0, 1]
        assert abs(corr) < 6 / np.sqrt(u.size), corr
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(apply(0), a)  # same key, same mask
    same = np.asarray(drop.apply({}, x, True))  # deterministic: identity
    np.testing.assert_array_equal(same, np.ones(shape, np.float32))
    # Bits are uniform: each byte of the words equally likely.
    bits = np.asarray(ops.hash_bits(jax.random.key(3), (1 << 20,)))
    for shift in (0, 8, 16, 24):
        counts = np.bincount((bits >> shift) & 0xFF, minlength=256)
        chi2 = (((counts - counts.mean()) ** 2) / counts.mean()).sum()
        assert chi2 < 400, (shift, chi2)  # 255 degrees of freedom: p < 1e-6 above 400
    # The key's own words seed the hash: neighbouring raw keys still give unrelated masks.
    k0, k1 = (np.asarray(ops.hash_bits(jax.random.key(s), (1 << 20,))) >= 2**31 for s in (0, 1))
    corr = np.corrcoef(k0.astype(np.float32), k1.astype(np.float32))[0, 1]
    assert abs(corr) < 6 / np.sqrt(k0.size) and not np.array_equal(k0, k1), corr


def test_gelu_is_pytorchs_exact_gelu_and_its_gradient():
    """`ops.gelu` (the erf form, faster on XLA:CPU than jax.nn.gelu's erfc form) against
    PyTorch's exact `F.gelu`, values and gradients, from the far negative tail to large x."""
    x = np.concatenate([np.linspace(-12, 12, 20001), [-30.0, -6.5, 0.0, 6.5, 30.0]])
    x = x.astype(np.float32)
    value, grad = jax.vmap(jax.value_and_grad(ops.gelu))(jnp.asarray(x))
    tx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.gelu(tx)
    ref.sum().backward()
    np.testing.assert_allclose(np.asarray(value), ref.detach().numpy(), rtol=1e-6, atol=3e-6)
    np.testing.assert_allclose(np.asarray(grad), tx.grad.numpy(), rtol=1e-6, atol=3e-6)
    assert np.asarray(value)[np.abs(x) <= 1].std() > 0.1  # not a constant


@pytest.mark.model
def test_bf16_matmul_results_reach_the_model_and_keep_fp32_logits():
    """--matmul-output bf16 (a TPU's default) rounds the bf16 matmuls' results once: the same
    params give logits within bf16 rounding of the fp32-result model's but not equal to
    them, the logits stay fp32, and the gradients are finite. Under fp32 compute it changes
    nothing."""
    enc = EncoderConfig()  # tiny random-init BERT
    ids = np.random.default_rng(0).integers(1000, 20000, (4, 16)).astype(np.int32)
    mask = np.ones_like(ids)

    params = models.init_params(models.create_module(ModelSpec(enc)), (16,), 0)

    def logits(precision, out):
        module = models.create_module(ModelSpec(enc, precision=precision, matmul_output=out))
        return module, params, jax.jit(module.apply)({"params": params}, ids, mask)

    _, _, exact = logits("bf16", "fp32")
    module, params, rounded = logits("bf16", "bf16")
    assert rounded.dtype == jnp.float32 and exact.dtype == jnp.float32
    assert not np.array_equal(rounded, exact)
    np.testing.assert_allclose(rounded, exact, atol=0.05)
    grads = jax.grad(lambda p: module.apply({"params": p}, ids, mask).sum())(params)
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))
    assert np.array_equal(logits("fp32", "bf16")[2], logits("fp32", "fp32")[2])


def test_bf16_matmul_gradients_round_as_autocast_does():
    """With bf16 results the mixed matmul's backward rounds both operands' gradients to bf16,
    as torch.autocast does (its matmul runs on bf16 copies; the casts' backward widens the
    bf16 gradients): on integer operands, where fp32 accumulation is exact and the order of
    the sums cannot matter, the gradients equal autocast's bit for bit, and with fp32 results
    they are the exact sums that autocast rounds away."""
    rng = np.random.default_rng(0)
    a = rng.integers(-50, 50, (3, 5, 16)).astype(np.float32)
    b = rng.integers(-50, 50, (16, 7)).astype(np.float32)
    g = rng.integers(-50, 50, (3, 5, 7)).astype(np.float32)

    def grads(out):
        y, vjp = jax.vjp(lambda x, w: ops.mixed_einsum("...k,kn->...n", x, w, out), a, b)
        return [np.asarray(d) for d in vjp(jnp.asarray(g, y.dtype))]

    ta, tb = (torch.tensor(x, requires_grad=True) for x in (a, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ta @ tb
    assert y.dtype == torch.bfloat16
    y.backward(torch.tensor(g).to(torch.bfloat16))
    autocast = [ta.grad.numpy(), tb.grad.numpy()]
    exact = [g @ b.T, np.einsum("bik,bin->kn", a, g)]

    for mine, theirs, full in zip(grads(jnp.bfloat16), autocast, exact, strict=True):
        assert mine.dtype == np.float32
        np.testing.assert_array_equal(mine, theirs)
        assert not np.array_equal(mine, full)  # the rounding is visible on these sums
    for mine, full in zip(grads(jnp.float32), exact, strict=True):
        np.testing.assert_array_equal(mine, full)


@pytest.mark.compile
def test_text_pairs_get_the_tokenizers_token_types_on_both_sides(
    tokenizer, minilm_dir, hf_model, flax_params, real_csv
):
    """The rules task's (rule, comment) pairs: each side's classifier derives the comment's
    token type 1 from the ids (`segment_types`); both are held to transformers' BertModel
    given the tokenizer's own `token_type_ids`, fp32, and the types are shown to matter."""
    from torchxla_ref.weights import load_model

    enc, params = flax_params
    comments = readers.read_comments(real_csv).texts[:8]
    rules = ["No insults.", "No spam or self-promotion of any kind."] * 4
    ref = tokenizer(
        rules,
        comments,
        truncation="only_second",
        max_length=48,
        padding="max_length",
        return_tensors="np",
    )
    ids, mask = ref["input_ids"].astype(np.int32), ref["attention_mask"].astype(np.int32)
    assert ref["token_type_ids"].any()
    sep = tokenizer_dir.separator_id(minilm_dir)

    with torch.no_grad():
        out = hf_model(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            token_type_ids=torch.from_numpy(ref["token_type_ids"]).long(),
        )
    pooled = out.pooler_output.numpy()
    head = params["classifier"]
    expected = (pooled @ np.asarray(head["kernel"]) + np.asarray(head["bias"]))[:, 0]
    for segment_sep, close in ((sep, True), (-1, False)):
        module = models.create_module(ModelSpec(enc, segment_sep=segment_sep))
        got = np.asarray(module.apply({"params": params}, ids, mask))
        diff = np.abs(got - expected).max()
        assert (diff <= 1e-4) == close, (segment_sep, diff)

    torch_model = load_model(ModelSpec(enc, segment_sep=sep), minilm_dir, 0).eval()
    with torch.no_grad():
        got = torch_model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        weight, bias = torch_model.classifier.weight.numpy(), torch_model.classifier.bias.numpy()
    assert np.abs(got - (pooled @ weight.T + bias)[:, 0]).max() <= 1e-4
