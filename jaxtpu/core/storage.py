"""Paths that may be in a bucket (framework-free): wherever jaxtpu takes a path, a
`gs://bucket/path` URL works too (any fsspec URL does: `s3://`, and `memory://` in the tests).

Why fsspec (gcsfs for `gs://`): orbax reaches a bucket through etils' `epath`, which without
TensorFlow goes through fsspec, so one client and one set of credentials (the TPU VM's service
account, or `gcloud auth application-default login`) serve the checkpoints' metadata and every
other file of a run; tensorstore writes the arrays (`jaxtpu.engine.checkpoint`). The lease that
keeps one run per bucket directory needs generation preconditions, which gcsfs does not expose: it
uses google-cloud-storage, which gcsfs itself depends on (`jaxtpu.core.run.lease`).

Reading: an input file or directory in a bucket is copied once into the local cache
(`cache_root()/remote/`), keyed by the URL and the objects' generations (etags), and read from
there; a changed object is copied again. Writing: an object appears whole when its upload
completes (GCS never shows half of one), so a file is written here first and uploaded;
`staged_dir` gives a command's output directory the same promise as a whole (a local one is
renamed into place, a remote one uploaded when complete).

A Google Cloud Storage emulator (`STORAGE_EMULATOR_HOST=http://host:port`, as the Python
clients read it) is honoured by every client: tensorstore is pointed at it too
(`TENSORSTORE_GCS_HTTP_URL`) and gcsfs's zonal-bucket probe, which an emulator cannot answer
(it waits a minute per bucket), is turned off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import UserError
from jaxtpu.core.files import cache_root, release_lock, take_lock, write_text
from jaxtpu.core.settings import env_number

log = logging.getLogger("jaxtpu")

EMULATOR = "STORAGE_EMULATOR_HOST"


def timeout_seconds() -> float:
    """How long a call to a bucket through google-cloud-storage (the lease) keeps retrying
    before it fails: `JAXTPU_BUCKET_TIMEOUT`, default 60 s. (gcsfs retries six times over
    about half a minute; tensorstore as `jaxtpu.engine.checkpoint.bucket_retries` says.)"""
    return env_number("JAXTPU_BUCKET_TIMEOUT", 60.0, minimum=1.0)


def retry_attempts() -> int:
    """How many times tensorstore retries a bucket call of a checkpoint before the save fails:
    `JAXTPU_BUCKET_RETRIES`, default 8 (`jaxtpu.engine.checkpoint.bucket_retries`)."""
    return int(env_number("JAXTPU_BUCKET_RETRIES", 8, minimum=0, integer=True))


class BucketError(UserError):
    """A bucket that cannot be read or written: the message names the URL, what was being
    done and what to do."""


def is_remote(path: str | os.PathLike | None) -> bool:
    """Whether `path` is a URL of a file system other than this machine's (`gs://...`)."""
    text = str(path or "")
    return "://" in text and not text.startswith("file://")


def join(base: str | os.PathLike, *parts: str) -> str:
    """`base/part/...` for a URL or a local path (as a string)."""
    if not is_remote(base):
        return str(Path(base).joinpath(*parts))
    return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts if p)])


def name_of(path: str | os.PathLike) -> str:
    """The last part of a path or URL (`gs://b/runs/a/` -> `a`)."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def configure_emulator() -> None:
    """With `STORAGE_EMULATOR_HOST` set, every client talks to that emulator (see the module
    docstring); without it, nothing changes."""
    host = os.environ.get(EMULATOR)
    if not host:
        return
    if "://" not in host:
        host = f"http://{host}"
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    # tensorstore looks for credentials first and logs an error when it finds none
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path in it (gcsfs for `gs://`)."""
    configure_emulator()
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url, **_options(url))
    except (ImportError, ValueError) as e:
        scheme = url.split("://", 1)[0]
        raise BucketError(
            f"{url}: no file system for {scheme}:// ({e}); for gs:// install gcsfs "
            "(pip install 'jaxtpu[gcs]')"
        ) from None
    return fs, path


