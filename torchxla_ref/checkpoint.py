"""Checkpoints of a torch-side run: the twin of `jaxtpu.engine.checkpoint`, in the same run
directory layout (`checkpoints/latest`, `checkpoints/best`), as `torch.save` files.

Each checkpoint is written to a temporary file and renamed when complete, so a run killed
mid-write leaves the previous one intact; one file is kept per kind. Under `xmp.spawn` every
replica calls `xm.save` (it rendezvous) and only the primary (replica 0) writes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from jaxtpu.core import files
from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.files import disk_full, disk_full_message
from jaxtpu.core.run.rundir import check_compatible


class Checkpoints:
    """The latest and the best checkpoint of one run directory."""

    def __init__(self, workdir: Path, primary: bool = True, xm: Any = None) -> None:
        """`xm`: `torch_xla.core.xla_model` on XLA devices (None: plain `torch.save`)."""
        self.root = workdir / "checkpoints"
        self.primary = primary
        self.xm = xm

    def save(self, kind: str, step: int, payload: dict[str, Any]) -> None:
        directory = self.root / kind
        final = directory / f"step_{step}.pt"
        if self.primary:
            directory.mkdir(parents=True, exist_ok=True)
        # Serialise in memory, then write with Python I/O: torch's zip writer reports a full
        # disk without an errno, a plain write raises ENOSPC.
        buffer = io.BytesIO()
        if self.xm is not None:
            self.xm.save(payload, buffer, master_only=True)
        else:
            torch.save(payload, buffer)
        if not self.primary:
            return
        try:  # a half-written file goes, the previous one stays
            files.write_bytes(final, buffer.getbuffer())
        except OSError as e:
            if disk_full(e) is None:
                raise
            raise CheckpointError(disk_full_message(directory, f"checkpoint {step}")) from None
        for old in directory.glob("step_*.pt"):
            if old != final:
                old.unlink()

    def latest_path(self) -> Path | None:
        found = sorted(
            (self.root / "latest").glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1])
        )
        return found[-1] if found else None

    def restore_latest(self, expect: dict[str, Any]) -> dict[str, Any] | None:
        """The latest checkpoint's payload (None when there is none yet), checked to belong to
        this task and model."""
        path = self.latest_path()
        if path is None:
            return None
        try:
            payload = torch.load(str(path), map_location="cpu", weights_only=False)
        except Exception as e:  # torch raises many types for damaged files
            raise CheckpointError(
                f"{path}: unreadable checkpoint ({type(e).__name__}: {e})"
            ) from None
        check_compatible(payload["meta"], expect, path)
        return payload
