"""Does a run fit: compile it for a target and read the compiler's memory accounting
(`check`), the largest batch that fits (`find_batch`), and the placements to try (`options`,
`--sweep`)."""

from __future__ import annotations

import time
from typing import Any

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import REMATS, Config
from jaxtpu.preflight.lowering import bytes_per_device, lower
from jaxtpu.preflight.memo import compile_facts
from jaxtpu.preflight.report import Report
from jaxtpu.preflight.speed import add_estimate, flops_per_step, is_unrolled
from jaxtpu.preflight.targets import (
    GPU_MEMORY_METHOD,
    GPU_TARGETS,
    TPU_TARGETS,
    memory_fraction,
    platform_of,
)

# `--sweep`: every way jaxtpu can place the state, with and without rematerialisation.
SWEEP = [(s, r) for s in ("replicated", "zero1", "fsdp") for r in REMATS]


def check(
    cfg: Config,
    target: str,
    devices: list[Any],
    capacity: int,
    flops: bool = True,
    speed: bool = True,
) -> Report:
    """Compiles the run's train and eval steps for `devices` and reports their memory (with
    `flops` the FLOPs per step: one more lowering, of the unscanned model; with `speed` too,
    on a TPU target, the estimated step time, `estimate`: read from the train program when it
    is the unrolled one, else one more compilation)."""
    import jax

    spec = RunSpec.resolve(cfg, len(devices), platform_of(devices, target))
    data, fsdp = spec.mesh
    report = Report(
        target,
        spec.sharding,
        cfg.model.remat,
        f"data={data},fsdp={fsdp}",
        cfg.train.batch_size,
        cfg.data.max_len,
        capacity=capacity,
        scan=cfg.model.scan_layers,
        device=devices[0].device_kind,
    )
    t0 = time.perf_counter()
    low = lower(cfg, devices, spec)
    # known from the shapes and shardings alone: reported even when the compiler refuses
    report.params = bytes_per_device(low.state.params, low.shardings.params)
    report.optimizer = bytes_per_device(low.state.opt_state, low.shardings.opt_state)
    read_text = flops and speed and target in TPU_TARGETS and is_unrolled(cfg)  # the estimate's
    compiled = compile_facts(low.train, devices, text=read_text)
    compiled_eval = compiled if compiled.error else compile_facts(low.eval, devices)
    if compiled.remembered and compiled_eval.remembered:  # nothing compiled now
        report.compile_s = compiled.compile_s + (0 if compiled.error else compiled_eval.compile_s)
        report.extra["compile_remembered"] = True
    else:
        report.compile_s = round(time.perf_counter() - t0, 1)
    if compiled.error or compiled_eval.error:  # the TPU compiler refuses what cannot fit
        report.error = compiled.error or compiled_eval.error
        return report
    mem, eval_mem = compiled.memory, compiled_eval.memory
    report.batch = bytes_per_device(
        low.batches, jax.tree_util.tree_map(lambda x: x.sharding, low.batches)
    )
    report.temporary = int(mem.temp_size_in_bytes)
    report.total = _peak(mem)
    report.eval_total = _peak(eval_mem)
    report.fits = max(report.total, report.eval_total) <= capacity
    if target in GPU_TARGETS:
        _gpu_lowering(report, cfg, target, devices, spec)
    if flops:
        report.flops_per_step = flops_per_step(cfg, devices)
        if speed:
            add_estimate(report, cfg, target, devices, spec, compiled if is_unrolled(cfg) else None)
    return report


