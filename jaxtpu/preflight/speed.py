"""Speed before the TPU or GPU, estimated, never measured: the model's FLOPs per step as XLA
counts them; the step time of the train step compiled for a TPU target (`estimate`) by two
methods, the TPU compiler's own cost model and jaxtpu's roofline of the compiled program
(`jaxtpu.preflight.roofline`); for a GPU target the FLOP floor at the GPU's published peak
(`FLOOR`, a lower bound); and from the step time and the data, an epoch's and the run's time,
checked against Kaggle's TPU session limits (`add_epoch`).

Which method a report uses (`Report.est_method`): the compiler's cost model where it is
usable (v2 and v3, `TpuChip.cost_model`, and only when it gives a positive time), the roofline
everywhere else (v4, v5e, v5p, v6e: their cost model gives real models negative times off a
TPU). Both are in the JSON of every TPU report; docs/tpu.md compares them on v3."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxtpu.core.data import taskdata
from jaxtpu.core.data.tokens import load_tokenizer
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.run.plan import Plan
from jaxtpu.preflight import roofline
from jaxtpu.preflight.lowering import lower
from jaxtpu.preflight.memo import Facts, compile_facts
from jaxtpu.preflight.report import COMPILER, FLOOR, ROOFLINE, Report
from jaxtpu.preflight.targets import GPU_TARGETS, TPU_TARGETS, GpuTarget, Target


def unrolled(cfg: Config) -> Config:
    """The run's train step as XLA's counts and the TPU cost model see it whole: layers not
    scanned, one step per call (both count a loop's body once, not once per iteration)."""
    return cfg.replace(
        scan_layers=False, steps_per_call=1, log_every=1, eval_every=0, checkpoint_every=0
    )


def is_unrolled(cfg: Config) -> bool:
    """The run's own train program is the unrolled one (`unrolled` changes no other part of
    the program): its compilation can be read as it is."""
    return not cfg.model.scan_layers and cfg.placement.steps_per_call == 1


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


def compile_unrolled(cfg: Config, devices: list[Any]) -> Facts:
    """What `estimate` reads of the run's train step (`unrolled`) compiled for `devices`."""
    return compile_facts(lower(unrolled(cfg), devices).train, devices, text=True)


@dataclass(frozen=True)
class StepEstimate:
    """One train step per device of the program compiled for a target, estimated two ways
    (never measured)."""

    compiler_s: float  # the TPU compiler's cost model, `optimal_seconds` (<= 0: none)
    compiler_bytes: float  # its `bytes accessed`
    roofline_s: float  # `jaxtpu.preflight.roofline` of the same program at the target's rates
    roofline_bytes: float  # the HBM bytes the roofline counts
    roofline_flops: float  # the matmul FLOPs it counts
    # the same with on-chip (VMEM) arrays at the HBM rate: the upper end of the roofline's
    # bracket, equal to `roofline_s` for a program that stages nothing on the chip (v2, v3)
    roofline_high_s: float = 0.0
    roofline_high_bytes: float = 0.0
    unknown_trips: int = 0  # loops the roofline counted once, their trip count unread


def estimate(
    cfg: Config, devices: list[Any], target: Target, compiled: Facts | None = None
) -> StepEstimate:
    """Both estimates of the run's train step compiled for `devices` (`compiled`, when the
    caller has the unrolled program), unrolled: the cost model counts a loop's body once, so
    scanned layers and K steps per call would be undercounted (the roofline reads loops, but
    counts a scanned program's in-place layer updates whole)."""
    key = f"{devices[0].device_kind}|{len(devices)}|{target.topology}|{unrolled(cfg).to_json()}"
    if key not in _ESTIMATES:
        if compiled is None:
            compiled = compile_unrolled(cfg, devices)
        cost, text = compiled.cost, compiled.text
        rates = target.peak_flops_per_device(), target.bandwidth_per_device()
        whole = roofline.total(roofline.roofline(text, *rates))
        high = roofline.total(roofline.roofline(text, *rates, on_chip=True))
        _ESTIMATES[key] = StepEstimate(
            float(cost.get("optimal_seconds", 0.0) or 0.0),
            float(cost.get("bytes accessed", 0.0) or 0.0),
            whole.seconds,
            whole.bytes,
            whole.flops,
            high.seconds,
            high.bytes,
            whole.unknown_trips,
        )
    return _ESTIMATES[key]


_ESTIMATES: dict[str, StepEstimate] = {}


def add_estimate(
    report: Report,
    cfg: Config,
    target: str,
    devices: list[Any],
    spec: RunSpec,
    compiled: Facts | None = None,
) -> None:
    """The estimated step time (TPU targets; `compiled`: the unrolled train program when the
    caller has it) with its method, and the model FLOPs beside it."""
    report.global_batch = cfg.train.batch_size * len(devices)
    report.model_flops, report.remat_flops = spec.encoder.train_flops(
        cfg.train.batch_size * spec.task.comments_per_example, cfg.data.max_len, cfg.model.remat
    )
    if target in GPU_TARGETS:
        _add_floor(report, cfg, GPU_TARGETS[target])
        return
    if target not in TPU_TARGETS:
        return
    tpu = TPU_TARGETS[target]
    report.peak_flops = tpu.peak_flops_per_device()
    e = estimate(cfg, devices, tpu, compiled)
    report.roofline_step_s, report.compiler_step_s = e.roofline_s, e.compiler_s
    if tpu.chip.cost_model and e.compiler_s > 0:
        report.est_step_s, report.est_bytes_per_step = e.compiler_s, e.compiler_bytes
        report.est_method = COMPILER
        return
    report.est_step_s, report.est_bytes_per_step = e.roofline_s, e.roofline_bytes
    report.est_step_high_s = e.roofline_high_s
    report.est_method = ROOFLINE
    report.extra["no_compiler_estimate"] = (
        f"its optimal_seconds is {e.compiler_s:.4g}"
        if tpu.chip.cost_model
        else f"its cost model is not validated for {tpu.chip.device_kind} on a host without a "
        "TPU (it gives real models negative step times on v4, v5e and v6e; docs/tpu.md)"
    )
    if e.unknown_trips:
        report.extra["roofline_loops_counted_once"] = e.unknown_trips


def _add_floor(report: Report, cfg: Config, gpu: GpuTarget) -> None:
    """A GPU target's step estimate: its FLOP floor, XLA's FLOPs of the step per device at
    the GPU's published peak for the run's precision (a lower bound of the step: memory
    traffic, kernel launches and communication are not counted)."""
    peak = gpu.chip.peak_tflops(cfg.train.precision) * 1e12
    if not peak or not report.flops_per_step:
        return
    # not `report.peak_flops`: a model-FLOPs utilisation bound of a FLOP floor says nothing
    report.extra["peak_tflops"] = peak / 1e12
    report.est_step_s = report.flops_per_step / peak
    report.est_method = FLOOR


# Kaggle's TPU notebooks (docs/tpu.md): one v5e-8, sessions of at most 9 hours, 20 hours of
# TPU a week.
KAGGLE_TARGET = "v5e-8"
KAGGLE_SESSION_H = 9.0
KAGGLE_WEEK_H = 20.0


def add_epoch(report: Report, cfg: Config, train: Any, num_devices: int) -> None:
    """From the estimated step time and the training examples (`train`, as the run reads
    them), the estimated time of one epoch and of the run's train steps, every step at
    --max-len (an upper bound when length buckets shorten batches; compilation, evaluation
    and checkpoints apart), and on Kaggle's target whether the run fits its session limits."""

    if not report.est_step_s or report.error:
        return
    try:
        plan = Plan.make(cfg.replace(batch_size=report.batch_size), train, num_devices)
    except UserError as e:  # a batch larger than the data (--find-batch can get there)
        report.extra["no_epoch_estimate"] = str(e)
        return
    report.steps_per_epoch, report.run_steps = plan.steps_per_epoch, plan.total
    report.est_epoch_s = plan.steps_per_epoch * report.est_step_s
    report.est_run_s = plan.total * report.est_step_s
    report.est_epoch_high_s = plan.steps_per_epoch * report.est_step_high_s
    report.est_run_high_s = plan.total * report.est_step_high_s
    if report.target == KAGGLE_TARGET:
        report.extra["kaggle"] = kaggle_verdict(report.est_run_s, report.est_run_high_s)


def kaggle_verdict(run_s: float, high_s: float = 0.0) -> str:
    """Whether train steps estimated at `run_s` seconds (or between it and `high_s`) fit
    Kaggle's TPU limits: judged at the high end, the low end's verdict beside it when they
    differ."""
    verdict = _kaggle(max(run_s, high_s))
    if high_s > run_s and _kaggle(run_s).split(" (")[0] != verdict.split(" (")[0]:
        verdict += f"; at the low end of the estimate ({run_s / 3600:.1f} h) it would fit"
    return verdict


def _kaggle(run_s: float) -> str:
    hours = run_s / 3600
    if hours <= KAGGLE_SESSION_H:
        return (
            f"fits one Kaggle session ({hours:.2f} h of its {KAGGLE_SESSION_H:g} h; "
            f"{KAGGLE_WEEK_H:g} h of TPU a week)"
        )
    sessions = -(-hours // KAGGLE_SESSION_H)
    if hours <= KAGGLE_WEEK_H:
        return (
            f"does NOT fit one Kaggle session ({hours:.1f} h > {KAGGLE_SESSION_H:g} h): "
            f"{sessions:.0f} sessions with --resume, within the {KAGGLE_WEEK_H:g} h weekly quota"
        )
    return (
        f"does NOT fit Kaggle's limits: {hours:.1f} h is more than a week's "
        f"{KAGGLE_WEEK_H:g} h of TPU ({-(-hours // KAGGLE_WEEK_H):.0f} weeks)"
    )


def training_examples(cfg: Config, num_devices: int, platform: str) -> tuple[Any, str]:
    """The training examples the run would read (read and tokenized as the run does, with
    its token cache) and a line saying what they are, for `add_epoch`."""

    spec = RunSpec.resolve(cfg, num_devices, platform)
    data = taskdata.load_task_data(cfg, load_tokenizer(spec.tokenizer_dir, spec.pad_id))
    info = data.info
    return data.train, (
        f"{info['train_examples']} train {info['unit']} from {info['source']}"
        + (" [DEMO DATA]" if info["demo"] else "")
    )
