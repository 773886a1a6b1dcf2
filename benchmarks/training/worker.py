"""One benchmark configuration in one process: time the training step, print one JSON line.

`python -m benchmarks.training.worker --framework jaxtpu --parallel jit --workload minilm
--precision bf16 --devices 8` builds the model and one fixed global batch (32 x 128 tokens
by default), runs the first step (compile, timed apart), one warm-up step, then timed steps
until both `--min-steps` and `--budget` seconds are reached (at most `--max-steps`), blocking
on the result of every step. `--peak` instead measures the matmul peak (a 2048^3 GEMM through
XLA on one device) in the given precision.

Frameworks and strategies: jaxtpu (pmap, jit, shard_map), torch_xla (spmd, spawn: 1 replica),
torch on the CPU without XLA (eager, compile: torch.compile), the plain-PyTorch reference rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxtpu.core import hostmem
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import JAX_STRATEGIES, PRECISIONS, REMATS, SHARDINGS, Config
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.run.rundir import peak_host_memory_mb
from jaxtpu.core.schedules import Horizon
from jaxtpu.core.tasks import get_task

WORKLOADS = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=128),
    "minilm": dict(num_layers=6, hidden_size=384, num_heads=12, intermediate_size=1536),
    "bert-base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
}
STRATEGIES = {
    "jaxtpu": JAX_STRATEGIES,
    "torch_xla": ("spmd", "spawn"),
    "torch": ("eager", "compile"),
}


def model_flops(enc: EncoderConfig, batch: int, seq: int) -> float:
    """Training FLOPs of one step, the model's count (`EncoderConfig.train_flops`)."""
    return enc.train_flops(batch, seq)[0]


def config_for(args: argparse.Namespace) -> Config:
    w = WORKLOADS[args.workload]
    return tiny().replace(
        model_dir="",
        **w,
        precision=args.precision,
        num_devices=args.devices,
        batch_size=args.batch // args.devices,
        max_len=args.seq,
        dropout=0.1,
        encoder_dropout=0.1,
        lr=5e-5,
        weight_decay=0.01,
        schedule="linear",
        parallel=args.parallel if args.framework != "torch" else "jit",
        **({"sharding": args.sharding, "remat": args.remat} if args.framework == "jaxtpu" else {}),
    )


