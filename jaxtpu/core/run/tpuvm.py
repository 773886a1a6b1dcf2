"""A Cloud TPU VM through Google's own command line (framework-free): `gcloud compute tpus
tpu-vm describe | create | delete | ssh --worker=all` of one VM, its state and worker count
read from what gcloud prints, and the words gcloud uses for a zone or project it does not
know. `jaxtpu launch` drives it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from dataclasses import dataclass

from jaxtpu.core import storage
from jaxtpu.core.errors import UserError

# gcloud's words for a zone or project that does not exist (a missing VM is instead "Resource
# 'projects/P/locations/Z/nodes/NAME' was not found")
PLACE_NOT_FOUND = re.compile(r"\b(location|project) \S+ (is )?not found", re.IGNORECASE)

GONE = ("PREEMPTED", "TERMINATED", "STOPPED", "SUSPENDED", "FAILED")

READY = "READY"


@dataclass
class Vm:
    state: str
    workers: int


class Gcloud:
    """The `gcloud compute tpus tpu-vm` commands of one TPU VM."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.name, self.args = args.tpu, args
        self.where = [f"--zone={args.zone}"] + (
            [f"--project={args.project}"] if args.project else []
        )

    def _run(self, verb: str, *extra: str, capture: bool = True) -> subprocess.CompletedProcess:
        cmd = [self.args.gcloud, "compute", "tpus", "tpu-vm", verb, self.name, *self.where, *extra]
        try:
            return subprocess.run(cmd, capture_output=capture, text=True)
        except FileNotFoundError:
            raise UserError(
                f"--gcloud {self.args.gcloud}: not found; install the Google Cloud CLI and log "
                "in (gcloud auth login), or pass its path"
            ) from None

    def describe(self) -> Vm | None:
        """The VM's state and worker count, or None when there is no such VM (a zone or
        project that does not exist is a UserError: creating a VM there cannot help)."""
        proc = self._run("describe", "--format=json")
        if proc.returncode:
            said = storage.first_line(proc.stderr)
            where = " ".join(self.where)
            if PLACE_NOT_FOUND.search(proc.stderr):  # not the node's path, "locations/..."
                raise UserError(f"gcloud describe {self.name} ({where}): {said}")
            if "NOT_FOUND" in proc.stderr or "not found" in proc.stderr.lower():
                return None
            raise UserError(f"gcloud describe {self.name}: {said}")
        found = vm_record(proc.stdout)
        if found is None:
            raise UserError(
                f"gcloud describe {self.name} --format=json printed no JSON object: "
                f"{storage.first_line(proc.stdout) or '(nothing)'}"
            )
        return Vm(str(found.get("state", "")), max(len(found.get("networkEndpoints") or []), 1))

    def create(self) -> None:
        extra = [
            f"--accelerator-type={self.args.accelerator_type}",
            f"--version={self.args.version}",
        ]
        proc = self._run("create", *extra, *(["--spot"] if self.args.spot else []))
        if proc.returncode:
            raise Retry(f"could not create {self.name}: {storage.first_line(proc.stderr)}")

    def delete(self) -> None:
        self._run("delete", "--quiet")

    def ssh_all(self, command: str) -> int:
        """Runs `command` on every worker; its output goes to this terminal."""
        return self._run("ssh", "--worker=all", f"--command={command}", capture=False).returncode


def vm_record(stdout: str) -> dict | None:
    """The JSON object `gcloud ... describe --format=json` printed, after any notice gcloud
    printed before it (an update available, a deprecation), or None when there is none."""
    start = stdout.find("{")
    while start != -1:
        try:
            found, _ = json.JSONDecoder().raw_decode(stdout[start:])
        except ValueError:
            start = stdout.find("{", start + 1)
            continue
        if isinstance(found, dict):
            return found
        start = stdout.find("{", start + 1)
    return None


SSH_FAILED = 255  # ssh's own exit code: it could not reach (or lost) a worker


class Retry(Exception):
    """An attempt that failed for a reason another attempt may not meet (no capacity)."""
