"""`python -m parity_tests.torchruns '[[flags...], ...]'`: several `torchxla_ref.train` runs of
one strategy, one after another, in this one process (`harness.run_torch_runs`): one start of
torch and torch_xla (the most expensive part of a small run here) for all, each run in a
directory of its own as `run_side` would write it; exits with the first non-zero code. For
runs that differ in what torch_xla keeps per process only through what each run sets itself
(its precision by autocast, its seed, its model): never two strategies (spmd's mode is the
process's) and never JAX (see `harness`)."""

from __future__ import annotations

import json
import sys

from parity_tests.harness import train_each
from torchxla_ref import train


def main(argv: list[str]) -> int:
    runs = json.loads(argv[0])
    strategies = {flags[flags.index("--parallel") + 1] for flags in runs if "--parallel" in flags}
    if len(strategies) > 1:
        sys.exit(f"torchruns: one strategy per process, got {sorted(strategies)}")
    return train_each(train.main, runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
