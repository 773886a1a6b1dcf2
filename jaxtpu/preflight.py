"""`python -m jaxtpu.preflight`: how much memory a training run needs per device on a target
(this machine's devices, or a TPU slice this machine does not have), before you rent it.

It builds the run's real train and eval steps from the training flags (model, task, batch,
max length, precision, strategy, --sharding, --mesh, --remat), compiles them ahead of time
for the target without running them or allocating a weight, and reads the compiler's own
accounting (`memory_analysis`, `cost_analysis`) of the compiled executables. For a TPU target
it also reports the TPU compiler's cost-model estimate of the step time (`estimate`), with the
examples/s, tokens/s and model-FLOPs utilisation bound that implies: an estimate, not a
measurement.

TPU targets compile on a CPU-only host: PyPI's `libtpu` (installed by the project) compiles
for a TPU topology through `jax.experimental.topologies.get_topology_desc`; the numbers are the
TPU compiler's, for the same program that would run there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jaxtpu.core import files
from jaxtpu.core.errors import ConfigError, DeviceError
from jaxtpu.core.flags.cli import parse_with
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import REMATS, Config
from jaxtpu.core.hardware import TPU_CHIPS, GiB, TpuChip
from jaxtpu.core.run.rundir import check_output_path, user_errors
from jaxtpu.core.schedules import Horizon


@dataclass(frozen=True)
class Target:
    """A TPU slice JAX can compile for without having it: a topology of one generation's
    chips (`hardware.TPU_CHIPS`) and the devices its compiler sees."""

    topology: str  # jax.experimental.topologies name: "<version>:<chips grid>"
    chip: TpuChip
    devices: int  # what get_topology_desc gives (v4 here: one per TensorCore)
    note: str = ""

    @property
    def chips(self) -> int:
        return math.prod(int(x) for x in self.topology.split(":")[1].split("x"))

    def memory_per_device(self) -> int:
        """HBM bytes of one of the topology's devices."""
        return int(self.chip.per_device(self.chips, self.devices)[0])

    def peak_flops_per_device(self) -> float:
        """The bf16 peak FLOP/s of one of the topology's devices."""
        return self.chip.per_device(self.chips, self.devices)[1]

    def bandwidth_per_device(self) -> float:
        """The HBM bytes/s of one of the topology's devices."""
        return self.chip.per_device(self.chips, self.devices)[2]


TPU_TARGETS: dict[str, Target] = {
    "v2-8": Target("v2:2x2", TPU_CHIPS["v2"], 8),
    "v3-8": Target("v3:2x2", TPU_CHIPS["v3"], 8),
    "v4-8": Target("v4:2x2x1", TPU_CHIPS["v4"], 8, "compiled per TensorCore"),
    "v5e-8": Target("v5e:2x4", TPU_CHIPS["v5e"], 8),
    "v6e-8": Target("v6e:2x4", TPU_CHIPS["v6e"], 8),
}


