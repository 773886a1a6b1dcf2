"""What a framework gives the shared loop (framework-free): the `Backend` protocol (JAX:
`jaxtpu.engine.backend.JaxBackend`; torch_xla: `torchxla_ref.backend.XlaBackend`), which owns
the model state on its devices, and the `ResumeState` a checkpoint hands back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Backend(Protocol):
    """What a framework provides to the loop."""

    name: str
    num_devices: int  # global, over all processes
    num_processes: int
    primary: bool  # process 0: the one that writes the run directory
    device_kind: str  # `hardware.peak_flops_per_device` knows a TPU's; "" = unknown

    def local_rows(self, n: int) -> slice:
        """The rows of an n-row global batch this process feeds (all of them with one)."""

    def any_process(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (a host-level collective)."""

    def preemption_point(self, index: int) -> bool:
        """True on every process at the same `index` (consecutive, the same on every
        process) once any of them got a preemption notice: JAX's preemption sync point in a
        multi-process run; False where there is no such service."""

    def start(self) -> None:
        """Puts the model state on the devices and builds the steps, after `restore_latest`
        and before the first step (a backend whose state lives on its devices from the start
        has nothing to do)."""

    def compile_count(self) -> int:
        """How many train programs were built so far: one per sequence length of the train
        calls (evaluation programs are not counted, on either side)."""

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> Any:
        """The input of one `train_steps` call built from these consecutive host batches
        (e.g. stacked and already on the devices). Runs on the input thread, while the
        devices work on earlier calls."""

    def precompile(
        self, calls: list[list[dict[str, np.ndarray]]], evals: list[dict[str, np.ndarray]]
    ) -> int:
        """Builds, before the first step, the programs for a train call like each of `calls`
        and an evaluation batch like each of `evals` (one of each shape the run uses);
        returns how many it built (0: it builds them on first use)."""

    def train_steps(self, prepared: Any) -> list[Any]:
        """Runs the steps of one `prepare`d call asynchronously (one device call on the
        JAX side, see --steps-per-call); returns handles on their device-side metrics."""

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        """Host values of the handles' metrics ('loss', 'grad_norm'), one dict per step: one
        device sync."""

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per-example 'score' and 'loss' of the global batch whose local rows are `batch`,
        on the host of every process."""

    def restore_latest(self, identity: dict[str, Any]) -> ResumeState:
        """Continues from the run's latest checkpoint, which must match `identity` (a fresh
        start when there is none); called before the first step."""

    def save_latest(self, step: int, meta: dict[str, Any]) -> None: ...

    def save_best(self, step: int, meta: dict[str, Any]) -> None: ...

    def wait_for_checkpoints(self) -> None:
        """Returns once every save started so far is written (saves that run in the
        background, `--async-checkpoint`); raises a failed one's error."""

    def device_memory_mb(self) -> list[float] | None:
        """Peak memory per device of this process, where the devices report it."""

    def profile_start(self, directory: Path) -> None:
        """Starts the profiler's trace into `directory` (only with `--profile-steps`, a flag
        of the sides whose backend has a profiler)."""

    def profile_stop(self) -> None: ...


@dataclass
class ResumeState:
    """What a checkpoint carries for the loop to continue where it stopped."""

    step: int = 0
    best: dict[str, Any] = field(
        default_factory=lambda: {"value": -math.inf, "step": None, "bad_evals": 0}
    )
    skipped: int = 0  # --precision fp16: steps skipped for non-finite gradients so far

    @classmethod
    def of(cls, meta: dict[str, Any]) -> ResumeState:
        """The state a checkpoint's meta (`jaxtpu.core.run.loop` writes it) records; a meta
        of a version before skipped steps were counted has none."""
        return cls(int(meta["step"]), meta["best"], int(meta.get("skipped_steps", 0)))
