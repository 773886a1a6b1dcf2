"""`python -m torchxla_ref.train`: the PyTorch/XLA reference trainer.

Same flags (`jaxtpu.config`), same data and batches (`jaxtpu.data`), same metrics
(`jaxtpu.metrics`), same loop (`jaxtpu.loop`) and run directory layout as `jaxtpu.train`; only
the framework calls differ. `--parallel spmd` (default here) or `--parallel spawn`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jaxtpu import config as C
from jaxtpu import loop as L
from jaxtpu.run_io import RunLog, UserError, prepare_workdir, user_errors
from torchxla_ref import parallel

log = logging.getLogger("jaxtpu")
TORCH_PARALLEL = ("spmd", "spawn", "eager")


class XlaBackend:
    """The torch_xla side of the shared loop (or, with `xla=False`, plain eager PyTorch on the
    host CPU: the baseline a CPU user would otherwise run, `--parallel eager`)."""

    name = "torchxla_ref"

    def __init__(
        self,
        placement: Any,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        cfg: C.Config,
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
        self.placement = placement
        self.num_devices = placement.num_devices
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.cfg = cfg
        self.micro = 0
        self.ckpt_root = workdir / "checkpoints"
        self.is_master = placement.ordinal == 0
        self.primary = self.is_master
        self._compiles_at_start = self._compiles()

    # One host process drives the loop; spawn replicas take their slice in `placement.put`.
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
            self.placement.put(batch),
            task=self.cfg.run.task,
            precision=self.cfg.run.precision,
            device_type=self.device_type,
            accumulate=acc,
            update=self.micro % acc == 0,
            clip_norm=self.cfg.optim.clip_norm,
            reduce_gradients=self.xm.reduce_gradients if self.placement.replicas > 1 else None,
        )
        if self.placement.replicas > 1:  # each replica's loss is of its slice: average them
            loss = self.xm.all_reduce(self.xm.REDUCE_SUM, loss, scale=1.0 / self.placement.replicas)
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
            self.placement.put(batch),
            self.cfg.run.task,
            self.cfg.run.precision,
            self.device_type,
        )
        self._sync()
        return {"score": self.placement.gather(scores), "loss": self.placement.gather(losses)}

    def _save(self, kind: str, step: int, meta: dict[str, Any], full: bool) -> None:
        directory = self.ckpt_root / kind
        final = directory / f"step_{step}.pt"
        tmp = directory / f".step_{step}.pt.tmp"
        payload = {"model": self.model.state_dict(), "meta": meta}
        if full:
            payload["optimizer"] = self.optimizer.state_dict()
            payload["scheduler"] = self.scheduler.state_dict()
            payload["micro"] = self.micro
        if self.is_master:
            directory.mkdir(parents=True, exist_ok=True)
        # Every replica calls xm.save (it rendezvous); only the master writes. Write then rename:
        # a run killed mid-write leaves the previous checkpoint intact.
        if self.xla:
            self.xm.save(payload, str(tmp), master_only=True)
        else:
            torch.save(payload, str(tmp))
        if self.is_master:
            os.replace(tmp, final)
            for old in directory.glob("step_*.pt"):
                if old != final:
                    old.unlink()

    def save_latest(self, step: int, meta: dict[str, Any]) -> None:
        self._save("latest", step, meta, full=True)

    def save_best(self, step: int, meta: dict[str, Any]) -> None:
        self._save("best", step, meta, full=False)


def latest_checkpoint(workdir: Path) -> Path | None:
    found = sorted(
        (workdir / "checkpoints" / "latest").glob("step_*.pt"),
        key=lambda p: int(p.stem.split("_")[1]),
    )
    return found[-1] if found else None


def _train(cfg: C.Config, workdir: Path, t_start: float) -> dict[str, Any]:
    """The body of a run, in the process (spmd, eager) or in each replica (spawn)."""
    from jaxtpu.checkpoint import check_compatible
    from torchxla_ref import optim, weights

    run, task = cfg.run, cfg.run.task
    placements = {
        "spmd": lambda: parallel.SpmdPlacement(run.num_devices),
        "spawn": parallel.SpawnPlacement,
        "eager": parallel.HostPlacement,
    }
    placement = placements[run.parallel]()
    n_dev = placement.num_devices
    device = placement.device
    if placement.ordinal == 0:
        log.info("devices: %d x %s (torch_xla %s)", n_dev, device, run.parallel)
    data = L.load_data(cfg, workdir)
    plan = L.Plan.make(cfg, len(data.train), n_dev, data.info["unit"])
    log.info(plan.describe(cfg, n_dev))

    enc = C.encoder_config(cfg)
    model_dir = C.resolve_model_dir(cfg.model.model_dir)
    model = weights.build_model(task, enc, cfg.head_dropout, model_dir, run.seed)
    identity = {"task": task, "encoder": enc.to_hf_dict()}
    model.to(device)
    optimizer, scheduler = optim.make_optimizer(model, cfg.optim, plan.total_updates, n_dev)
    log.info(
        "model: %s, %d layers x %d hidden, %.1fM params, from %s",
        type(model).__name__,
        enc.num_hidden_layers,
        enc.hidden_size,
        sum(p.numel() for p in model.parameters()) / 1e6,
        model_dir or f"random init (seed {run.seed})",
    )
    backend = XlaBackend(
        placement, model, optimizer, scheduler, cfg, workdir, xla=run.parallel != "eager"
    )
    progress = L.Progress()
    latest = latest_checkpoint(workdir) if run.resume else None
    if latest is not None:
        try:
            state = torch.load(str(latest), map_location="cpu", weights_only=False)
        except Exception as e:
            raise UserError(f"{latest}: unreadable checkpoint ({type(e).__name__}: {e})") from None
        check_compatible(state["meta"], identity, latest)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        backend.micro = state["micro"]
        progress = L.Progress(int(state["meta"]["step"]), state["meta"]["best"])
        log.info("resumed from %s at step %d", latest, progress.step)
    runlog = RunLog(
        workdir, resume_step=progress.step if run.resume else None, enabled=placement.ordinal == 0
    )
    runlog.write_config(cfg, data.info, [str(device)] * n_dev)
    return L.run(cfg, data, plan, backend, workdir, progress, identity, runlog, t_start)


def _spawn_replica(index: int, cfg: C.Config, workdir: Path, t_start: float) -> None:
    from jaxtpu.run_io import setup_logging

    setup_logging()
    if index != 0:
        logging.getLogger("jaxtpu").setLevel(logging.WARNING)
    _train(cfg, workdir, t_start)


def train_and_evaluate(cfg: C.Config, workdir: str | Path | None = None) -> dict[str, Any] | None:
    """Trains and evaluates the torch_xla reference as `cfg` says; see `jaxtpu.train`.

    Returns:
      The run summary (spmd), or None for spawn (read `summary.json` in the run directory).
    """
    if cfg.run.parallel not in TORCH_PARALLEL:
        raise UserError(
            f"--parallel {cfg.run.parallel}: torchxla_ref runs {' or '.join(TORCH_PARALLEL)}"
        )
    if cfg.run.num_processes > 1 or cfg.run.coordinator_address:
        raise UserError(
            "--coordinator-address/--num-processes: multi-host runs are jaxtpu only; the "
            "torch_xla reference runs on one host"
        )
    t_start = time.time()
    workdir = prepare_workdir(Path(workdir or cfg.run.workdir), cfg.run.resume, cfg.run.task)
    if cfg.run.parallel == "eager":
        if cfg.run.num_devices != 1:
            raise UserError("--parallel eager runs on the host CPU: use --num-devices 1")
        return _train(cfg, workdir, t_start)
    parallel.configure_runtime(cfg.run.num_devices, cfg.run.parallel)
    if cfg.run.parallel == "spmd":
        return _train(cfg, workdir, t_start)
    import torch_xla.distributed.xla_multiprocessing as xmp

    xmp.spawn(_spawn_replica, args=(cfg, workdir, t_start), nprocs=None)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--parallel" not in argv and not any(a.startswith("--parallel=") for a in argv):
        argv = ["--parallel", "spmd", *argv]  # the torch side's default strategy
    cfg = C.parse_args(
        argv,
        prog="python -m torchxla_ref.train",
        description="PyTorch/XLA reference trainer: same flags, data, metrics and run "
        "directory as jaxtpu.train (--parallel spmd|spawn).",
    )
    with user_errors():
        train_and_evaluate(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