def targets_table() -> str:
    """The TPU targets as the docs' markdown table, from `TPU_TARGETS` and the chip table."""
    rows = [
        "| target | topology | HBM per chip | devices | per device | bf16 peak per chip | "
        "HBM bandwidth per chip | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in TPU_TARGETS.items():
        devices = f"{t.devices} ({t.note})" if t.note else str(t.devices)
        rows.append(
            f"| `{name}` | `{t.topology}` | {t.chip.hbm_gib:g} GiB | {devices} | "
            f"{t.memory_per_device() / GiB:g} GiB | {t.chip.bf16_tflops:g} TFLOP/s | "
            f"{t.chip.hbm_gbps:,g} GB/s | {t.chip.source} |"
        )
    return "\n".join(rows)


TARGETS = ("cpu", *TPU_TARGETS)
# `--sweep`: every way jaxtpu can place the state, with and without rematerialisation.
SWEEP = [(s, r) for s in ("replicated", "zero1", "fsdp") for r in REMATS]


@dataclass
class Report:
    """One compiled configuration's per-device figures (bytes unless named otherwise)."""

    target: str
    sharding: str
    remat: str
    mesh: str
    batch_size: int
    max_len: int
    scan: bool = False
    device: str = ""  # the compiled-for device kind, e.g. "TPU v3"
    params: int = 0
    optimizer: int = 0
    batch: int = 0
    temporary: int = 0  # activations and other scratch of the train step
    total: int = 0  # the train step's peak: arguments + outputs - donated + temporary
    eval_total: int = 0
    capacity: int = 0  # the target's memory per device
    fits: bool = False
    flops_per_step: float = 0.0
    # The TPU compiler's cost model (an estimate, never a measurement): its step time and bytes
    # accessed per device, of the unrolled program (`estimate`); 0 where there is none.
    est_step_s: float = 0.0
    est_bytes_per_step: float = 0.0
    model_flops: float = 0.0  # per device per step: 6 x matmul params x tokens + attention
    remat_flops: float = 0.0  # what rematerialisation recomputes on top, apart
    peak_flops: float = 0.0  # the target's bf16 peak per device
    global_batch: int = 0
    compile_s: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def target_devices(target: str, n: int) -> tuple[list[Any], int]:
    """(devices to compile for, memory per device in bytes)."""
    import jax

    if target == "cpu":
        from jaxtpu import hosts

        devices = hosts.init_devices(n)
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return devices, host // len(devices)  # the host's RAM, shared by its virtual devices
    if target not in TPU_TARGETS:
        raise ConfigError(f"--target {target}: unknown; choose one of {', '.join(TARGETS)}")
    tpu = TPU_TARGETS[target]
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=tpu.topology)
    except Exception as e:  # libtpu missing, or a topology this libtpu does not know
        raise DeviceError(
            f"--target {target}: cannot compile for TPU topology {tpu.topology} here "
            f"({str(e).splitlines()[0][:160]}); is libtpu installed (pip install "
            f"'jax[tpu]=={jax.__version__}')?"
        ) from None
    devices = list(topo.devices)
    if len(devices) != tpu.devices:
        raise DeviceError(
            f"--target {target}: this libtpu compiles {tpu.topology} for {len(devices)} "
            f"devices, not the {tpu.devices} jaxtpu knows it by"
        )
    if len(devices) != n:
        raise ConfigError(
            f"--target {target} has {len(devices)} devices; use --num-devices {len(devices)}"
        )
    return devices, tpu.memory_per_device()


def _platform(devices: list[Any]) -> str:
    """The platform the run's defaults are tuned for ('tpu' for a TPU target)."""
    return devices[0].platform if devices else ""


def _bytes_per_device(tree: Any, shardings: Any) -> int:
    import jax
    import numpy as np

    sizes = jax.tree_util.tree_map(
        lambda x, s: math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize,
        tree,
        shardings,
    )
    return int(sum(jax.tree_util.tree_leaves(sizes)))


@dataclass
class Lowered:
    """The run's train and eval steps lowered for a device set, with what they take."""

    train: Any
    eval: Any
    state: Any  # abstract (shapes and dtypes)
    shardings: Any
    batches: Any  # the abstract K stacked batches of one train call


_ANY_HORIZON = Horizon(1000, 1000)  # memory and FLOPs do not depend on the schedule's length


def abstract_run(
    cfg: Config, devices: list[Any], spec: RunSpec, horizon: Horizon = _ANY_HORIZON
) -> tuple[Any, Any, Any, Any]:
    """(strategy, abstract state placed by its shardings, their shardings, abstract rng) of
    the run on `devices`: shapes only, no weight created. `horizon` (the schedule's length)
    changes no shape, only the schedule's constants in the program."""
    import jax

    from jaxtpu import optim, parallel, steps
    from jaxtpu.models import encoder as models
    from jaxtpu.placement import Placement

    module = models.for_run(cfg, spec)
    params = models.abstract_params(module, spec.task.example_shape(cfg.data.max_len))
    tx = optim.make_optimizer(cfg.optim, horizon, len(devices))
    state = jax.eval_shape(
        lambda p: steps.TrainState.create(apply_fn=module.apply, params=p, tx=tx), params
    )
    placement = Placement(spec.sharding, *spec.mesh)
    fns = steps.for_task(cfg.train.task, cfg.train.margin)
    strategy = parallel.make_strategy(cfg.placement.parallel, devices, fns, placement)
    shardings = strategy.state_sharding(state)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=strategy.replicated)
    abstract_state = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )
    return strategy, abstract_state, shardings, rng


