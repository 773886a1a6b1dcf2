"""One run per run directory in a bucket: a lease object with an expiry, written only with
generation preconditions (framework-free).

A local run directory is held with `fcntl` (the kernel drops the lock when its process dies);
a bucket has no such thing, and the run that held a directory may have died with its VM. So the
run keeps an object `RUN/.lease` (who holds it, when it was last renewed, for how long it
holds) and renews it every quarter of that time from a thread. Every write of it is
conditional on the generation the writer last saw (GCS's `ifGenerationMatch`; 0 = "only if
there is none"), so of two runs that race for a directory exactly one wins:

- taking: none there (or one released) -> written with `ifGenerationMatch=0` (or the released
  one's generation); one there and renewed less than its time ago -> refused in one line,
  naming its holder and when it expires;
- taking over a stale one (its holder stopped renewing, e.g. a preempted VM): written with the
  stale generation as the precondition, and the run says whose lease it took over; a second
  run taking it over at the same moment fails its precondition and is refused;
- renewing: conditional on this run's own last generation; a failed precondition means
  another run took the directory over (this one stalled for longer than the lease), and the
  run stops before it writes anything more (`check`);
- releasing: overwritten as released, conditional on this run's generation.

Staleness is judged by the reader's clock against the holder's: machines whose clocks differ
by a sizeable share of the lease time (120 s by default, `JAXTPU_LEASE_SECONDS`) should not
share a bucket directory. The object store is `gs://` through google-cloud-storage (gcsfs does
not expose generation preconditions), or an in-memory one for `memory://` URLs in the tests.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from jaxtpu.core.errors import TrainingError, UserError
from jaxtpu.core.settings import env_number
from jaxtpu.core.storage import (
    BucketError,
    bucket_errors,
    configure_emulator,
    first_line,
    join,
    timeout_seconds,
)

log = logging.getLogger("jaxtpu")

NAME = ".lease"


def lease_seconds() -> float:
    """How long a lease holds without renewal: 120 s, or `JAXTPU_LEASE_SECONDS` (at least 1 s:
    a lease that is stale as soon as it is written would let a second run take over at once)."""
    return env_number("JAXTPU_LEASE_SECONDS", 120.0, minimum=1.0)


class Conflict(Exception):
    """A conditional write whose precondition failed: another writer got there first."""


class ObjectStore(Protocol):
    """One object with generations and conditional writes."""

    url: str

    def read(self) -> tuple[bytes, int] | None:
        """The object's bytes and generation, or None when there is none."""

    def write(self, data: bytes, if_generation: int) -> int:
        """Replaces the object if its generation is `if_generation` (0: if there is none);
        returns the new generation; raises `Conflict` otherwise."""


class GcsObject:
    """A `gs://` object through google-cloud-storage (honours `STORAGE_EMULATOR_HOST`)."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        configure_emulator()
        from google.api_core.retry import Retry
        from google.cloud import storage

        bucket, _, name = url.removeprefix("gs://").partition("/")
        self.url = url
        self.blob = storage.Client().bucket(bucket).blob(name)
        self.retry = Retry(deadline=timeout)  # a bucket that does not answer: one error
        self.timeout = timeout

    def read(self) -> tuple[bytes, int] | None:
        from google.api_core import exceptions

        try:
            self.blob.reload(timeout=self.timeout, retry=self.retry)
            data = self.blob.download_as_bytes(
                if_generation_match=self.blob.generation, timeout=self.timeout, retry=self.retry
            )
        except exceptions.NotFound:
            return None
        except exceptions.PreconditionFailed:  # replaced between the two calls: read again
            return self.read()
        return data, int(self.blob.generation)

    def write(self, data: bytes, if_generation: int) -> int:
        from google.api_core import exceptions

        try:
            self.blob.upload_from_string(
                data, if_generation_match=if_generation, timeout=self.timeout, retry=self.retry
            )
        except exceptions.PreconditionFailed:
            raise Conflict(self.url) from None
        return int(self.blob.generation)


class MemoryObject:
    """An object with generations in this process's memory (`memory://` URLs, for tests)."""

    _objects: dict[str, tuple[bytes, int]] = {}
    _lock = threading.Lock()

    def __init__(self, url: str) -> None:
        self.url = url

    def read(self) -> tuple[bytes, int] | None:
        with self._lock:
            return self._objects.get(self.url)

    def write(self, data: bytes, if_generation: int) -> int:
        with self._lock:
            found = self._objects.get(self.url)
            if (found[1] if found else 0) != if_generation:
                raise Conflict(self.url)
            generation = time.time_ns()
            self._objects[self.url] = (data, generation)
            return generation


