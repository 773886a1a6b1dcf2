"""`python -m parity_tests.breaks --work DIR`: the 8-device trajectory check with jaxtpu's side
deliberately broken (its runs train at --lr 5.5e-4 where the reference trains at 5e-4), to show
that the check, whose jaxtpu runs share one process (`harness.run_jax_runs`), still fails a
side that computes something else. Prints one line per comparison; exits 1 if any passed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parity_tests import checks, harness


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity_tests.breaks", description=__doc__)
    p.add_argument("--work", required=True, help="a directory for the runs")
    p.add_argument("--task", default="toxicity", choices=("toxicity", "ranking"))
    args = p.parse_args(argv)
    real = harness.run_jax_runs

    def broken(runs: list, timeout: float = 1200) -> list:
        return real([(wd, [*flags, "--lr", "5.5e-4"]) for wd, flags in runs], timeout)

    checks.run_jax_runs = broken
    harness.share_compilations()
    results = checks.trajectories(Path(args.work), args.task)
    for r in results:
        print(("ok  " if r.passed else "FAIL"), r.check, f"{r.measured:.3g} (tol {r.tolerance:g})")
    return 1 if any(r.passed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
