"""`--init-from RUN`: a new run that continues a finished jaxtpu run (framework-free).

A run directory (its `config.json` records the flags under `config`) given to --init-from
starts the new run from RUN's best checkpoint. The new run is RUN's model, so it takes RUN's
flags that make that model (`SAME`: the task, the encoder's shape, the head, LoRA, the
served attribute names), refusing one given otherwise; and the flags that say how RUN read
and computed (`CARRIED`: --max-len, --precision, the dropouts, ...) unless given. It
validates on the newest rows of its training file (--time-column time) unless told
otherwise. What it takes is said in one line on stderr, as `cli.implied` says it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.configfile import read_config_file
from jaxtpu.core.flags.schema import FIELDS
from jaxtpu.core.flags.values import is_run_dir

# The flags that make RUN's parameters and its answers: the new run must have RUN's.
SAME = (
    "task",
    "model_dir",
    "num_layers",
    "hidden_size",
    "num_heads",
    "intermediate_size",
    "vocab_size",
    "pooling",
    "head",
    "token_head",
    "answer_tokens",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "aux_columns",
    "attributes",
)
# How RUN read and computed: taken from RUN unless given.
CARRIED = (
    "tokenizer_dir",
    "dropout",
    "encoder_dropout",
    "lora_dropout",
    "remat",
    "scan_layers",
    "matmul_output",
    "max_len",
    "prompt_template",
    "rule_template",
    "precision",
    "aux_weight",
)
# What the new run does differently from a plain fine-tune unless given (a --valid-csv or
# folds choose the validation rows instead).
NEW = {"time_column": "time"}


def run_flags(run: str) -> dict[str, Any]:
    """The flags RUN recorded that the new run takes (`SAME` and `CARRIED`)."""
    recorded = read_config_file(Path(run) / "config.json")
    return {k: recorded[k] for k in (*SAME, *CARRIED) if k in recorded}


def inherit(overrides: dict[str, Any], current: Any) -> dict[str, Any]:
    """`overrides` (the flags given, by field name) with RUN's model flags beneath them when
    `init_from` names a run directory, and `NEW`'s; `current`: the Config before them (the
    preset), against which a change is said. Unchanged when --init-from is not a run.

    Raises:
      ConfigError: a flag of `SAME` given with another value than RUN's.
    """
    run = overrides.get("init_from")
    if not is_run_dir(run):
        return overrides
    theirs = run_flags(run)
    for name in SAME:
        if name in overrides and name in theirs and overrides[name] != theirs[name]:
            flag = f"--{name.replace('_', '-')}"
            raise ConfigError(
                f"{flag} {overrides[name]} with --init-from {run}: that run has {flag} "
                f"{theirs[name]}, and the new run continues its model; leave {flag} out"
            )
    new = {} if {"valid_csv", "n_folds", "fold_column"} & set(overrides) else NEW
    chosen = {k: v for k, v in {**theirs, **new}.items() if k not in overrides}
    said = {k: v for k, v in chosen.items() if _value(current, k) != v}
    if said:
        flags = " ".join(f"--{k.replace('_', '-')} {_shown(v)}" for k, v in said.items())
        print(
            f"--init-from {run} (a jaxtpu run) continues its model: using {flags} "
            "(give them to choose otherwise)",
            file=sys.stderr,
            flush=True,
        )
    return {**chosen, **overrides}


def _value(cfg: Any, name: str) -> Any:
    return getattr(getattr(cfg, FIELDS[name][0]), name)


def _shown(value: Any) -> str:
    text = "" if value is None else str(value)
    return repr(text) if not text or " " in text else text
