"""Performance kernels the models are built from: 16-bit matmuls with a 16-bit backward pass
(custom VJP), and dropout with counter-hash masks. Both were measured on XLA:CPU
(docs/benchmarks.md, "What made it faster") and are plain JAX, so they run the same on TPU.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# --------------------------------------------------------------------------- half matmuls

# The 16-bit compute dtypes (--precision bf16, fp16): matmuls take them as operands.
HALF = (jnp.bfloat16, jnp.float16)


@partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def mixed_einsum(
    spec: str, a: jax.Array, b: jax.Array, out: Any = jnp.float32, half: Any = jnp.bfloat16
) -> jax.Array:
    """A two-operand matmul-type einsum with `half` operands (bf16, or fp16 for --precision
    fp16) and fp32 accumulation, its result in `out` (fp32, or bf16: `--matmul-output`,
    rounded once from the fp32 accumulator).

    The backward pass runs its two matmuls the same way (`half` cotangent, fp32 accumulation,
    results in `out`), as torch.autocast does: under autocast the gradients with respect to
    the 16-bit copies of the operands are 16-bit, and the casts' backward widens them. So with
    bf16 results the operands' gradients are bf16 values even where an operand is fp32 (half
    the bytes for the attention probabilities' and the projections' input gradients; the
    TPU compiler's estimate is in docs/tpu.md, "Tuned for the TPU"). Under fp16 the cotangent's
    cast is where a too large loss scale overflows to inf, as it does in torch's fp16 backward
    (what dynamic loss scaling detects). Letting JAX differentiate `einsum(...,
    preferred_element_type=f32)` instead gives fp32 backward matmuls, which ran several times
    slower on XLA:CPU (`python -m benchmarks.training.compare`; docs/benchmarks.md).
    Every index must appear in exactly two of the three terms (true of matmuls).
    """
    return _mixed_fwd(spec, a, b, out, half)[0]


def _mixed_fwd(spec: str, a: jax.Array, b: jax.Array, out: Any, half: Any):
    a16, b16 = a.astype(half), b.astype(half)
    y = jnp.einsum(spec, a16, b16, preferred_element_type=jnp.float32).astype(out)
    # Zero-size markers carry the input dtypes, which the cotangents must have.
    return y, (a16, b16, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _mixed_bwd(spec: str, result: Any, half: Any, res, g: jax.Array):
    a16, b16, a_dtype, b_dtype = res
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    g16 = g.astype(half)
    f32 = jnp.float32
    da = jnp.einsum(f"{out},{sb}->{sa}", g16, b16, preferred_element_type=f32).astype(result)
    db = jnp.einsum(f"{sa},{out}->{sb}", a16, g16, preferred_element_type=f32).astype(result)
    return da.astype(a_dtype.dtype), db.astype(b_dtype.dtype)


mixed_einsum.defvjp(_mixed_fwd, _mixed_bwd)


def mixed_dot_general(
    lhs,
    rhs,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    out=jnp.float32,
    half=jnp.bfloat16,
):
    """`nn.Dense`'s contraction (last axis of the input with the kernel's first) in `half`,
    its result in `out`."""
    (lc, rc), (lb, rb) = dimension_numbers
    if tuple(lc) != (lhs.ndim - 1,) or tuple(rc) != (0,) or lb or rb:
        raise NotImplementedError(f"unsupported contraction {dimension_numbers}")
    return mixed_einsum("...k,kn->...n", lhs, rhs, out, half)


def is_half(dtype: Any) -> bool:
    """Whether `dtype` is a 16-bit compute dtype (`HALF`)."""
    return any(dtype == h for h in HALF)


def matmul(
    spec: str, a: jax.Array, b: jax.Array, dtype: jnp.dtype, out: Any = jnp.float32
) -> jax.Array:
    """Attention matmuls: mixed 16-bit under bf16 or fp16 compute (result in `out`), plain
    fp32 otherwise."""
    if is_half(dtype):
        return mixed_einsum(spec, a, b, out, jnp.dtype(dtype).type)
    return jnp.einsum(spec, a, b)


# --------------------------------------------------------------------------- activations


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, 0.5 x (1 + erf(x / sqrt(2))): Hugging Face's "gelu" and PyTorch's
    `F.gelu` formula. `jax.nn.gelu(approximate=False)` computes the same through erfc, whose
    XLA:CPU kernel (an exp and several branches) ran slower than erf's rational polynomial
    (docs/benchmarks.md: "What made it faster"); the two agree to 1e-6 absolute (both are as
    close to PyTorch's, tests/test_models.py)."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


# --------------------------------------------------------------------------- dropout


def _mix32(x: jax.Array) -> jax.Array:
    """An invertible avalanche mix of uint32 words (xor-shift-multiply, 32-bit constants)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x21F0AAAD)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x735A2D97)
    return x ^ (x >> 15)


def hash_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform uint32 words for `shape`: a counter-based hash of each element's flat index,
    seeded by the key's own two words.

    Cheap elementwise integer work instead of one threefry evaluation per element, which took
    a large share of a MiniLM step on XLA:CPU (docs/benchmarks.md: "What made it faster").
    The index is an iota, so under jit
    with sharded activations each device computes only its part. Indices wrap at 2^32
    elements per call (far beyond one activation tensor here). The key (a `make_rng` key: a
    threefry output) is used as the seed directly rather than hashed once more with
    `jax.random.bits`: one threefry less per dropout site and step program, which XLA:CPU
    spent measurable compile time on (docs/benchmarks.md: "what shortened it").
    """
    s1, s2 = jax.random.key_data(key).reshape(-1)[:2].astype(jnp.uint32)
    idx = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for dim in reversed(range(len(shape))):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, dim) * jnp.uint32(stride % 2**32)
        stride *= shape[dim]
    return _mix32(_mix32(idx ^ s1) + s2)


class Dropout(nn.Module):
    """Inverted dropout like `nn.Dropout` (keep with probability 1 - rate, scale by
    1 / (1 - rate)), with masks from `hash_bits` drawn from the 'dropout' RNG stream."""

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        threshold = jnp.uint32(min(int(round(self.rate * 2**32)), 2**32 - 1))
        keep = hash_bits(self.make_rng("dropout"), x.shape) >= threshold
        return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - self.rate), x.dtype), 0).astype(x.dtype)