def object_store(url: str) -> ObjectStore:
    if url.startswith("gs://"):
        return GcsObject(url, timeout_seconds())
    if url.startswith("memory://"):
        return MemoryObject(url)
    raise UserError(
        f"{url}: a run directory in a bucket needs gs:// (its lease uses GCS's generation "
        "preconditions); other file systems are not supported for --workdir"
    )


@dataclass
class Holder:
    """What a lease object says."""

    holder: str
    run: str
    renewed: float
    seconds: float
    released: bool = False

    def stale(self, now: float) -> bool:
        return self.released or now - self.renewed > self.seconds

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        try:
            d = json.loads(data)
            return cls(str(d["holder"]), str(d["run"]), float(d["renewed"]), float(d["seconds"]),
                       bool(d.get("released", False)))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None  # not a lease this version wrote: treated as stale


class Lease:
    """This run's hold on the bucket run directory `workdir` (see the module docstring)."""

    def __init__(self, workdir: str, store: ObjectStore | None = None, seconds: float = 0) -> None:
        self.workdir = workdir
        self.url = join(workdir, NAME)
        self.store = store or object_store(self.url)
        self.seconds = seconds or lease_seconds()
        self.me = Holder(
            f"process {os.getpid()} on {socket.gethostname()}", uuid.uuid4().hex, 0.0, self.seconds
        )
        self.generation = 0
        self.lost: str | None = None
        self.took_over: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, renew: bool = True) -> Lease:
        """Takes the lease or raises a one-line `UserError`; with `renew`, a thread renews it
        until `release`."""
        with bucket_errors(self.url, "taking the run directory's lease"):
            found = self.store.read()
            now = time.time()
            if found is not None:
                other = Holder.parse(found[0])
                if other is not None and not other.stale(now):
                    raise UserError(
                        f"--workdir {self.workdir} is in use by another run ({other.holder}, "
                        f"lease renewed {now - other.renewed:.0f}s ago; it expires "
                        f"{other.renewed + other.seconds - now:.0f}s after its last renewal if "
                        "that run is gone); wait for it to end, or choose another --workdir"
                    )
                if other is not None and not other.released:
                    self.took_over = other
            try:
                self.generation = self._write(found[1] if found else 0, now)
            except Conflict:
                raise UserError(
                    f"--workdir {self.workdir} was just taken by another run; wait for it to "
                    "end, or choose another --workdir"
                ) from None
        if self.took_over is not None:
            log.warning(
                "%s: took over the lease of %s, which stopped renewing it %.0fs ago",
                self.workdir,
                self.took_over.holder,
                time.time() - self.took_over.renewed,
            )
        if renew:
            self._thread = threading.Thread(target=self._renewing, name="jaxtpu-lease", daemon=True)
            self._thread.start()
        return self

    def _write(self, if_generation: int, now: float, released: bool = False) -> int:
        self.me.renewed, self.me.released = now, released
        return self.store.write(self.me.to_bytes(), if_generation)

    def renew(self) -> None:
        """One renewal; a failed precondition marks the lease lost (see `check`)."""
        try:
            self.generation = self._write(self.generation, time.time())
        except Conflict:
            found = self.store.read()
            other = Holder.parse(found[0]) if found else None
            self.lost = other.holder if other else "another run"
            self._stop.set()

    def _renewing(self) -> None:
        failing = False
        while not self._stop.wait(self.seconds / 4):
            try:
                self.renew()
            except Exception as e:  # a bucket that does not answer: the saves will say so
                if not failing:
                    log.warning(
                        "%s: could not renew the lease (%s); trying again every %.0fs",
                        self.url,
                        first_line(e),
                        self.seconds / 4,
                    )
                failing = True
            else:
                if failing:
                    log.info("%s: renewed the lease again", self.url)
                failing = False

    def check(self) -> None:
        """Raises `TrainingError` when another run took the directory over."""
        if self.lost:
            raise TrainingError(
                f"--workdir {self.workdir}: another run ({self.lost}) took over this run "
                f"directory after this run could not renew its lease for {self.seconds:.0f}s; "
                "stopped without writing more (its checkpoints are the other run's now)"
            )

    def release(self) -> None:
        """Stops renewing and marks the lease released (unless another run holds it now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost:
            return
        try:
            self._write(self.generation, time.time(), released=True)
        except (Conflict, BucketError):
            pass
        except Exception as e:  # the bucket went away: the lease expires on its own
            log.warning("%s: could not release the lease (%s); it expires on its own", self.url, e)
