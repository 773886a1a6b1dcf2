"""`python -m torchxla_ref.train`: the PyTorch/XLA reference trainer.

Same flags, data and batches, metrics, loop and run directory layout as `jaxtpu.train`, all
from the framework-free `jaxtpu.core` (this side never imports JAX); only the framework calls
differ. `--parallel spmd` (default here), `spawn` or `eager`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import loop
from jaxtpu.core.cli import parse_args
from jaxtpu.core.config import (
    TORCH_STRATEGIES,
    Config,
    describe_model,
    encoder_config,
    jax_only_options,
    pooling_for,
    require_strategy,
    weights_source,
)
from jaxtpu.core.errors import UserError
from jaxtpu.core.rundir import RunLog, claim_workdir, exit_code, user_errors
from torchxla_ref import parallel
from torchxla_ref.checkpoint import Checkpoints

log = logging.getLogger("jaxtpu")


class XlaBackend:
    """The torch_xla side of the shared loop (or, with `xla=False`, plain eager PyTorch on the
    host CPU: the baseline a CPU user would otherwise run, `--parallel eager`)."""

    name = "torchxla_ref"

    def __init__(
        self,
        strategy: Any,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        cfg: Config,
        workdir: Path,
        xla: bool = True,
    ) -> None:
        self.xla = xla
        self.device_type = "xla" if xla else "cpu"
        if xla:
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met

            self.torch_xla, self.xm, self.met = torch_xla, xm, met
        self.strategy = strategy
        self.num_devices = strategy.num_devices
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.cfg = cfg
        self.micro = 0
        self.primary = strategy.ordinal == 0
        self.ckpts = Checkpoints(workdir, self.primary, self.xm if xla else None)
        self._compiles_at_start = self._compiles()

    # One host process drives the loop; spawn replicas take their slice in `strategy.put`.
    num_processes = 1

    def local_rows(self, n: int) -> slice:
        return slice(None)

    def any_process(self, flag: bool) -> bool:
        return flag

    def _sync(self) -> None:
        if self.xla:
            self.torch_xla.sync()

    def _compiles(self) -> int:
        if not self.xla:
            return 0
        data = self.met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def compile_count(self) -> int:
        """Graphs compiled since the backend was built (train steps, accumulation micro-steps,
        evaluation), read from torch_xla's own metrics."""
        return self._compiles() - self._compiles_at_start

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Host batches as they are: each step moves its own batch to the device."""
        return batches

    def precompile(self, calls: list[Any], evals: list[Any]) -> int:
        """torch_xla traces and compiles each graph on its first run: nothing to do before."""
        return 0

    def train_steps(self, batches: list[dict[str, np.ndarray]]) -> list[Any]:
        """Each batch is its own traced step (graph boundary at every step)."""
        return [self.train_step(b) for b in batches]

    def train_step(self, batch: dict[str, np.ndarray]) -> Any:
        from torchxla_ref import steps

        self.model.train()
        self.micro += 1
        acc = self.cfg.optim.accumulate
        loss, grad_norm = steps.train_step(
            self.model,
            self.optimizer,
            self.scheduler,
            self.strategy.put(batch),
            task=self.cfg.run.task,
            precision=self.cfg.run.precision,
            device_type=self.device_type,
            accumulate=acc,
            update=self.micro % acc == 0,
            clip_norm=self.cfg.optim.clip_norm,
            reduce_gradients=self.xm.reduce_gradients if self.strategy.replicas > 1 else None,
        )
        if self.strategy.replicas > 1:  # each replica's loss is of its slice: average them
            loss = self.xm.all_reduce(self.xm.REDUCE_SUM, loss, scale=1.0 / self.strategy.replicas)
        self._sync()  # the step boundary: the traced graph is compiled once, then reused
        return loss, grad_norm

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []

        def collect(items: list[Any]) -> None:  # runs after the barrier, on device data
            for loss, norm in items:
                out.append(
                    {"loss": loss.item(), "grad_norm": None if norm is None else norm.item()}
                )

        if not self.xla:
            collect(handles)
            return out
        self.xm.add_step_closure(collect, args=(handles,))
        self.torch_xla.sync()
        return out

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from torchxla_ref import steps

        self.model.eval()
        scores, losses = steps.eval_step(
            self.model,
            self.strategy.put(batch),
            self.cfg.run.task,
            self.cfg.run.precision,
            self.device_type,
        )
        self._sync()
        return {"score": self.strategy.gather(scores), "loss": self.strategy.gather(losses)}

    def _payload(self, meta: dict[str, Any], full: bool) -> dict[str, Any]:
        payload = {"model": self.model.state_dict(), "meta": meta}
        if full:
            payload["optimizer"] = self.optimizer.state_dict()
            payload["scheduler"] = self.scheduler.state_dict()
            payload["micro"] = self.micro
        return payload

    def save_latest(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save("latest", step, self._payload(meta, full=True))

    def save_best(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save("best", step, self._payload(meta, full=False))

    def restore_latest(self, expect: dict[str, Any]) -> loop.ResumeState:
        """Continues from the latest checkpoint (a fresh start when there is none)."""
        payload = self.ckpts.restore_latest(expect)
        if payload is None:
            return loop.ResumeState()
        self.model.load_state_dict(payload["model"], strict=True)
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.micro = payload["micro"]
        log.info("resumed from %s at step %d", self.ckpts.latest_path(), payload["meta"]["step"])
        return loop.ResumeState(int(payload["meta"]["step"]), payload["meta"]["best"])


def _train(cfg: Config, workdir: Path, t_start: float) -> dict[str, Any]:
    """The body of a run, in the process (spmd, eager) or in each replica (spawn)."""
    from torchxla_ref import optim, weights

    run = cfg.run
    strategy = parallel.make_strategy(run.parallel, run.num_devices)
    n_dev = strategy.num_devices
    if strategy.ordinal == 0:
        log.info("devices: %d x %s (torch_xla %s)", n_dev, strategy.device, run.parallel)
    job = loop.Job.prepare(cfg, workdir, n_dev, strategy.ordinal == 0, t_start)

    enc = encoder_config(cfg)
    source = weights_source(cfg)
    pooling, outputs = pooling_for(cfg, enc), cfg.task.outputs
    model = weights.load_model(enc, cfg.head_dropout, source, run.seed, pooling, outputs)
    model = model.to(strategy.device)
    optimizer, scheduler = optim.make_optimizer(model, cfg.optim, job.plan.total_updates, n_dev)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s", describe_model(cfg, enc, n_params))
    backend = XlaBackend(
        strategy, model, optimizer, scheduler, cfg, workdir, xla=run.parallel != "eager"
    )
    resume = backend.restore_latest(job.identity) if run.resume else loop.ResumeState()
    runlog = RunLog(
        workdir, resume_step=resume.step if run.resume else None, enabled=strategy.ordinal == 0
    )
    runlog.write_config(cfg, job.data.info, [str(strategy.device)] * n_dev)
    return loop.run(job, backend, resume, runlog)


def _spawn_replica(index: int, cfg: Config, workdir: Path, t_start: float) -> None:
    from jaxtpu.core.rundir import setup_logging

    setup_logging()
    if index != 0:
        logging.getLogger("jaxtpu").setLevel(logging.WARNING)
    _train(cfg, workdir, t_start)


def train_and_evaluate(cfg: Config, workdir: str | Path | None = None) -> dict[str, Any] | None:
    """Trains and evaluates the torch_xla reference as `cfg` says; see `jaxtpu.train`.

    Returns:
      The run summary (spmd), or None for spawn (read `summary.json` in the run directory).
    """
    require_strategy(cfg, TORCH_STRATEGIES, "torchxla_ref")
    if cfg.run.num_processes > 1 or cfg.run.coordinator_address:
        raise UserError(
            "--coordinator-address/--num-processes: multi-host runs are jaxtpu only; the "
            "torch_xla reference runs on one host"
        )
    if jax_only_options(cfg):
        raise UserError(
            f"{', '.join(jax_only_options(cfg))}: jaxtpu-only memory options; the torch_xla "
            "reference replicates its model on every device"
        )
    t_start = time.time()
    if cfg.run.parallel == "eager" and cfg.run.num_devices != 1:
        raise UserError("--parallel eager runs on the host CPU: use --num-devices 1")
    if cfg.run.parallel != "eager":
        parallel.configure_runtime(cfg.run.num_devices, cfg.run.parallel)
    with claim_workdir(Path(workdir or cfg.run.workdir), cfg) as workdir:
        if cfg.run.parallel != "spawn":
            return _train(cfg, workdir, t_start)
        import torch_xla.distributed.xla_multiprocessing as xmp

        xmp.spawn(_spawn_replica, args=(cfg, workdir, t_start), nprocs=None)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(
        argv,
        prog="python -m torchxla_ref.train",
        description="PyTorch/XLA reference trainer: same flags, data, metrics and run "
        "directory as jaxtpu.train (--parallel spmd|spawn|eager).",
        strategies=TORCH_STRATEGIES,
    )
    with user_errors():
        summary = train_and_evaluate(cfg)
    return exit_code(summary, "torchxla_ref.train")


if __name__ == "__main__":
    sys.exit(main())