def _options(url: str) -> dict[str, Any]:
    if url.startswith("gs://") and os.environ.get(EMULATOR):
        return {"token": "anon"}  # an emulator takes no credentials
    return {}


@contextlib.contextmanager
def bucket_errors(url: str, what: str, advice: str = "") -> Iterator[None]:
    """Turns what a bucket's client raises while doing `what` with `url` into one
    `BucketError` line: a missing object, no permission, or a bucket that does not answer
    (after the client's own retries)."""
    try:
        yield
    except (UserError, KeyboardInterrupt):
        raise
    except FileNotFoundError:
        raise BucketError(f"{url}: no such object or directory ({what})") from None
    except PermissionError as e:
        raise BucketError(f"{url}: permission denied {what} ({first_line(e)})") from None
    except _client_errors() as e:  # anything else (a bug) keeps its traceback
        raise BucketError(
            f"{url}: the bucket did not answer {what} ({type(e).__name__}: {first_line(e)})"
            f"{'; ' + advice if advice else ''}"
        ) from None


@functools.cache
def _client_errors() -> tuple[type[BaseException], ...]:
    """What the clients raise for a bucket that fails: OS and network errors, aiohttp's,
    gcsfs's HTTP errors, google-auth's and google-api-core's, requests'."""
    found: list[type[BaseException]] = [OSError, TimeoutError]
    for module, name in (
        ("aiohttp", "ClientError"),
        ("gcsfs.retry", "HttpError"),
        ("google.auth.exceptions", "GoogleAuthError"),
        ("google.api_core.exceptions", "GoogleAPIError"),
        ("requests", "RequestException"),
    ):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def first_line(e: BaseException) -> str:
    """The first line of an error's message (its type when it has none), at most 300 characters."""
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    with bucket_errors(url, "looking for it"):
        return bool(fs.exists(path))


def is_dir(url: str) -> bool:
    fs, path = filesystem(url)
    with bucket_errors(url, "looking for it"):
        return bool(fs.isdir(path))


def listing(url: str) -> dict[str, dict[str, Any]]:
    """Every object under `url` (a directory), by its path relative to `url`, with its info
    (size, etag/generation)."""
    fs, path = filesystem(url)
    with bucket_errors(url, "listing it"):
        if not fs.isdir(path):
            return {}
        found = fs.find(path, detail=True)
    root = path.rstrip("/") + "/"
    return {k[len(root) :]: v for k, v in found.items() if k.startswith(root)}


def read_bytes(url: str) -> bytes:
    fs, path = filesystem(url)
    with bucket_errors(url, "reading it"):
        return fs.cat_file(path)


def write_bytes(url: str, data: bytes) -> None:
    """Replaces the object `url` with `data` (whole, in one upload)."""
    fs, path = filesystem(url)
    with bucket_errors(url, "writing it"):
        fs.pipe_file(path, data)


def remove(url: str, recursive: bool = False) -> None:
    fs, path = filesystem(url)
    with bucket_errors(url, "removing it"):
        if fs.exists(path):
            fs.rm(path, recursive=recursive)


def put(local: str | os.PathLike, url: str, skip: Any = None, advice: str = "") -> list[str]:
    """Uploads a file, or a directory's files (`skip(relative path)` True leaves one out),
    each as one object; `advice` ends the error line of a bucket that fails. Returns the
    relative paths uploaded."""
    local = Path(local)
    fs, path = filesystem(url)
    if local.is_file():
        with bucket_errors(url, f"uploading {local.name}", advice):
            fs.put_file(str(local), path)
        return [local.name]
    sent = []
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        rel = file.relative_to(local).as_posix()
        if skip is not None and skip(rel):
            continue
        with bucket_errors(join(url, rel), "uploading it", advice):
            fs.put_file(str(file), f"{path.rstrip('/')}/{rel}")
        sent.append(rel)
    return sent


