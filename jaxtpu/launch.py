"""`jaxtpu launch`: run `jaxtpu train` on every worker of a Cloud TPU VM (a single host or a
pod slice) and keep it going across preemptions: a spot VM that was reclaimed is deleted,
created again, set up, and the run resumed from its bucket run directory.

    jaxtpu launch --tpu my-tpu --zone us-west4-a --accelerator-type v5litepod-8 --spot \\
        --setup "pip install 'jaxtpu[tpu,gcs]'" -- --preset minilm --workdir gs://b/runs/a

It drives Google's own command line (`gcloud compute tpus tpu-vm describe | create | delete |
ssh --worker=all`), so it needs `gcloud` installed and logged in on the machine it runs on; the
run on the workers is `python3 -m jaxtpu.train FLAGS --resume` (a first attempt with
`--resume` simply starts at step 0), JAX's own multi-controller runtime on a slice of several
hosts (`--coordinator-address auto` is added when the VM has more than one worker).

The loop: describe the VM; if it is gone or was preempted, delete what is left and create it
(`--spot` for a spot VM) and run `--setup` on every worker; run the training; when it ends,
the bucket's `summary.json` says whether the run finished. A run stopped by SIGTERM (the
preemption notice: it saved its state) or an ssh cut short by the VM going away is tried again
after `--retry-wait` seconds, at most `--retries` times, as is an ssh that could not reach the
workers (ssh's own exit code 255); a run that failed on a VM that is still there (bad flags,
bad data) is not retried: its exit code is returned. A zone or project gcloud does not know is
one line at once, never a VM to create.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from jaxtpu.core import storage
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.run.exits import user_errors

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
            raise _Retry(f"could not create {self.name}: {storage.first_line(proc.stderr)}")

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


class _Retry(Exception):
    """An attempt that failed for a reason another attempt may not meet (no capacity)."""


def train_command(flags: list[str], workers: int, python: str) -> str:
    """The command each worker runs: `jaxtpu.train` with the run's flags and --resume (and
    `--coordinator-address auto` on a slice of several hosts)."""
    flags = list(flags)
    if "--resume" not in flags:
        flags.append("--resume")
    if workers > 1 and not any(f.startswith("--coordinator-address") for f in flags):
        flags += ["--coordinator-address", "auto"]
    return shlex.join([python, "-m", "jaxtpu.train", *flags])


def workdir_of(flags: list[str]) -> str:
    """The run's --workdir, which must be a bucket: a spot VM's disk goes with it."""
    for i, flag in enumerate(flags):
        if flag == "--workdir" and i + 1 < len(flags):
            found = flags[i + 1]
            break
        if flag.startswith("--workdir="):
            found = flag.split("=", 1)[1]
            break
    else:
        found = ""
    if not storage.is_remote(found):
        raise UserError(
            f"--workdir {found or '(none)'}: a launched run writes to a bucket (--workdir "
            "gs://BUCKET/PATH): a preempted VM's disk is deleted with it"
        )
    return found


def finished(workdir: str) -> bool:
    """Whether the run in `workdir` ran to its end (its summary says no signal stopped it)."""
    summary = storage.join(workdir, "summary.json")
    if not storage.exists(summary):
        return False
    record = json.loads(storage.read_bytes(summary))
    return record.get("stopped_by") in (None, "early stopping")


def launch(args: argparse.Namespace, flags: list[str]) -> int:
    """The loop of the module docstring; returns the exit code."""
    workdir = workdir_of(flags)
    gcloud = Gcloud(args)
    for attempt in range(1, args.retries + 2):
        try:
            vm = gcloud.describe()
            if vm is not None and vm.state in GONE:
                print(f"launch: {args.tpu} is {vm.state}: deleting it", flush=True)
                gcloud.delete()
                vm = None
            if vm is None:
                print(f"launch: creating {args.tpu} ({args.accelerator_type})", flush=True)
                gcloud.create()
                vm = gcloud.describe() or Vm(READY, 1)
                if args.setup and gcloud.ssh_all(args.setup):
                    raise _Retry("--setup failed on a worker")
            command = train_command(flags, vm.workers, args.python)
            print(f"launch: attempt {attempt}: {command}", flush=True)
            code = gcloud.ssh_all(command)
            if code == 0 and finished(workdir):
                print(f"launch: the run in {workdir} finished", flush=True)
                return 0
            after = gcloud.describe()
            if code == SSH_FAILED and after is not None and after.state == READY:
                raise _Retry(
                    f"ssh could not reach a worker of {args.tpu} (exit {SSH_FAILED}, ssh's own; "
                    "see its output above), which is up"
                )
            if code and after is not None and after.state == READY:
                print(
                    f"launch: the run failed (exit {code}) on {args.tpu}, which is still up: "
                    "not a preemption, not retried (see its output above)",
                    file=sys.stderr,
                )
                return code
            why = "stopped by its preemption notice" if code == 0 else "cut off"
            state = after.state if after is not None else "deleted"
            print(f"launch: attempt {attempt} {why}; {args.tpu} is {state}", flush=True)
        except _Retry as e:
            print(f"launch: attempt {attempt}: {e}", flush=True)
        if attempt <= args.retries:
            print(f"launch: trying again in {args.retry_wait:g}s", flush=True)
            time.sleep(args.retry_wait)
    raise UserError(
        f"launch: gave up after {args.retries + 1} attempts; the run's latest checkpoint is in "
        f"{workdir} (launch again, or jaxtpu train ... --resume)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, flags = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = command_parser(
        "launch",
        __doc__.split("\n\n")[0],
        epilog="Everything after -- is jaxtpu train's flags (with --workdir gs://...).",
    )
    args = p.parse_args(ours)
    with user_errors():
        check_command_flags("launch", args)
        if not flags:
            raise UserError("give jaxtpu train's flags after --, with --workdir gs://BUCKET/PATH")
        return launch(args, flags)
    return 2


if __name__ == "__main__":
    sys.exit(main())
