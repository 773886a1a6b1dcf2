"""Check 5 of the parity suite: every model family's trajectory (`family_trajectories`), jaxtpu
jit against torch_xla spmd from one init of the family's checkpoint, with the notebooks'
recipes; beside `parity_tests.checks`, whose constants and helpers it uses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from parity_tests.checks import (
    FAMILY_FLAGS,
    HF_HEAD,
    REAL_DATA_FLAGS,
    RECIPE_FLAGS,
    RULES_PROMPT,
    TRAJ_BF16_RTOL,
    TRAJ_FLAGS,
    TRAJ_FP32_RTOL,
    VARIANT_FLAGS,
    Result,
    family_init,
    rules_file,
    weighted_sample,
)
from parity_tests.harness import relative_diff, run_jax_runs, run_torch_runs


def family_trajectory(work: Path, family: str, task: str = "toxicity", variant: str = "") -> Result:
    """One case of `family_trajectories`."""
    return family_trajectories(work, [(family, task, variant)])[0]


def family_trajectories(work: Path, cases: Sequence[tuple[str, ...]]) -> list[Result]:
    """Each case (family, task[, variant]): 21 fp32 steps on 8 devices with dropout off from
    one init of a family's checkpoint, with a notebook's recipe knobs (`RECIPE_FLAGS`): jaxtpu
    jit against torch_xla spmd, each with its own command line; every case's jaxtpu runs in
    one process and its torch_xla runs in another. The multi-label one weights its rows'
    losses and learns two auxiliary targets (`weighted_sample`). `variant` names flags of
    `VARIANT_FLAGS` added to both sides (`lora`: adapters on the frozen base, peft's on the
    torch side)."""
    planned = [_family_case(work, *case) for case in cases]
    refs = run_torch_runs(
        [(work / f"traj-{c['name']}-spmd", [*c["flags"], "--parallel", "spmd"]) for c in planned]
    )
    runs = run_jax_runs(
        [(work / f"traj-{c['name']}-jit", [*c["flags"], "--parallel", "jit"]) for c in planned]
    )
    results = []
    for c, ref, run in zip(planned, refs, runs, strict=True):
        ref, run = ref.check(), run.check()
        rel = relative_diff(run.losses, ref.losses)
        worst = max(rel)
        results.append(
            Result(
                f"trajectory {c['what']} {c['precision']}"
                f"{' (its own head)' if c['head'] == 'hf' else ''}: jaxtpu jit vs torch_xla "
                "spmd, 8 devices",
                c["tol"],
                worst,
                worst <= c["tol"] and len(rel) >= 20,
                f"{len(rel)} steps, worst at step {int(np.argmax(rel)) + 1}",
                {"jaxtpu jit": run.losses, "torch_xla spmd": ref.losses},
            )
        )
    return results


def _family_case(work: Path, family: str, task: str = "toxicity", variant: str = "") -> dict:
    """A family trajectory's init (made once), both sides' flags, its tolerance and names."""
    weighted, aux = [], ""
    if task == "multilabel":
        aux = "aux_a,aux_b"
        weighted = [
            *("--train-csv", str(weighted_sample(work)), "--weight-column", "sample_weight"),
            *("--aux-columns", aux, "--aux-weight", "0.7"),
        ]
    if task == "rules":
        weighted = ["--train-csv", str(rules_file(work)), "--max-rows", "256"]
    head = "hf" if (family, task) in HF_HEAD else "jaxtpu"
    prompt = {"prompt_template": RULES_PROMPT} if variant == "prompt" else {}
    model_dir = family_init(work, family, task, aux, head, **prompt)
    flags = [
        *("--head", head),
        *TRAJ_FLAGS,
        "--task",
        task,
        "--model-dir",
        str(model_dir),
        "--num-devices",
        "8",
        "--precision",
        "fp32",
        *REAL_DATA_FLAGS.get(task, []),
        *weighted,
        *RECIPE_FLAGS.get(task, []),
        *FAMILY_FLAGS.get(family, []),
        *VARIANT_FLAGS.get(variant, []),
    ]
    precision = "bf16" if variant.endswith("bf16") else "fp32"
    return {
        "flags": flags,
        "head": head,
        "precision": precision,
        "tol": TRAJ_BF16_RTOL[task] if precision == "bf16" else TRAJ_FP32_RTOL,
        "name": f"{family}-{task}-{head}{f'-{variant}' if variant else ''}".replace(" ", "-"),
        "what": " ".join(
            [family, task, *variant.split()[: 1 if variant.endswith("bf16") else None]]
        ),
    }
