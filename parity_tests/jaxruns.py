"""`python -m parity_tests.jaxruns [--never-skip] '[[flags...], ...]'`: several `jaxtpu.train`
runs, one after another, in this one process (`harness.run_jax_runs`); exits with the first
non-zero code.

`--never-skip` breaks jaxtpu's fp16 loss scaling on purpose (`parity_tests.breaks --check
fp16`): every step counts as finite, so none is skipped and the scale never backs off."""

from __future__ import annotations

import json
import sys

from jaxtpu import train
from parity_tests.harness import train_each


def never_skip() -> None:
    """jaxtpu's loss scale with its finiteness check replaced by "always finite"."""
    from flax.training.dynamic_scale import DynamicScale

    from jaxtpu.engine import steps

    class NeverSkips(DynamicScale):
        def value_and_grad(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            real = super().value_and_grad(*args, **kwargs)

            def broken(*a):  # noqa: ANN002, ANN202
                out = real(*a)
                kept = out.dynamic_scale.replace(scale=self.scale, fin_steps=self.fin_steps + 1)
                return out._replace(dynamic_scale=kept, finite=out.finite | True)

            return broken

    steps.DynamicScale = NeverSkips


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--never-skip":
        never_skip()
        argv = argv[1:]
    return train_each(train.main, json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
