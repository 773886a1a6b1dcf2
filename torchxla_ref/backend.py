"""`XlaBackend`: the torch_xla side of the shared loop (`jaxtpu.core.run.protocol.Backend`): the
model, optimizer and schedule on the strategy's devices, and the run's checkpoints.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.flags.schema import Config
from jaxtpu.core.run.protocol import ResumeState
from torchxla_ref.checkpoint import Checkpoints

log = logging.getLogger("jaxtpu")


class XlaBackend:
    """The torch_xla side of the shared loop (or, with `xla=False`, plain PyTorch: `--parallel
    eager` on one device, the baseline a CPU or GPU user would otherwise run, or `ddp`)."""

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
        self.device_type = "xla" if xla else strategy.device.type  # eager, ddp: cpu or cuda
        if xla:
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met

            self.torch_xla, self.xm, self.met = torch_xla, xm, met
        self.strategy = strategy
        self.num_devices = strategy.num_devices
        self.device_kind = ""  # not resolved on this side: no MFU figure
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.train_model = strategy.wrap(model)  # ddp: its backward all-reduces the gradients
        self.cfg = cfg
        self.micro = 0
        self.primary = strategy.ordinal == 0
        self.ckpts = Checkpoints(workdir, self.primary, self.xm if xla else None)
        self._train_compiles = 0
        from torchxla_ref import steps

        train = cfg.train
        self.scaler = steps.grad_scaler(
            train.precision, self.device_type, train.loss_scale, train.loss_scale_growth_interval
        )

    # One host process drives the loop; spawn and ddp replicas take their slice in
    # `strategy.put`.
    num_processes = 1

    def local_rows(self, n: int) -> slice:
        return slice(None)

    def any_process(self, flag: bool) -> bool:
        return flag

    def preemption_point(self, index: int) -> bool:
        return False  # one process: the stop flag has the signal itself

    def _sync(self) -> None:
        if self.xla:
            self.torch_xla.sync()

    def _compiles(self) -> int:
        if not self.xla:
            return 0
        data = self.met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def compile_count(self) -> int:
        """Train graphs compiled so far (train steps and accumulation micro-steps; evaluation
        graphs are not counted, as on the JAX side), read from torch_xla's own metrics."""
        return self._train_compiles

    def device_memory_mb(self) -> list[float] | None:
        """Not reported: torch_xla's CPU devices have no memory statistics."""
        return None

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
        compiles_before = self._compiles()
        self.micro += 1
        acc = self.cfg.optim.accumulate
        scale = None if self.scaler is None else self.scaler.get_scale()
        loss, grad_norm = steps.train_step(
            self.train_model,
            self.optimizer,
            self.scheduler,
            self.strategy.put(batch),
            task=self.cfg.task,
            precision=self.cfg.train.precision,
            device_type=self.device_type,
            accumulate=acc,
            update=self.micro % acc == 0,
            clip_norm=self.cfg.optim.clip_norm,
            reduce_gradients=self.strategy.reduce_gradients,
            margin=self.cfg.train.margin,
            scaler=self.scaler,
        )
        scaling = {}
        if scale is not None:  # the scale this step's loss was multiplied by; halved: skipped
            scaling = {"loss_scale": scale, "skipped": float(self.scaler.get_scale() < scale)}
        loss = self.strategy.mean(loss)  # each replica's loss is of its slice
        self._sync()  # the step boundary: the traced graph is compiled once, then reused
        self._train_compiles += self._compiles() - compiles_before
        return loss, grad_norm, scaling

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []

        def collect(items: list[Any]) -> None:  # runs after the barrier, on device data
            for loss, norm, scaling in items:
                norm = None if norm is None else norm.item()
                out.append({"loss": loss.item(), "grad_norm": norm, **scaling})

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
            self.cfg.task,
            self.cfg.train.precision,
            self.device_type,
            self.cfg.train.margin,
        )
        self._sync()
        return {"score": self.strategy.gather(scores), "loss": self.strategy.gather(losses)}

    def _payload(self, meta: dict[str, Any], full: bool) -> dict[str, Any]:
        payload = {"model": self.model.state_dict(), "meta": meta}
        if full:
            payload["optimizer"] = self.optimizer.state_dict()
            payload["scheduler"] = self.scheduler.state_dict()
            payload["micro"] = self.micro
            if self.scaler is not None:
                payload["scaler"] = self.scaler.state_dict()
        return payload

    def save_latest(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save("latest", step, self._payload(meta, full=True))

    def save_best(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save("best", step, self._payload(meta, full=False))

    def wait_for_checkpoints(self) -> None:
        """Nothing to wait for: the reference side saves synchronously."""

    def start(self) -> None:
        """Nothing to place: the model is on the strategy's device from construction, and
        torch_xla compiles each step on first use."""

    def restore_latest(self, expect: dict[str, Any]) -> ResumeState:
        """Continues from the latest checkpoint (a fresh start when there is none)."""
        payload = self.ckpts.restore_latest(expect)
        if payload is None:
            return ResumeState()
        self.model.load_state_dict(payload["model"], strict=True)
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.micro = payload["micro"]
        if self.scaler is not None:
            self.scaler.load_state_dict(payload["scaler"])
        log.info("resumed from %s at step %d", self.ckpts.latest_path(), payload["meta"]["step"])
        return ResumeState.of(payload["meta"])
