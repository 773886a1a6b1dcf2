"""Scoring a run while it trains: how many `jaxtpu.load(run).predict` calls fail while the run
replaces its best checkpoint under them (issue 58 counted 2 failures in 92 calls, each a raw
FileNotFoundError).

`python -m benchmarks.serving.load_race --out runs/load-race [--epochs 40]`

A tiny run (`--preset tiny`, demo data) trains in a process of its own, evaluating at every
epoch end and monitoring the validation loss (which falls at almost every evaluation, so its
best checkpoint is replaced again and again: orbax writes the new step, then deletes the old
one). Meanwhile this process loads the run's best model and scores two comments, again and
again, until the run ends. It prints the number of calls, how many failed and with what,
and writes OUT/load_race.json. A measurement of this machine: the counts depend on timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving.load_race", description=__doc__)
    p.add_argument("--out", required=True, help="A new directory for the run and the result.")
    p.add_argument("--epochs", type=int, default=40, help="The run's epochs (one evaluation each).")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        sys.exit(f"--out {out} exists; choose a new directory")
    workdir = out / "run"
    flags = ["--preset", "tiny", "--epochs", str(args.epochs), "--monitor", "val_loss",
             "--no-progress", "--workdir", str(workdir), "--num-devices", "1"]  # fmt: skip
    out.mkdir(parents=True)
    log = (out / "train.log").open("w")  # a file, not a pipe: a full pipe would stall the run
    command = [sys.executable, "-m", "jaxtpu.train", *flags]
    run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    import jaxtpu

    while run.poll() is None and not (workdir / "checkpoints" / "best").exists():
        time.sleep(0.2)
    calls, failures = 0, Counter()
    started = time.time()
    while run.poll() is None:
        calls += 1
        try:
            jaxtpu.load(workdir, num_devices=1).predict(["you are an idiot", "thanks"])
        except Exception as e:  # counted: the point of the measurement
            failures[f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"] += 1
    log.close()
    if run.returncode:
        sys.exit(f"the training run failed (exit {run.returncode}); see {out / 'train.log'}")
    result = {
        "calls": calls,
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "seconds": round(time.time() - started, 1),
        "evaluations": args.epochs,
    }
    (out / "load_race.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{calls} load+predict calls while the run trained ({result['seconds']}s, "
        f"{args.epochs} evaluations): {result['failed']} failed"
    )
    for what, n in failures.most_common():
        print(f"  {n} x {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
