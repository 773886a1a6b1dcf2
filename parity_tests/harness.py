"""Running each framework in its own process and reading what it wrote.

JAX and torch_xla each bring an XLA runtime; they must not share a process. Every run here is
a real `python -m jaxtpu.train` / `python -m torchxla_ref.train` subprocess writing a run
directory, and comparisons read its `metrics.jsonl`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"jax": "jaxtpu.train", "torch": "torchxla_ref.train"}
# JAX's persistent compilation cache for the test processes: the suite's many small runs
# compile the same programs (same model, shapes and flags) in process after process; with
# the cache only the first compiles. Keyed by the program,
# the compile options and the jax version, so a stale entry cannot be used.
COMPILATION_CACHE = ROOT / ".pytest_cache" / "jax-compilation-cache"


def share_compilations() -> None:
    """Turns on the persistent compilation cache for this process (when JAX has not started
    yet) and for every process it starts (through the environment); a user's own setting is
    kept."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(COMPILATION_CACHE))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    if "jax" in sys.modules:
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs",
            float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
        )


@dataclass
class Run:
    workdir: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def records(self) -> list[dict[str, Any]]:
        path = self.workdir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("event") == kind]

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.events("train")]

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.workdir / "summary.json").read_text())

    def check(self) -> Run:
        if self.returncode != 0:
            raise AssertionError(
                f"run in {self.workdir} exited {self.returncode}\n--- stderr (tail) ---\n"
                + "\n".join(self.stderr.splitlines()[-30:])
            )
        return self


def clean_env(extra: dict | None = None) -> dict[str, str]:
    """This environment, offline for Hugging Face, plus `extra`."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra or {})}


def run_side(
    side: str, workdir: Path, *flags: str, timeout: float = 1200, env: dict | None = None
) -> Run:
    """Runs one side's trainer in a fresh process; flags as on the command line."""
    cmd = [sys.executable, "-m", SIDES[side], "--workdir", str(workdir), "--no-progress", *flags]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=clean_env(env), capture_output=True, text=True, timeout=timeout
    )
    return Run(workdir, proc.returncode, proc.stdout, proc.stderr)


RUNNERS = {"jax": "parity_tests.jaxruns", "torch": "parity_tests.torchruns"}


def run_runs(
    side: str, runs: list[tuple[Path, list[str]]], timeout: float = 1200, options: tuple = ()
) -> list[Run]:
    """Several runs of one side (each a workdir and its flags, as on the command line) one
    after another in one fresh process (`python -m parity_tests.jaxruns` or `torchruns`): one
    interpreter and one start of the framework for all, each run in a directory of its own as
    `run_side` would write it. The two sides never share one (see the module docstring).
    `options`: the worker's own (jaxruns' `--never-skip`, for `parity_tests.breaks`)."""
    argvs = [["--workdir", str(wd), "--no-progress", *flags] for wd, flags in runs]
    cmd = [sys.executable, "-m", RUNNERS[side], *options, json.dumps(argvs)]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    return [Run(wd, proc.returncode, proc.stdout, proc.stderr) for wd, _ in runs]


def train_each(main: Callable[[list[str]], int], runs: list[list[str]]) -> int:
    """The body of `parity_tests.jaxruns` and `torchruns`: `main` (a side's trainer) on each
    run's flags in turn; the first non-zero exit code, else 0."""
    for flags in runs:
        code = main(flags)
        if code:
            return code
    return 0


def run_jax_runs(
    runs: list[tuple[Path, list[str]]], timeout: float = 1200, options: tuple[str, ...] = ()
) -> list[Run]:
    """jaxtpu runs in one process (`run_runs`)."""
    return run_runs("jax", runs, timeout, options)


def run_torch_runs(runs: list[tuple[Path, list[str]]], timeout: float = 1200) -> list[Run]:
    """torchxla_ref runs of one strategy in one process (`run_runs`): the same losses as a
    process each (checked for the trajectories' fp32 and bf16 spmd runs: equal to the bit)."""
    return run_runs("torch", runs, timeout)


def run_forward(side: str, model_dir: Path, csv: Path, out: Path, *flags: str) -> dict[str, Any]:
    """Runs the `parity_tests.forward` worker of one side in a fresh process and returns what
    it wrote (`out`, an npz); flags as on its command line (`--grads`, `--capture`, ...)."""
    import numpy as np

    cmd = [
        sys.executable,
        "-m",
        "parity_tests.forward",
        "--side",
        side,
        "--model-dir",
        str(model_dir),
        "--csv",
        str(csv),
        "--out",
        str(out),
        *flags,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    if proc.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    if "{precision}" in str(out):
        return {}  # several files: `run_forwards` reads them
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def run_forwards(
    side: str, model_dir: Path, csv: Path, out: Path, precisions: tuple[str, ...], *flags: str
) -> dict[str, dict[str, Any]]:
    """`run_forward` for each of `precisions` in one worker process (one start of JAX or of
    torch for all), with gradients; `out`'s name gets `-{precision}` before its suffix.
    Returns {precision: what that run wrote}."""
    import numpy as np

    template = out.with_name(f"{out.stem}-{{precision}}{out.suffix}")
    run_forward(
        side, model_dir, csv, template, "--precision", ",".join(precisions), "--grads", *flags
    )
    found = {}
    for precision in precisions:
        with np.load(str(template).format(precision=precision)) as z:
            found[precision] = {k: z[k] for k in z.files}
    return found


def shared_init(
    out_dir: Path, task: str, preset: str = "tiny", seed: int = 0, **overrides: Any
) -> Path:
    """One seeded torch init, saved as a Hugging Face directory that both sides load with
    --model-dir: the preset's encoder (pretrained for `minilm`, random for `tiny`, its shape
    changed by `overrides` such as num_layers=4) plus a seeded head (one output per score of
    the task; `head='hf'`: the family's own, a `*ForSequenceClassification` directory). Same
    initial weights on both sides."""
    from jaxtpu.core.flags.presets import get_preset
    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.core.hf.heads import classifier_fields
    from torchxla_ref import weights

    if (out_dir / "model.safetensors").exists():
        return out_dir
    cfg = get_preset(preset).replace(task=task, **overrides)
    spec = RunSpec.resolve(cfg)
    model = weights.load_model(spec.model_spec(cfg), spec.model_dir, seed)
    classifier = None
    if spec.head == "hf":  # the family's own head: a *ForSequenceClassification directory
        labels = spec.task.score_columns(every=True)
        classifier = classifier_fields(
            spec.encoder.model_type, labels, task, cfg.head_dropout, spec.pooling
        )
    meta = {"task": task, "init_seed": seed}
    weights.save_hf(model, out_dir, spec.tokenizer_dir, meta, classifier)
    return out_dir


def relative_diff(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True)]
