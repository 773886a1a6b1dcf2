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
import shlex
import sys
import time
from collections.abc import Sequence

from jaxtpu.core import storage
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.run.tpuvm import GONE, READY, SSH_FAILED, Gcloud, Retry, Vm


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
                    raise Retry("--setup failed on a worker")
            command = train_command(flags, vm.workers, args.python)
            print(f"launch: attempt {attempt}: {command}", flush=True)
            code = gcloud.ssh_all(command)
            if code == 0 and finished(workdir):
                print(f"launch: the run in {workdir} finished", flush=True)
                return 0
            after = gcloud.describe()
            if code == SSH_FAILED and after is not None and after.state == READY:
                raise Retry(
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
        except Retry as e:
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
