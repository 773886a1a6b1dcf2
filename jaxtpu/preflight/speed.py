"""Speed before the TPU: the model's FLOPs per step as XLA counts them, and the TPU compiler's
cost-model estimate of the step time (`estimate`) for a TPU target. An estimate, not a
measurement."""

from __future__ import annotations

from typing import Any

from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.preflight.lowering import lower, no_cache_writes
from jaxtpu.preflight.report import Report
from jaxtpu.preflight.targets import TPU_TARGETS


def unrolled(cfg: Config) -> Config:
    """The run's train step as XLA's counts and the TPU cost model see it whole: layers not
    scanned, one step per call (both count a loop's body once, not once per iteration)."""
    return cfg.replace(
        scan_layers=False, steps_per_call=1, log_every=1, eval_every=0, checkpoint_every=0
    )


def flops_per_step(cfg: Config, devices: list[Any]) -> float:
    """FLOPs of one train step per device: XLA's count of the whole (unpartitioned) step,
    lowered for one host CPU device, divided by the devices (the same for every target and
    placement; a TPU-compiled executable counts its own partitioned program, `estimate`).
    Counted on the unscanned model, one step per call: XLA counts a loop body once, not once
    per iteration."""
    import jax

    n = len(devices)
    flat = unrolled(cfg).replace(
        parallel="jit", sharding="replicated", mesh="", batch_size=cfg.train.batch_size * n
    )
    key = flat.to_json()
    if key not in _FLOPS:  # the same for every placement: once per model, batch and remat
        cost = lower(flat, jax.local_devices(backend="cpu")[:1]).train.cost_analysis() or {}
        _FLOPS[key] = float(cost.get("flops", 0.0))
    return _FLOPS[key] / n


_FLOPS: dict[str, float] = {}


def compile_unrolled(cfg: Config, devices: list[Any]) -> Any:
    """The run's train step (`unrolled`) compiled for `devices`: what `estimate` reads."""
    with no_cache_writes(devices[0].platform != "cpu"):
        return lower(unrolled(cfg), devices).train.compile()


def estimate(cfg: Config, devices: list[Any], compiled: Any = None) -> tuple[float, float]:
    """(step seconds, bytes accessed per step) per device, from the TPU compiler's cost model
    (`cost_analysis()["optimal_seconds"]`) of the run's train step compiled for `devices`
    (`compiled`, when the caller has it), unrolled: the cost model counts a loop's body once,
    so scanned layers and K steps per call would be undercounted. (0, 0) where the compiler
    gives no estimate (the CPU)."""
    key = f"{devices[0].device_kind}|{len(devices)}|{unrolled(cfg).to_json()}"
    if key not in _ESTIMATES:
        if compiled is None:
            compiled = compile_unrolled(cfg, devices)
        cost = compiled.cost_analysis() or {}
        if isinstance(cost, list):  # older jax: one dict per program
            cost = cost[0] if cost else {}
        _ESTIMATES[key] = (
            float(cost.get("optimal_seconds", 0.0) or 0.0),
            float(cost.get("bytes accessed", 0.0) or 0.0),
        )
    return _ESTIMATES[key]


_ESTIMATES: dict[str, tuple[float, float]] = {}


def add_estimate(
    report: Report, cfg: Config, target: str, devices: list[Any], spec: RunSpec
) -> None:
    """The compiler's estimated step time (TPU targets) and the model FLOPs beside it."""
    report.global_batch = cfg.train.batch_size * len(devices)
    report.model_flops, report.remat_flops = spec.encoder.train_flops(
        cfg.train.batch_size * spec.task.comments_per_example, cfg.data.max_len, cfg.model.remat
    )
    if target in TPU_TARGETS:
        chip = TPU_TARGETS[target].chip
        report.peak_flops = TPU_TARGETS[target].peak_flops_per_device()
        if not chip.cost_model:  # never shown as the compiler's figure, even when positive
            report.extra["no_estimate"] = (
                f"its cost model is not validated for {chip.device_kind} on a host without a "
                "TPU (it gives real models negative step times on v4, v5e and v6e; docs/tpu.md)"
            )
            return
        seconds, bytes_accessed = estimate(cfg, devices)
        if seconds > 0:
            report.est_step_s, report.est_bytes_per_step = seconds, bytes_accessed
        else:
            report.extra["no_estimate"] = f"optimal_seconds {seconds:.4g}"
