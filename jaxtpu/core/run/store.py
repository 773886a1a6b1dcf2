"""Where a run directory lives: on this machine, or in a bucket with a working copy here
(framework-free).

A run in a bucket (`--workdir gs://bucket/runs/a`) writes its files as a local run does, into
a working copy under the local cache (`cache_root()/runs/<bucket>/<path>`), and `publish`
uploads what changed there since the last time, each file one object (whole when it appears).
The loop publishes before every checkpoint save and at the end, so the bucket always holds the
metrics of every step its latest checkpoint covers (a resumed run drops the lines after it),
even when the run dies the moment a checkpoint is committed.
Checkpoints do not pass through the working copy: orbax writes them into the bucket itself
(`jaxtpu.engine.checkpoint`). `pull` starts a working copy from the bucket: a fresh machine
resuming a run gets its config.json, metrics, tokenizer and scores back, and nothing else.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxtpu.core import storage
from jaxtpu.core.files import TMP_SUFFIX, cache_root

log = logging.getLogger("jaxtpu")

CHECKPOINTS = "checkpoints"
# never uploaded: orbax writes checkpoints to the bucket itself; the local lock and temporaries
# belong to this machine; the lease is written by its own rules
_LOCAL_ONLY = (".lock", ".lease", ".write_test")


# a step is read only once its commit marker is written: a save cut off is never resumed from
RESUME_ADVICE = (
    "the checkpoints already whole there are intact: continue with --resume when it answers"
)


def _uploaded(rel: str) -> bool:
    first = rel.split("/", 1)[0]
    name = rel.rsplit("/", 1)[-1]
    return first != CHECKPOINTS and name not in _LOCAL_ONLY and not name.endswith(TMP_SUFFIX)


def working_copy(url: str) -> Path:
    """The local working copy of bucket run directory `url`."""
    scheme, _, rest = url.partition("://")
    return cache_root() / "runs" / scheme / rest.strip("/")


@dataclass
class RunStore:
    """A run directory: `local` is what the run writes (the directory itself, or the working
    copy of a bucket run), `url` the bucket run directory ('' for a local run), `lease` this
    run's hold on it."""

    local: Path
    url: str = ""
    lease: Any = None
    _sent: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return bool(self.url)

    @property
    def where(self) -> str:
        """The run directory as the user named it: the URL, or the local path."""
        return self.url or str(self.local)

    def check(self) -> None:
        """Raises when another run took the bucket directory over (`Lease.check`)."""
        if self.lease is not None:
            self.lease.check()

    def publish(self) -> list[str]:
        """Uploads the files of the working copy that changed since the last publish (a local
        run: nothing to do). Returns their relative paths."""
        if not self.remote or not self.local.is_dir():
            return []
        self.check()
        changed = {}
        for path in self.local.rglob("*"):
            rel = path.relative_to(self.local).as_posix()
            if not path.is_file() or not _uploaded(rel):
                continue
            stat = path.stat()
            if self._sent.get(rel) != (stat.st_size, stat.st_mtime_ns):
                changed[rel] = (stat.st_size, stat.st_mtime_ns)
        for rel in sorted(changed):
            storage.put(self.local / rel, storage.join(self.url, rel), advice=RESUME_ADVICE)
        self._sent.update(changed)
        return sorted(changed)

    def pull(self) -> list[str]:
        """Replaces the working copy with the bucket run directory's files (its checkpoints
        stay in the bucket). Returns their relative paths."""
        shutil.rmtree(self.local, ignore_errors=True)
        self.local.mkdir(parents=True, exist_ok=True)
        started = time.time()
        got = sorted(rel for rel in storage.listing(self.url) if _uploaded(rel))
        for rel in got:
            storage.get(storage.join(self.url, rel), self.local / rel)
        for rel in got:  # as they are in the bucket: not to be uploaded again
            stat = (self.local / rel).stat()
            self._sent[rel] = (stat.st_size, stat.st_mtime_ns)
        if got:
            log.info("%s: %d files copied here (%.1fs)", self.url, len(got), time.time() - started)
        return got

    def holds_a_run(self) -> bool:
        """Whether the directory holds a run already (its metrics, checkpoints or summary)."""
        if not self.remote:
            return any(
                (self.local / name).exists()
                for name in ("metrics.jsonl", CHECKPOINTS, "summary.json")
            )
        found = storage.listing(self.url)
        return any(
            rel in ("metrics.jsonl", "summary.json") or rel.startswith(CHECKPOINTS + "/")
            for rel in found
        )