def lower(cfg: Config, devices: list[Any], spec: RunSpec | None = None) -> Lowered:
    """Traces and lowers the run's train call (K = --steps-per-call batches) and eval step for
    `devices` on abstract inputs: no weight is created, nothing runs."""
    import jax

    spec = spec or RunSpec.resolve(cfg, len(devices), _platform(devices))
    strategy, abstract_state, shardings, rng = abstract_run(cfg, devices, spec)
    train, evaluate = strategy.jitted(shardings)
    rows = cfg.train.batch_size * len(devices)

    def batch(lead: tuple[int, ...], sharding: Any) -> dict[str, Any]:
        """The task's batch (`Task.batch_layout`) of the global rows, as shapes only."""
        layout = spec.task.batch_layout(cfg.data.max_len)
        return {
            k: jax.ShapeDtypeStruct((*lead, rows, *shape), dtype, sharding=sharding)
            for k, (shape, dtype) in layout.items()
        }

    batches = batch((cfg.placement.steps_per_call,), strategy.steps_sharding)
    return Lowered(
        train.lower(abstract_state, batches, rng),
        evaluate.lower(abstract_state, batch((), strategy.batch_sharding)),
        abstract_state,
        shardings,
        batches,
    )


def save_programs(cfg: Config, target: str, devices: list[Any], directory: Path) -> list[Path]:
    """Compiles every program a run with `cfg` uses on `devices` (a train call of each length
    its buckets use, an evaluation batch of each length of its validation set), reading the
    data as the run does (their size sets the schedule's length, a constant of the train
    program), and writes them to `directory` (`jaxtpu.programs`) for `train --programs`."""
    from jaxtpu import programs
    from jaxtpu.backend import stack_steps
    from jaxtpu.core.run import plan

    n = len(devices)
    spec = RunSpec.resolve(cfg, n, _platform(devices))
    job = plan.Job.load(cfg, spec, directory, n, primary=False, started=time.time())
    strategy, state, _, rng = abstract_run(cfg, devices, spec, job.plan.horizon)
    strategy.build(state)
    calls, evals = plan.program_inputs(job, lambda rows: slice(0, rows))
    stacked = [stack_steps(c, cfg.placement.steps_per_call) for c in calls]
    t0 = time.perf_counter()
    with _no_compilation_cache():
        built = strategy.precompile(state, rng, stacked, evals)
    print(
        f"  compiled {built} programs ({len(calls)} train call lengths, {len(evals)} eval "
        f"lengths) in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return programs.save(directory, strategy.programs(), devices, cfg.to_dict())


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
    with _no_cache_writes(devices[0].platform != "cpu"):
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
    on a TPU target, the compiler's estimated step time: one more compilation, `estimate`)."""
    import jax

    spec = RunSpec.resolve(cfg, len(devices), _platform(devices))
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
    try:
        with _no_cache_writes(target != "cpu"):
            compiled, compiled_eval = low.train.compile(), low.eval.compile()
    except Exception as e:  # the TPU compiler refuses a program that cannot fit
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text and "memory" not in text.lower():
            raise
        report.compile_s = round(time.perf_counter() - t0, 1)
        report.error = text.splitlines()[0][:300]
        return report
    report.compile_s = round(time.perf_counter() - t0, 1)
    mem, eval_mem = compiled.memory_analysis(), compiled_eval.memory_analysis()
    report.params = _bytes_per_device(low.state.params, low.shardings.params)
    report.optimizer = _bytes_per_device(low.state.opt_state, low.shardings.opt_state)
    report.batch = _bytes_per_device(
        low.batches, jax.tree_util.tree_map(lambda x: x.sharding, low.batches)
    )
    report.temporary = int(mem.temp_size_in_bytes)
    report.total = _peak(mem)
    report.eval_total = _peak(eval_mem)
    report.fits = max(report.total, report.eval_total) <= capacity
    if flops:
        report.flops_per_step = flops_per_step(cfg, devices)
        if speed:
            _add_estimate(report, cfg, target, devices, spec)
    return report


def _add_estimate(
    report: Report, cfg: Config, target: str, devices: list[Any], spec: RunSpec
) -> None:
    """The compiler's estimated step time (TPU targets) and the model FLOPs beside it."""
    report.global_batch = cfg.train.batch_size * len(devices)
    report.model_flops, report.remat_flops = spec.encoder.train_flops(
        cfg.train.batch_size * spec.task.comments_per_example, cfg.data.max_len, cfg.model.remat
    )
    if target in TPU_TARGETS:
        report.peak_flops = TPU_TARGETS[target].peak_flops_per_device()
        seconds, bytes_accessed = estimate(cfg, devices)
        if seconds > 0:
            report.est_step_s, report.est_bytes_per_step = seconds, bytes_accessed
        else:  # none (v4, v6e) or negative (v5e) from libtpu 0.0.42.1's cost model
            report.extra["no_estimate"] = f"optimal_seconds {seconds:.4g}"


@contextmanager
def _no_cache_writes(active: bool) -> Iterator[None]:
    """No entries in JAX's persistent compilation cache (when one is set up): an executable
    compiled for a TPU topology without its devices cannot be loaded back from it."""
    import jax

    if not active:
        yield
        return
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


@contextmanager
def _no_compilation_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off, reads too: an executable read back from it
    serializes without its code on XLA:CPU (loading it then fails with 'Function ... not
    found'), so programs to save are compiled afresh."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once per process whether to use it
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


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
) -> Report:
    """The largest per-device batch whose train and eval steps fit, to within `tolerance` of
    itself (0 = exact): from --batch-size, doubling while it fits (halving while it does not),
    then bisection of the last bracket. Memory does not always grow strictly with the batch
    (the TPU compiler's schedule changes), so the answer is the largest batch seen to fit on
    that path. One compilation per batch tried; returns the report of the batch found (or of
    the smallest tried, not fitting, when nothing fits)."""
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
    if not best.error:
        chosen = cfg.replace(batch_size=best.batch_size)
        best.flops_per_step = flops_per_step(chosen, devices)
        spec = RunSpec.resolve(chosen, len(devices), _platform(devices))
        _add_estimate(best, chosen, target, devices, spec)
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


def _gib(x: float) -> str:
    """Bytes in GiB, or MiB below 1 GiB (tiny models are all zeros in GiB)."""
    return f"{x / GiB:.2f} GiB" if x >= GiB else f"{x / 2**20:.1f} MiB"


COLUMNS = [
    ("sharding", lambda r: r.sharding),
    ("remat", lambda r: r.remat),
    ("scan", lambda r: "yes" if r.scan else "no"),
    ("mesh", lambda r: r.mesh),
    ("batch/dev", lambda r: str(r.batch_size)),
    ("params", lambda r: _gib(r.params) if not r.error else "-"),
    ("optimizer", lambda r: _gib(r.optimizer) if not r.error else "-"),
    ("temporary", lambda r: _gib(r.temporary) if not r.error else "-"),
    ("train step", lambda r: _gib(r.total) if not r.error else "refused"),
    ("eval step", lambda r: _gib(r.eval_total) if not r.error else "-"),
    ("target", lambda r: _gib(r.capacity)),
    ("fits", lambda r: "yes" if r.fits else "NO"),
    ("GFLOP/step/device", lambda r: f"{r.flops_per_step / 1e9:.1f}" if not r.error else "-"),
    ("est. step s*", lambda r: f"{r.est_step_s:.4f}" if r.est_step_s else "-"),
    (
        "est. examples/s*",
        lambda r: f"{r.global_batch / r.est_step_s:,.0f}" if r.est_step_s else "-",
    ),
    (
        "est. tokens/s*",
        lambda r: f"{r.global_batch * r.max_len / r.est_step_s:,.0f}" if r.est_step_s else "-",
    ),
    (
        "est. GB/step/device*",
        lambda r: f"{r.est_bytes_per_step / 1e9:.2f}" if r.est_step_s else "-",
    ),
    (
        "model GFLOP/step/device (+remat)",
        lambda r: (
            f"{r.model_flops / 1e9:.1f}"
            + (f" (+{r.remat_flops / 1e9:.1f})" if r.remat_flops else "")
            if r.model_flops
            else "-"
        ),
    ),
    (
        "MFU bound*",
        lambda r: (
            f"{r.model_flops / (r.est_step_s * r.peak_flops):.0%}"
            if r.est_step_s and r.peak_flops
            else "-"
        ),
    ),
    ("compile s", lambda r: f"{r.compile_s:.1f}"),
]
ESTIMATE_NOTE = (
    "* the TPU compiler's cost model (its `optimal_seconds` for the unrolled train step), an "
    "estimate, not a measurement; tokens at --max-len; MFU bound = model FLOPs (6 x matmul "
    "params x tokens + attention, remat's recomputation apart) / (estimated step x the "
    "target's bf16 peak)"
)


def _largest(r: Report) -> str:
    largest = r.extra.get("largest_batch", 0)
    return str(largest) if largest else f"none (batch {r.batch_size} refused)"


def table(reports: list[Report], find: bool) -> str:
    """A Markdown table: one row per configuration (its largest batch with --find-batch)."""
    cols = list(COLUMNS)
    if find:
        cols.insert(3, ("largest batch/dev", _largest))
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f(r) for _, f in cols) + " |" for r in reports]
    if any(r.est_step_s for r in reports):
        lines += ["", ESTIMATE_NOTE]
    return "\n".join(lines)