def _gpu_lowering(
    report: Report, cfg: Config, target: str, devices: list[Any], spec: RunSpec
) -> None:
    """A GPU target's report: its GPU named, how its memory was estimated, and the train and
    eval steps lowered for CUDA (which needs no GPU; compiling does). A program that does not
    lower for CUDA is refused, as the TPU compiler refuses one that cannot fit."""
    report.device = GPU_TARGETS[target].chip.device_kind
    report.extra["memory_method"] = GPU_MEMORY_METHOD.format(fraction=memory_fraction())
    t0 = time.perf_counter()
    try:
        lower(cfg, devices, spec, platform="cuda")
    except Exception as e:  # a lowering rule CUDA lacks, or an operation it cannot place
        report.fits = False
        report.error = f"does not lower for CUDA: {str(e).splitlines()[0][:240]}"
    report.extra["cuda_lowering_s"] = round(time.perf_counter() - t0, 1)


def _peak(mem: Any) -> int:
    """The executable's live bytes at its peak: inputs, outputs not aliased to a (donated)
    input, and the temporaries."""
    return int(
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )


def find_batch(
    cfg: Config,
    target: str,
    devices: list[Any],
    capacity: int,
    say: Any,
    tolerance: float = 1 / 8,
    speed: bool = True,
) -> Report:
    """The largest per-device batch whose train and eval steps fit, to within `tolerance` of
    itself (0 = exact): from --batch-size, doubling while it fits (halving while it does not),
    then bisection of the last bracket. Memory does not always grow strictly with the batch
    (the TPU compiler's schedule changes), so the answer is the largest batch seen to fit on
    that path. It goes no higher than `MAX_BATCH` (the report's `search_cap` says when it
    stopped there with every batch fitting). One compilation per batch tried; returns the
    report of the batch found (or of the smallest tried, not fitting, when nothing fits),
    with the estimated step time of that batch (`speed`; its compilation of the unrolled
    program can take many times the search's on a deep model)."""
    tried: dict[int, Report] = {}

    def fits(b: int) -> bool:
        tried[b] = check(cfg.replace(batch_size=b), target, devices, capacity, flops=False)
        say(tried[b])
        return tried[b].fits

    lo, hi = 0, cfg.train.batch_size
    if fits(hi):
        lo, hi = hi, 0
        while not hi and lo * 2 <= MAX_BATCH:
            if fits(lo * 2):
                lo *= 2
            else:
                hi = lo * 2
    else:
        while not lo and hi > 1:
            if fits(hi // 2):
                lo = hi // 2
            else:
                hi //= 2
    while hi and lo and hi - lo > max(1, int(lo * tolerance)):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    best = tried[lo] if lo else tried[min(tried)]
    best.extra["largest_batch"] = lo
    if lo and not hi:  # every batch tried fitted: the search stopped at its cap, not a limit
        best.extra["search_cap"] = MAX_BATCH
    if not best.error:
        chosen = cfg.replace(batch_size=best.batch_size)
        best.flops_per_step = flops_per_step(chosen, devices)
        if speed:
            spec = RunSpec.resolve(chosen, len(devices), platform_of(devices, target))
            add_estimate(best, chosen, target, devices, spec)
    return best


MAX_BATCH = 4096


def options(cfg: Config, sweep: str | None) -> list[Config]:
    """The configurations to compile: the flags as given, or with --sweep the listed
    (--sharding, --remat) pairs ('all': every pair of `SWEEP`) on the flags' mesh (fsdp: every
    device on the fsdp axis unless --mesh says otherwise)."""
    if sweep is None:
        return [cfg]
    if not sweep.strip():
        raise ConfigError(
            "--sweep '': empty; give 'all' or a list such as replicated,zero1,fsdp+layer (or "
            "leave --sweep out for the flags as given)"
        )
    if sweep == "all":
        pairs = SWEEP
    else:
        pairs = []
        for item in sweep.split(","):
            sharding, _, remat = item.strip().partition("+")
            if (sharding, remat or "none") not in SWEEP:
                raise ConfigError(
                    f"--sweep {sweep}: {item!r} is not SHARDING[+REMAT] with SHARDING one of "
                    f"replicated, zero1, fsdp and REMAT one of {', '.join(REMATS)}"
                )
            pairs.append((sharding, remat or "none"))
    return [cfg.replace(sharding=s, remat=r) for s, r in pairs]