def fixed_batch(batch: int, seq: int, vocab: int) -> dict[str, np.ndarray]:
    """One toxicity batch laid out as the task's `batch_layout`, of random ids and lengths."""
    rng = np.random.default_rng(0)
    out = get_task("toxicity").zeros((batch,), seq)
    lengths = rng.integers(seq // 2, seq + 1, batch)
    out["attention_mask"][:] = np.arange(seq)[None, :] < lengths[:, None]
    out["input_ids"][:] = rng.integers(1000, vocab, (batch, seq)) * out["attention_mask"]
    out["label"][:] = rng.integers(0, 2, batch)
    out["weight"][:] = 1.0
    out["row_weight"][:] = 1.0
    return out


def jax_backend(cfg: Config, strategy: str, devices: int, max_len: int, k: int = 1) -> Any:
    """A `JaxBackend` holding a fresh toxicity train state of `cfg`'s model (seed 0) on
    `devices` devices with `strategy`, K steps per call (shared with
    `benchmarks.training.epoch`)."""
    from jaxtpu.engine import hosts, optim, parallel, steps
    from jaxtpu.engine.backend import JaxBackend
    from jaxtpu.engine.placement import Placement
    from jaxtpu.engine.weights import load_model

    devs = hosts.init_devices(devices)
    cfg = cfg.replace(parallel=strategy, task="toxicity", max_len=max_len)  # its --sharding, --mesh
    spec = RunSpec.resolve(cfg, len(devs))
    model = load_model(cfg, spec)
    tx = optim.make_optimizer(cfg.optim, Horizon(1000, 1000), len(devs))
    state = steps.create_state(model.module.apply, model.params, tx, steps.loss_scaler(cfg.train))
    placement = Placement(spec.sharding, *spec.mesh)
    strategy_ = parallel.make_strategy(strategy, devs, steps.for_task("toxicity"), placement)
    backend = JaxBackend(strategy_, state, 0, steps_per_call=k)
    backend.start()
    return backend


def jax_step(args: argparse.Namespace, cfg: Config) -> tuple[Callable[[], Any], Callable]:
    backend = jax_backend(cfg, args.parallel, args.devices, args.seq, args.steps_per_call)
    vocab = RunSpec.resolve(cfg).encoder.vocab_size
    batches = [fixed_batch(args.batch, args.seq, vocab)] * args.steps_per_call
    return (lambda: backend.train_steps(backend.prepare(batches))), backend.fetch


def torch_xla_step(args: argparse.Namespace, cfg: Config) -> tuple[Callable, Callable]:
    from pathlib import Path

    from torchxla_ref import optim, parallel, weights
    from torchxla_ref.backend import XlaBackend

    parallel.configure_runtime(args.devices, args.parallel)
    strategy = parallel.make_strategy(args.parallel, args.devices)
    spec = RunSpec.resolve(cfg)
    enc = spec.encoder
    model = weights.load_model(spec.model_spec(cfg), None, 0).to(strategy.device)
    opt, sched = optim.make_optimizer(model, cfg.optim, Horizon(1000, 1000), args.devices)
    backend = XlaBackend(strategy, model, opt, sched, cfg, Path("/nonexistent"))
    batch = fixed_batch(args.batch, args.seq, enc.vocab_size)
    return (lambda: backend.train_step(batch)), (lambda h: backend.fetch([h]))


def torch_cpu_trainer(
    cfg: Config, compiled: bool, precision: str, device: str = "cpu"
) -> Callable[[Any], Any]:
    """Plain PyTorch on the CPU (all cores), or on `device` 'cuda' (a GPU): a fresh toxicity
    model of `cfg` (seed 0), eager or `torch.compile`d, and its train step on a batch of
    tensors on that device, under autocast (and fp16's GradScaler) as --precision says,
    returning the step's outputs (loss first). Shared with `benchmarks.training.epoch`."""
    import torch

    from torchxla_ref import optim, steps, weights

    torch.set_num_threads(os.cpu_count() or 1)
    model = weights.load_model(RunSpec.resolve(cfg).model_spec(cfg), None, 0).to(device).train()
    opt, sched = optim.make_optimizer(model, cfg.optim, Horizon(1000, 1000), 1)
    if compiled:
        model = torch.compile(model)
    scaler = steps.grad_scaler(
        precision, device, cfg.train.loss_scale, cfg.train.loss_scale_growth_interval
    )

    def step(batch: dict[str, Any]) -> Any:
        return steps.train_step(
            model,
            opt,
            sched,
            batch,
            task="toxicity",
            precision=precision,
            device_type=device,
            accumulate=1,
            update=True,
            clip_norm=cfg.optim.clip_norm,
            scaler=scaler,
        )

    return step


def torch_cpu_step(args: argparse.Namespace, cfg: Config) -> tuple[Callable, Callable]:
    import torch

    train = torch_cpu_trainer(cfg, args.parallel == "compile", args.precision, args.device)
    host = fixed_batch(args.batch, args.seq, RunSpec.resolve(cfg).encoder.vocab_size)
    batch = {k: torch.from_numpy(v).to(args.device) for k, v in host.items()}
    return (lambda: train(batch)), (lambda h: float(h[0]))  # .item(): waits for the device


def minor_page_faults() -> int:
    """This process's minor page faults so far (first touches of freshly mapped memory)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median_seconds(run: Callable[[], Any], reps: int) -> float:
    """Median wall time of `run()` (which must block on its result), after one untimed call."""
    run()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def matmul_peak(precision: str, n: int = 2048, reps: int = 10) -> float:
    """GFLOP/s of an n^3 GEMM through XLA on one device (bf16: bf16 operands, fp32 acc)."""
    import jax
    import jax.numpy as jnp

    from jaxtpu.models.encoder import COMPUTE_DTYPES

    dtype = COMPUTE_DTYPES[precision]
    a = jnp.ones((n, n), dtype)
    b = jnp.ones((n, n), dtype)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    return 2 * n**3 / median_seconds(lambda: f(a, b).block_until_ready(), reps) / 1e9


def model_gemms(args: argparse.Namespace, reps: int = 10) -> dict[str, Any]:
    """GFLOP/s of just the matmuls of one training step of the workload, with nothing else
    between them: the ceiling XLA's own kernels put on the model FLOPs utilisation.

    One device, bf16 operands with fp32 accumulation (or fp32), each distinct GEMM timed alone
    (median of `reps`): per layer the forward GEMMs (Q, K, V, output and the two feed-forward
    projections over batch x seq tokens, and the two batched attention matmuls); the backward
    pass does each one twice more with the same FLOPs (gradients of both operands), so every
    GEMM counts three times.
    """
    import jax
    import jax.numpy as jnp

    from jaxtpu.models.encoder import COMPUTE_DTYPES

    dtype = COMPUTE_DTYPES[args.precision]
    w = WORKLOADS[args.workload]
    h, f, heads = w["hidden_size"], w["intermediate_size"], w["num_heads"]
    t, b, s, d = args.batch * args.seq, args.batch, args.seq, w["hidden_size"] // w["num_heads"]
    dense = [(t, h, h)] * 4 + [(t, h, f), (t, f, h)]
    attention = [(b * heads, s, d, s), (b * heads, s, s, d)]  # (batch, m, k, n)
    distinct = [(1, *x) for x in dense] + attention
    count = 3 * w["num_layers"]  # each GEMM: forward and two gradients, in every layer
    keys = iter(jax.random.split(jax.random.key(0), 2 * len(distinct)))

    def operand(n: int, rows: int, cols: int) -> jax.Array:
        shape = (rows, cols) if n == 1 else (n, rows, cols)  # plain 2-D GEMMs for Linear
        return jax.random.normal(next(keys), shape, dtype)

    # every product is written out in the compute dtype, as the model's activations are
    gemm = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dtype))
    median = 0.0
    for n, m, k, c in distinct:  # one kernel at a time, as the step runs them
        a, bb = operand(n, m, k), operand(n, k, c)
        median += count * median_seconds(lambda a=a, b=bb: gemm(a, b).block_until_ready(), reps)
    shapes = distinct * count
    flops = sum(2.0 * n * m * k * c for n, m, k, c in shapes)
    return {
        "workload": args.workload,
        "precision": args.precision,
        "gemm_gflop": flops / 1e9,
        "gemm_s": median,
        "gemm_gflops": flops / median / 1e9,
    }


def add_huge_pages_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--huge-pages",
        choices=("auto", "on", "off"),
        default="auto",
        help="glibc malloc on transparent huge pages: auto = as the framework's own command "
        "(jaxtpu on, torch and torch_xla off); the JSON records what the row ran with",
    )


def restart_for_huge_pages(args: argparse.Namespace) -> None:
    """Under `__main__`: restart the worker with huge pages for malloc when `--huge-pages`
    asks for them (`jaxtpu.core.hostmem`)."""
    if args.huge_pages == "on" or (args.huge_pages == "auto" and args.framework == "jaxtpu"):
        hostmem.reexec_with_huge_pages()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--framework", choices=list(STRATEGIES), default="jaxtpu")
    p.add_argument(
        "--parallel",
        default="jit",
        help="the strategy: jit|pmap|shard_map (jaxtpu), spmd|spawn (torch_xla), eager|compile "
        "(torch)",
    )
    p.add_argument("--workload", choices=list(WORKLOADS), default="minilm")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="--framework torch: where plain PyTorch trains (cuda: the first GPU)",
    )
    p.add_argument("--batch", type=int, default=32, help="global batch")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--min-steps", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--budget", type=float, default=20.0, help="seconds of timed steps")
    p.add_argument(
        "--steps-per-call",
        type=int,
        default=1,
        help="jaxtpu: K steps per device call (lax.scan); reported times are per step",
    )
    p.add_argument(
        "--sharding",
        default="auto",
        choices=SHARDINGS,
        help="jaxtpu: where the state lives (jaxtpu.train --sharding)",
    )
    p.add_argument(
        "--remat",
        default="none",
        choices=REMATS,
        help="jaxtpu: rematerialise each encoder layer (jaxtpu.train --remat)",
    )
    p.add_argument("--peak", action="store_true", help="measure the matmul peak instead")
    p.add_argument(
        "--model-gemms",
        action="store_true",
        help="measure only the step's matmuls back to back (the MFU ceiling), with the peak",
    )
    add_huge_pages_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.peak:
        print(json.dumps({"peak_gflops": matmul_peak(args.precision), "precision": args.precision}))
        return 0
    if args.model_gemms:
        record = model_gemms(args)
        record["peak_gflops"] = matmul_peak(args.precision)
        record["ceiling_mfu"] = record["gemm_gflops"] / record["peak_gflops"]
        print(json.dumps(record))
        return 0
    if args.parallel not in STRATEGIES[args.framework]:
        p.error(f"--parallel for {args.framework}: one of {', '.join(STRATEGIES[args.framework])}")
    cfg = config_for(args)
    make = {"jaxtpu": jax_step, "torch_xla": torch_xla_step, "torch": torch_cpu_step}
    step, wait = make[args.framework](args, cfg)
    t = time.perf_counter()
    wait(step())
    compile_s = time.perf_counter() - t
    wait(step())  # warm-up (torch_xla compiles the optimizer-state variant on step 2)
    times: list[float] = []
    start, faults = time.perf_counter(), minor_page_faults()
    while len(times) < args.max_steps and (
        len(times) < args.min_steps or time.perf_counter() - start < args.budget
    ):
        t = time.perf_counter()
        wait(step())
        times.append((time.perf_counter() - t) / args.steps_per_call)
    faults = (minor_page_faults() - faults) / (len(times) * args.steps_per_call)
    median = float(np.median(times))
    enc = RunSpec.resolve(cfg).encoder
    record = {
        "framework": args.framework,
        "parallel": args.parallel,
        "workload": args.workload,
        "precision": args.precision,
        "devices": args.devices,
        "batch": args.batch,
        "seq": args.seq,
        "steps_per_call": args.steps_per_call,
        "compile_s": compile_s,
        "sharding": cfg.placement.sharding,
        "remat": cfg.model.remat,
        "huge_pages": hostmem.active(),
        "page_faults_per_step": faults,
        "step_s": times,
        "median_s": median,
        "p10_s": float(np.percentile(times, 10)),
        "p90_s": float(np.percentile(times, 90)),
        "samples_per_s": args.batch / median,
        "tokens_per_s": args.batch * args.seq / median,
        "model_gflop": model_flops(enc, args.batch, args.seq) / 1e9,
        "peak_host_mb": peak_host_memory_mb(),
    }
    if args.framework == "jaxtpu":
        import jax

        stats = [d.memory_stats() or {} for d in jax.local_devices()[: args.devices]]
        peaks = [s.get("peak_bytes_in_use") for s in stats if s.get("peak_bytes_in_use")]
        record["peak_device_mb"] = max(peaks) / 2**20 if peaks else None
    elif args.framework == "torch" and args.device == "cuda":
        import torch

        record["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    restart_for_huge_pages(parser().parse_args())
    sys.exit(main())