def _say(report: Report) -> None:
    what = (
        f"{report.target} {report.sharding} remat={report.remat}{' scan' if report.scan else ''} "
        f"{report.mesh} "
        f"batch/dev {report.batch_size}"
    )
    if report.error:
        print(f"  {what}: refused by the compiler ({report.error[:120]})", file=sys.stderr)
        return
    speed = ""
    if "no_estimate" in report.extra:
        speed = (
            "; the TPU compiler's cost model gave no usable step-time estimate "
            f"({report.extra['no_estimate']})"
        )
    if report.est_step_s:
        speed = (
            f"; estimated by the TPU compiler (not measured): {report.est_step_s:.4f} s/step, "
            f"{report.global_batch / report.est_step_s:,.0f} examples/s"
        )
    print(
        f"  {what}: train {_gib(report.total)}, eval {_gib(report.eval_total)} of "
        f"{_gib(report.capacity)}: {'fits' if report.fits else 'does NOT fit'} "
        f"(compiled in {report.compile_s:.1f} s){speed}",
        file=sys.stderr,
        flush=True,
    )


def _add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("preflight")
    g.add_argument(
        "--target",
        default="cpu",
        choices=TARGETS,
        help="Where the run would train: cpu (this machine's --num-devices devices; capacity = "
        "host RAM / devices) or a TPU slice, compiled here by libtpu: "
        + ", ".join(
            f"{k} ({v.topology}, {v.chip.hbm_gib:g} GiB/chip)" for k, v in TPU_TARGETS.items()
        )
        + " [default: cpu]",
    )
    g.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        default=None,
        metavar="LIST",
        help="Compile every memory option (--sharding replicated/zero1/fsdp x --remat "
        "none/layer/dots) instead of only the flags' own, or those listed, e.g. "
        "replicated,zero1,fsdp,fsdp+layer.",
    )
    g.add_argument(
        "--find-batch",
        action="store_true",
        help="For each configuration, find the largest --batch-size (per device) whose train "
        "and eval steps fit the target, to within 1/8 (doubling or halving from --batch-size, "
        "then bisection; one compilation per batch tried).",
    )
    g.add_argument(
        "--save-programs",
        default=None,
        metavar="DIR",
        help="Also compile every program the run uses (a train call of each length its "
        "buckets use, an eval batch of each validation length; the data are read as the run "
        "reads them) for --target and save them in DIR, for python -m jaxtpu.train "
        "--programs DIR on the target's machine (the same flags, jax, libtpu and XLA flags), "
        "which then compiles nothing. Not with --sweep or --find-batch.",
    )
    g.add_argument(
        "--json",
        default=None,
        help="Where to write the reports as JSON [default: runs/preflight/<target>.json].",
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_with(
        argv,
        prog="python -m jaxtpu.preflight",
        description="Compile a training run's train and eval steps for a target (this CPU or a "
        "TPU slice) without running them, and print the memory each device needs, whether it "
        "fits, FLOPs per step and compile time. Takes every training flag of jaxtpu.train.",
        strategies=("jit", "shard_map"),
        add_flags=_add_flags,
    )
    with user_errors():
        if cfg.placement.num_processes > 1:
            raise ConfigError("--num-processes: preflight compiles for one host's devices")
        out = Path(args.json or f"runs/preflight/{args.target}.json")
        check_output_path(out, "--json")  # before the first compilation, not after the last
        if args.save_programs:
            _check_programs_dir(Path(args.save_programs), args)
        devices, capacity = target_devices(args.target, cfg.placement.num_devices)
        configs = options(cfg, args.sweep)
        for c in configs:  # every configuration is valid before any compiles
            RunSpec.resolve(c, len(devices), _platform(devices))
        print(
            f"preflight: {len(configs)} configuration(s) for {args.target} "
            f"({len(devices)} x {devices[0].device_kind}, {_gib(capacity)} each), "
            f"{cfg.train.task}, {cfg.train.precision}, max_len {cfg.data.max_len}, model "
            f"{cfg.model.model_dir or 'random init'}",
            file=sys.stderr,
            flush=True,
        )
        reports: list[Report] = []
        for c in configs:
            if args.find_batch:
                reports.append(find_batch(c, args.target, devices, capacity, _say))
            else:
                reports.append(check(c, args.target, devices, capacity))
                _say(reports[-1])
            # after every configuration: a long sweep stopped midway keeps what it measured
            _write_json(
                out,
                {
                    "target": args.target,
                    "config": cfg.to_dict(),
                    "reports": [asdict(r) for r in reports],
                },
            )
        print(table(reports, args.find_batch))
        print(f"preflight: wrote {out}", file=sys.stderr)
        if args.save_programs:
            if reports[0].error or not reports[0].fits:
                raise ConfigError(
                    f"--save-programs {args.save_programs}: the run does not fit "
                    f"{args.target}; nothing saved (see the table)"
                )
            saved = save_programs(cfg, args.target, devices, Path(args.save_programs))
            print(
                f"preflight: saved {len(saved) - 1} programs in {args.save_programs}; train "
                f"with the same flags and --programs {args.save_programs}",
                file=sys.stderr,
            )
    return 0


def _check_programs_dir(directory: Path, args: argparse.Namespace) -> None:
    """--save-programs goes with one configuration, into a new directory or one it wrote."""
    from jaxtpu.programs import MANIFEST

    if args.sweep is not None or args.find_batch:
        raise ConfigError(
            f"--save-programs {directory}: saves one run's programs; leave out "
            f"{'--sweep' if args.sweep is not None else '--find-batch'}"
        )
    if directory.exists() and (
        not directory.is_dir() or (any(directory.iterdir()) and not (directory / MANIFEST).exists())
    ):
        raise ConfigError(
            f"--save-programs {directory}: exists and holds no saved programs; give a new directory"
        )


def _write_json(path: Path, record: dict[str, Any]) -> None:
    """Replaces `path` atomically: a killed run never leaves half a file."""
    files.write_text(path, json.dumps(record, indent=2))


if __name__ == "__main__":
    sys.exit(main())
