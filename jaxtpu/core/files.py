"""Writing a file so that a killed process never leaves half of it (framework-free).

Every file jaxtpu writes whole (a submission CSV, a JSON record, a checkpoint, a token cache
entry) goes through `atomic_write`: the content goes to a temporary file beside the target,
which then replaces the target in one `os.replace`. A reader sees the old file or the new one,
never a mix; a failed write removes its temporary file and leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
    """A file opened for writing whose content replaces `path` when the block ends without an
    error (a temporary file in the same directory until then).

    Args:
      path: the file to write; its directory is created when missing.
      mode: 'w' (text, UTF-8 unless `encoding` is given) or 'wb'.
      open_kwargs: passed to `open` (e.g. `newline=''` for csv).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL on a fresh name: no other writer shares it; 0o666 less the umask, as `open` does.
    # The writer's pid is in the name: `remove_stale_temporaries` knows a killed writer's file.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Replaces `path` with `text` atomically."""
    with atomic_write(path) as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Replaces `path` with `data` atomically."""
    with atomic_write(path, "wb") as f:
        f.write(data)


_TMP_NAME = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}" + re.escape(TMP_SUFFIX) + "$")


def remove_stale_temporaries(directory: str | os.PathLike) -> int:
    """Removes the temporary files `atomic_write` left in `directory` when its process was
    killed mid-write (SIGKILL, power loss): those whose writer is no longer running. Returns
    how many were removed."""
    removed = 0
    for entry in Path(directory).glob(f".*{TMP_SUFFIX}"):
        match = _TMP_NAME.match(entry.name)
        if not match or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            entry.unlink()
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def take_lock(path: Path) -> tuple[int | None, str]:
    """Takes the advisory lock file `path` for this process, exclusive and without waiting:
    `(fd, '')` while it holds it (the kernel drops the lock when the process ends, even by
    SIGKILL), or `(None, holder)` naming the process that holds it. The file says who holds
    it; `release_lock` gives it back."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        return None, holder
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()}".encode())
    return fd, ""


def release_lock(fd: int, path: Path | None = None) -> None:
    """Gives back a lock `take_lock` took; with `path`, removes its file first (a process
    that opened the old file meanwhile is refused, one that comes later makes a new one)."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def disk_full(error: BaseException) -> OSError | None:
    """The 'no space left' (or quota) OSError behind an exception, if that is what it is
    (libraries such as orbax wrap it in their own errors)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen
        if "No space left on device" in str(seen):  # e.g. tensorstore's errors in orbax
            return OSError(errno.ENOSPC, str(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def disk_full_message(
    path: Path | str,
    what: str,
    advice: str = "earlier checkpoints are intact: free some space and continue with --resume",
) -> str:
    """One line: what could not be written where, the space left there, and what to do."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return f"{path}: no space left on device writing {what} ({free}); {advice}"


def cache_root() -> Path:
    """Where jaxtpu keeps what it can rebuild (token ids, compiled programs): $JAXTPU_CACHE,
    default ~/.cache/jaxtpu."""
    return Path(os.environ.get("JAXTPU_CACHE", Path.home() / ".cache" / "jaxtpu"))