def get(url: str, local: str | os.PathLike, skip: Any = None) -> list[str]:
    """Downloads the object `url`, or every object under it (`skip(relative path)` True
    leaves one out), into `local` (a file, or a directory created as needed), each file
    written whole (a temporary name, then renamed). Returns the relative paths."""
    local = Path(local)
    fs, path = filesystem(url)
    if not is_dir(url):
        _get_file(fs, path, local, url)
        return [local.name]
    got = []
    for rel in sorted(listing(url)):
        if skip is not None and skip(rel):
            continue
        _get_file(fs, f"{path.rstrip('/')}/{rel}", local / rel, join(url, rel))
        got.append(rel)
    return got


def _get_file(fs: Any, path: str, local: Path, url: str) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.{os.getpid()}.download")
    try:
        with bucket_errors(url, "downloading it"):
            fs.get_file(path, str(tmp))
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)


def _version(info: dict[str, Any]) -> str:
    """What changes when an object is replaced: its generation or etag, else size and time."""
    for key in ("generation", "etag", "ETag", "md5Hash", "mtime", "LastModified", "created"):
        if info.get(key):
            return f"{key}={info[key]}"
    return f"size={info.get('size')}"


def remote_cache() -> Path:
    return cache_root() / "remote"


def fetch(url: str, flag: str = "") -> Path:
    """A local copy of the file or directory `url` (an input: a CSV, a model directory, a
    notebook checkpoint, saved programs), made once per version of its objects and kept in
    the local cache; `flag` names it in messages. A local path is returned as it is."""
    if not is_remote(url):
        return Path(url)
    what = f"{flag} {url}" if flag else url
    fs, path = filesystem(url)
    with bucket_errors(url, f"reading {flag or 'it'}"):
        if not fs.exists(path):
            raise BucketError(f"{what}: no such object or directory")
        directory = fs.isdir(path)
        infos = listing(url) if directory else {"": fs.info(path)}
    if directory and not infos:
        raise BucketError(f"{what}: an empty directory")
    version = hashlib.sha256(
        "|".join(f"{k}:{_version(v)}" for k, v in sorted(infos.items())).encode()
    ).hexdigest()[:16]
    target = remote_cache() / cache_key(url) / version / name_of(url)
    if target.exists():
        return target
    started = time.time()
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=_made(target.parent)))
    try:
        get(url, staging / target.name)
        os.replace(staging / target.name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(v.get("size") or 0 for v in infos.values())
    log.info(
        "%s: copied here (%.1f MB, %.1fs) to %s", what, size / 1e6, time.time() - started, target
    )
    return target


def cache_key(url: str) -> str:
    """A short name for `url` in the local cache."""
    return hashlib.sha256(str(url).rstrip("/").encode()).hexdigest()[:16]


def output_copy(url: str) -> Path:
    """Where a command writes an output file bound for `url` before uploading it (in the
    local cache, so a stopped command continues there on this machine)."""
    return remote_cache().parent / "outputs" / cache_key(url) / name_of(url)


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_input(path: str | os.PathLike, flag: str = "") -> str:
    """`path` itself, or for a URL the local copy `fetch` keeps of it."""
    return str(fetch(str(path), flag)) if is_remote(path) else str(path)


@contextlib.contextmanager
def named(local: str | os.PathLike, url: str) -> Iterator[None]:
    """Messages (`UserError`s) about the local copy `local` of `url` name `url` instead."""
    try:
        yield
    except UserError as e:
        if str(local) == str(url) or str(local) not in str(e):
            raise
        raise type(e)(str(e).replace(str(local), str(url))) from None


def check_output_dir(url: str, flag: str) -> None:
    """Refuses, before any work, a bucket output directory that holds objects already, or a
    bucket that cannot be reached or written."""
    if listing(url):
        raise BucketError(f"{flag} {url} exists and is not an empty directory")
    check_writable(join(url, "x"), flag)


def check_writable(url: str, flag: str) -> None:
    """Refuses, before any work, an output `url` whose bucket cannot be reached or written
    there (probed with an empty object beside it, removed again)."""
    probe = url.rstrip("/").rsplit("/", 1)[0] + f"/.jaxtpu-probe-{os.getpid()}"
    with bucket_errors(url, f"checking that {flag} can be written"):
        fs, path = filesystem(probe)
        fs.pipe_file(path, b"")
        fs.rm(path)


def check_output_file(path: str, flag: str, overwrite: bool = False) -> None:
    """Refuses, before any work, an output file that cannot be written (a local path as
    `check_output_path` checks it; a URL whose bucket cannot be written) or that
    exists without `overwrite`."""
    if is_remote(path):
        if exists(path) and not overwrite:
            raise UserError(f"{flag} {path} exists; pass --overwrite to replace it")
        check_writable(path, flag)
        return
    check_output_path(Path(path), flag)
    if Path(path).exists() and not overwrite:
        raise UserError(f"{flag} {path} exists; pass --overwrite to replace it")


def write_output_text(path: str, text: str) -> None:
    """A small output file (a report), written whole: atomically here, one upload to a URL."""
    if is_remote(path):
        write_bytes(path, text.encode())
        return
    write_text(path, text)


STAGING = ".staging-"  # `.<name>.staging-XXXXXXXX`: mkdtemp's name beside a local output


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[Path]:
    """A directory to write a command's output into, which becomes `out` only when the block
    ends without an error: renamed into place beside a local `out` (an empty directory there
    is replaced), uploaded file by file to a URL. A failure leaves `out` as it was.

    Beside a local `out`, the write holds the lock file `.<name>.lock` from the start: a
    second command writing the same `out` is refused at once (it used to do all its work, then
    fail to rename), and the staging directories a killed write left there are removed.

    Raises:
      UserError: another process is writing `out`, or `out` was written meanwhile."""
    if is_remote(out):
        with _staging(None) as staging:
            yield staging
            put(staging, str(out))
        return
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    fd, holder = take_lock(lock)
    if fd is None:
        raise UserError(
            f"{out} is being written by another process ({holder}); wait for it to end, or "
            "choose another output"
        )
    try:
        left = re.compile(re.escape(f".{target.name}{STAGING}") + r"[a-z0-9_]{8}")
        for old in target.parent.iterdir():  # a killed write's: nobody else holds the lock
            if left.fullmatch(old.name) and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        with _staging(target.parent, f".{target.name}{STAGING}") as staging:
            yield staging
            if target.is_dir() and not any(target.iterdir()):  # the output checks allow it
                target.rmdir()
            if target.exists():
                raise UserError(f"{out} was written by another process meanwhile; nothing replaced")
            staging.rename(target)
    finally:
        release_lock(fd, lock)


@contextlib.contextmanager
def _staging(parent: Path | None, prefix: str = ".jaxtpu-") -> Iterator[Path]:
    """A new directory in `parent` (None: the system's temporary directory) with the
    permissions mkdir gives (not mkdtemp's 0700), removed when the block ends."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_output_path(path: Path, flag: str, is_dir: bool = False) -> None:
    """Refuses, before any work, an output path that cannot be written: a file where a
    directory is expected (or the reverse), or a parent that is a file."""
    if not is_dir and path.is_dir():
        raise UserError(f"{flag} {path} is a directory; give a file path")
    if is_dir and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{flag} {path} exists and is not an empty directory")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is not a directory")
    try:  # can the missing directories be made there? (probed, and nothing left behind)
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".jaxtpu-probe-"))
    except OSError as e:
        raise UserError(
            f"{flag} {path}: cannot create anything in {parent} ({e.strerror or e})"
        ) from None
