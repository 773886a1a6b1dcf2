"""Experiment trackers behind one small interface (framework-free): `--tracker
tensorboard,wandb`. `metrics.jsonl` is always written (`jaxtpu.core.run.rundir.RunLog`); each
tracker gets the same numbers, and only process 0 (the first replica) has any.

- tensorboard: TensorBoard event files in `RUN/tensorboard/` (tensorboardX).
- wandb: Weights & Biases through its own client (`pip install 'jaxtpu[wandb]'`), the run's
  config as the W&B run's config; `WANDB_PROJECT` names the project (default jaxtpu),
  `WANDB_MODE=offline` keeps everything in `RUN/wandb/` (sync later with `wandb sync`).
"""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from jaxtpu.core.errors import ConfigError


class Tracker(Protocol):
    def log(self, prefix: str, values: dict[str, float], step: int) -> None:
        """Scalars of one metrics line (`prefix`: train, eval, ...) at training step `step`."""

    def close(self, summary: dict[str, Any] | None) -> None:
        """The run's summary (None: the run did not finish), then flush and close."""


OFFLINE = ("offline", "dryrun", "disabled")


def check_ready(names: tuple[str, ...]) -> None:
    """Refuses, before a run creates anything, a tracker that would fail on its first call:
    W&B online without credentials (the client would raise with a traceback after the run
    directory, its lock and its tokenizer were made). Credentials are looked for where the
    client looks first: WANDB_API_KEY (or WANDB_IDENTITY_TOKEN_FILE) and the .netrc entry
    that `wandb login` writes for the server's host."""
    if "wandb" not in names or os.environ.get("WANDB_MODE", "").lower() in OFFLINE:
        return
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        if netrc.netrc(path).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise ConfigError(
        f"--tracker wandb: no W&B credentials for {host} (WANDB_API_KEY, or `wandb login`); "
        "set WANDB_MODE=offline to keep the run in RUN/wandb/ and `wandb sync` it later"
    )


class TensorBoard:
    def __init__(self, workdir: Path) -> None:
        self.writer = _summary_writer()(str(workdir / "tensorboard"))

    def log(self, prefix: str, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(f"{prefix}/{k}", v, step)

    def close(self, summary: dict[str, Any] | None) -> None:
        self.writer.close()


def _summary_writer() -> type:
    """tensorboardX's SummaryWriter, imported without torch: its writer imports torch when it
    can, only to accept torch tensors as values (jaxtpu logs floats), and torch costs a JAX-side
    process seconds to import. Where torch is already imported it is used as it is; otherwise
    `import torch` fails for tensorboardX's import alone (a None entry in sys.modules, Python's
    way to make an import fail) and imports normally after."""
    if "tensorboardX.writer" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]
    return SummaryWriter


class WandB:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        import wandb

        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "jaxtpu"),
                name=workdir.name,
                dir=str(workdir),
                config=config,
                resume="allow",
            )
        except Exception as e:  # its errors are many and its own: one line, the run refused
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(
                f"--tracker wandb: the W&B client did not start ({type(e).__name__}: {first}); "
                "WANDB_MODE=offline keeps the run in RUN/wandb/"
            ) from None

    def log(self, prefix: str, values: dict[str, float], step: int) -> None:
        self.run.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def close(self, summary: dict[str, Any] | None) -> None:
        if summary:
            self.run.summary.update(
                {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
            )
        self.run.finish()


def open_trackers(names: tuple[str, ...], workdir: Path, config: dict[str, Any]) -> list[Tracker]:
    made: dict[str, Any] = {
        "tensorboard": lambda: TensorBoard(workdir),
        "wandb": lambda: WandB(workdir, config),
    }
    return [made[name]() for name in names]
