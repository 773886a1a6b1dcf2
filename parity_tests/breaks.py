"""`python -m parity_tests.breaks --work DIR [--check trajectories|outcome]`: a parity check
with jaxtpu's side deliberately broken, to show whether the check fails a side that computes
something else. Prints one line per comparison; exits 1 if any passed.

- trajectories (the 8-device trajectory check, whose jaxtpu runs share one process,
  `harness.run_jax_runs`): jaxtpu trains at --lr 5.5e-4 where the reference trains at 5e-4;
- outcome (check 4, dropout on): jaxtpu fine-tunes at --lr 5e-4 where the reference
  fine-tunes at 5e-5;
- fp16 (check 3d, fp16 with loss scaling): jaxtpu's loss scale never skips a step (every
  gradient counts as finite, `parity_tests.jaxruns --never-skip`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parity_tests import checks, fp16, harness


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity_tests.breaks", description=__doc__)
    p.add_argument("--work", required=True, help="a directory for the runs")
    p.add_argument("--task", default="toxicity", choices=("toxicity", "ranking"))
    p.add_argument("--check", default="trajectories", choices=("trajectories", "outcome", "fp16"))
    args = p.parse_args(argv)
    harness.share_compilations()
    if args.check == "trajectories":
        real = harness.run_jax_runs

        def broken(runs: list, timeout: float = 1200) -> list:
            return real([(wd, [*flags, "--lr", "5.5e-4"]) for wd, flags in runs], timeout)

        checks.run_jax_runs = broken
        results = checks.trajectories(Path(args.work), args.task)
    elif args.check == "fp16":
        real = harness.run_jax_runs

        def never_skips(runs: list, timeout: float = 1200) -> list:
            return real(runs, timeout, options=("--never-skip",))

        fp16.run_jax_runs = never_skips
        results = fp16.fp16_trajectories(Path(args.work))
    else:
        one = harness.run_side

        def broken_side(side: str, workdir: Path, *flags: str, **kw) -> harness.Run:
            return one(side, workdir, *flags, *(["--lr", "5e-4"] if side == "jax" else []), **kw)

        checks.run_side = broken_side
        results = [checks.outcome(Path(args.work), args.task)]
    for r in results:
        print(("ok  " if r.passed else "FAIL"), r.check, f"{r.measured:.3g} (tol {r.tolerance:g})")
    return 1 if any(r.passed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
