"""ModernBERT's sliding-window attention, both forms: the full L x L score matrix with the band
masked, and the banded form (`jaxtpu.models.modernbert.Attention._banded`: chunks of half a
window against three chunks of keys), on the same inputs.

`python -m benchmarks.training.local_attention [--lengths 256,512,1024,2048] [--target v5e-1]`

One ModernBERT-base attention layer (hidden 768, 12 heads, a 128-token window), bf16 compute
as in training, forward and backward (`value_and_grad` of the squared outputs), 4,096 tokens a
call (batch = 4096 / length):
- on this machine's CPU: measured, the median of `--repeats` calls after a warm-up;
- on a TPU: an estimate, not a measurement: the same function compiled for one device of
  `--target` (libtpu, no TPU needed) and priced by jaxtpu's roofline at the target's rates
  (`jaxtpu.preflight.roofline`, the method preflight uses; the range is on-chip traffic free .. at
  the HBM rate).
The rule `jaxtpu.models.modernbert.banded` (banded from 8 half-windows) is read off this table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report

HIDDEN, HEADS, WINDOW, TOKENS = 768, 12, 128, 4096


def _layer(form: str):
    import jax.numpy as jnp

    from jaxtpu.core.hf.encoder import EncoderConfig
    from jaxtpu.models import modernbert

    enc = EncoderConfig(
        model_type="modernbert",
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_hidden_layers=2,
        intermediate_size=1152,
        layer_types=("full_attention", "sliding_attention"),
        local_attention=WINDOW,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        type_vocab_size=0,
        max_position_embeddings=8192,
    )
    return modernbert.Attention(enc, sliding=True, dtype=jnp.bfloat16, local_form=form)


def _step(form: str, length: int):
    """(jitted fwd+bwd, params, inputs) of one form at `length`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxtpu.models import modernbert

    module = _layer(form)
    batch = max(1, TOKENS // length)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch, length, HIDDEN)), jnp.float32)
    mask = np.ones((batch, length), np.int32)
    mask[: batch // 2, length * 3 // 4 :] = 0  # some padding, as real batches have
    bias = jnp.where(jnp.asarray(mask)[:, None, None, :] > 0, 0.0, modernbert.NEG)
    params = module.init(jax.random.key(0), x, bias, True)

    def loss(p, x, bias):
        return jnp.sum(jnp.square(module.apply(p, x, bias, True).astype(jnp.float32)))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), (params, x, bias)


def cpu_ms(form: str, length: int, repeats: int) -> float:
    import jax

    fn, args = _step(form, length)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def tpu_ms(form: str, length: int, target: str) -> tuple[float, float]:
    """The roofline's (low, high) milliseconds of the step compiled for one `target` device."""
    import jax

    from jaxtpu.preflight import roofline, targets

    tpu = targets.TPU_TARGETS[target]
    devices, _ = targets.target_devices(target, tpu.devices)
    fn, args = _step(form, length)
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    abstract = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args
    )
    text = fn.lower(*abstract).compile().as_text()
    rates = tpu.peak_flops_per_device(), tpu.bandwidth_per_device()
    low = roofline.total(roofline.roofline(text, *rates)).seconds
    high = roofline.total(roofline.roofline(text, *rates, on_chip=True)).seconds
    return low * 1e3, high * 1e3


def row(length: int, repeats: int, target: str | None) -> dict[str, Any]:
    """One length: both forms' CPU milliseconds, and (with a target) their TPU estimates."""
    found: dict[str, Any] = {"length": length, "batch": max(1, TOKENS // length)}
    for form in ("full", "banded"):
        found[f"cpu_{form}_ms"] = cpu_ms(form, length, repeats)
        found[f"est_{form}_ms"] = list(tpu_ms(form, length, target)) if target else None
    return {**found, "target": target}


def table(rows: list[dict[str, Any]]) -> str:
    """A row per length: CPU milliseconds measured, TPU milliseconds estimated (starred)."""
    target = next((r["target"] for r in rows if r["target"]), "TPU")
    header = (
        "| length | batch | CPU full ms | CPU banded ms | CPU full / banded "
        f"| {target} est. full ms* | {target} est. banded ms* | est. full / banded |"
    )
    lines = [header, "|" + "---|" * (header.count(" | ") + 1)]
    for r in rows:
        full, band = r["cpu_full_ms"], r["cpu_banded_ms"]
        cells = [r["length"], r["batch"], f"{full:.1f}", f"{band:.1f}", f"{full / band:.2f}x"]
        if r["est_full_ms"] is None:
            cells += ["-", "-", "-"]
        else:
            (fl, fh), (bl, bh) = r["est_full_ms"], r["est_banded_ms"]
            cells += [f"{fl:.3f}-{fh:.3f}", f"{bl:.3f}-{bh:.3f}", f"{fl / bl:.2f}x"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "\\* estimate: jaxtpu's roofline of the program compiled for the target, "
              "not measured"]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.local_attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lengths", default="256,512,1024,2048", help="comma-separated [%(default)s]")
    p.add_argument("--repeats", type=int, default=5, help="timed CPU calls per cell [5]")
    p.add_argument("--target", default="v5e-1", help="TPU target of the estimate [v5e-1]")
    p.add_argument("--no-tpu", action="store_true", help="skip the TPU estimate")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/local_attention.json, the table docs/families.md shows",
    )
    args = p.parse_args(argv)
    # the code and machine
    started = start_report(args.report, "benchmarks.training.local_attention")
    rows = []
    for length in map(int, args.lengths.split(",")):
        rows.append(row(length, args.repeats, None if args.no_tpu else args.target))
        print(table(rows[-1:]).splitlines()[2], flush=True)
    print("\n" + table(rows))
    if args.report:
        module = "benchmarks.training.local_attention"
        kept = keep_report(args.report, "local_attention", rows, module, argv, started)
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
