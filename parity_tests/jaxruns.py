"""`python -m parity_tests.jaxruns '[[flags...], ...]'`: several `jaxtpu.train` runs, one after
another, in this one process (`harness.run_jax_runs`); exits with the first non-zero code."""

from __future__ import annotations

import json
import sys

from jaxtpu import train


def main(argv: list[str]) -> int:
    for flags in json.loads(argv[0]):
        code = train.main(flags)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
