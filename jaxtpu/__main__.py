"""`jaxtpu COMMAND [flags]` (installed as a console script; also `python -m jaxtpu`): one
command for every tool of the project. Each subcommand is its `python -m` module, with the
same flags (`jaxtpu train --help` is `python -m jaxtpu.train --help`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from jaxtpu import HUGE_PAGE_COMMANDS
from jaxtpu.core import hostmem
from jaxtpu.core.versions import installed, jax_needed

# subcommand -> (module whose main() it runs, one line for `jaxtpu --help`)
COMMANDS = {
    "train": ("jaxtpu.train", "train and evaluate a model (JAX/Flax)"),
    "predict": ("jaxtpu.predict", "score a CSV with a run's best model (or an ensemble of runs)"),
    "evaluate": ("jaxtpu.evaluate", "score a labelled file with its competition's metric"),
    "export": ("jaxtpu.export", "write a run's best model as a Hugging Face dir or state dict"),
    "lr-find": ("jaxtpu.lrfind", "learning-rate range test: loss against rate, a suggested --lr"),
    "severity-weights": (
        "jaxtpu.severity",
        "search a multi-label run's label weights for severity on pairs",
    ),
    "preflight": (
        "jaxtpu.preflight.command",
        "compile for this CPU or a TPU slice: memory, fits or not",
    ),
    "launch": (
        "jaxtpu.launch",
        "run train on a Cloud TPU VM's workers, re-creating a preempted VM and resuming",
    ),
    "serve": (
        "jaxtpu.serve.command",
        "answer Perspective API's requests with a run's model (an HTTP server)",
    ),
    "feedback": (
        "jaxtpu.feedback",
        "what serve --feedback kept of comments:suggestscore: export it, or erase some",
    ),
    "archive": (
        "jaxtpu.serve.archive",
        "score files too large for one machine on Apache Beam (local, Dataflow, Flink, Spark)",
    ),
    "history": (
        "jaxtpu.history",
        "a platform's Perspective history: import it, map a run onto its scale, compare",
    ),
    "head": (
        "jaxtpu.serve.heads",
        "a community's head on the frozen served model, from its moderators' decisions",
    ),
    "shadow": (
        "jaxtpu.shadow",
        "report: how serve --shadow's model compares with the one answering",
    ),
    "bisect": ("parity_tests.bisect", "layer-by-layer comparison with transformers"),
    "families": ("parity_tests.families", "build small random checkpoints of every family"),
    "parity": ("parity_tests.report", "run the parity checks and write the report"),
    "bench": ("benchmarks.training.compare", "step-time comparison of the two sides"),
    "torch-train": ("torchxla_ref.train", "the PyTorch/XLA reference trainer (same flags)"),
}


# the commands a slim install (`jaxtpu[serve-onnx]`: no JAX) runs; serve checks for itself,
# since `--workdir` and `--model-dir` need JAX and `--onnx` does not (archive likewise; history
# import needs none, fit-scale and compare check for it)
NO_JAX = ("serve", "feedback", "shadow", "launch", "torch-train", "archive", "history")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: jaxtpu COMMAND [flags]   (jaxtpu COMMAND --help: its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "  --version  print the version"]
    return "\n".join(lines)


def version() -> str:
    return installed("jaxtpu", "unknown (not installed)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(f"jaxtpu {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"jaxtpu: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, _ = COMMANDS[name]
    if name not in NO_JAX and not any(a in ("-h", "--help") for a in rest):
        problem = jax_needed(f"jaxtpu {name}")
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    if module_name in HUGE_PAGE_COMMANDS and argv is None:  # as `python -m` of them does
        hostmem.reexec_with_huge_pages()
    module = importlib.import_module(module_name)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
