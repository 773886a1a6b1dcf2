"""LoRA, what both sides share: the run's adapters (`LoraSpec`, from --lora-*), which
parameters train under them, the adapters' seeded start, and peft's names for them.

A LoRA layer is a frozen dense layer W plus a trained low-rank update: y = x W + (alpha / r)
dropout(x) A B, with A (in, r) and B (r, out) in jaxtpu's layout (peft's `lora_A.weight` is
A transposed, (r, in); `lora_B.weight` is B transposed, (out, r)). B starts at zero, so a new
adapter changes nothing; A starts as peft starts it, uniform in +-1/sqrt(in) (torch's
`kaiming_uniform_(a=sqrt(5))`), drawn here from one seeded numpy stream per tensor, so the
JAX side and the torch side (peft) start from the same A without sharing a file. Under LoRA
the base model is frozen (no gradient, no optimizer state) and, in a bf16 run, held in bf16;
the adapters and the classification head train in fp32. Framework-free: no JAX, no torch.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxtpu.core.errors import ConfigError

# The params of one adapted layer, as jaxtpu names them, and their Hugging Face (peft) keys
# below the layer's module, each with whether jaxtpu's array is the transpose of peft's.
ADAPTER_LEAVES = {"lora_a": ("lora_A.weight", True), "lora_b": ("lora_B.weight", True)}


@dataclass(frozen=True)
class LoraSpec:
    """A run's adapters (`--lora-rank`, `--lora-alpha`, `--lora-dropout`, `--lora-targets`):
    rank r, alpha (the update is scaled by alpha / r, peft's `scaling`), the dropout on the
    adapters' input, and the dense modules adapted, in Hugging Face's names."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = ()

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "targets": list(self.targets),
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> LoraSpec | None:
        if not d:
            return None
        return cls(int(d["rank"]), float(d["alpha"]), float(d["dropout"]), tuple(d["targets"]))

    def describe(self) -> str:
        return f"LoRA r={self.rank} alpha={self.alpha:g} dropout={self.dropout:g} on " + ",".join(
            self.targets
        )


def has_adapters(paths: object) -> bool:
    """Whether a model's parameter paths (tuples of names) include LoRA adapters."""
    return any(path[-1] in ADAPTER_LEAVES for path in paths)  # type: ignore[union-attr]


def trains(path: tuple[str, ...]) -> bool:
    """Under LoRA, whether the parameter at `path` (jaxtpu's names: the encoder under
    `bert`, the head outside it) trains: the adapters and the head do, the base does not."""
    return path[-1] in ADAPTER_LEAVES or path[0] != "bert"


def held_in_bf16(path: tuple[str, ...]) -> bool:
    """Under LoRA in a bf16 run, whether a parameter is held in bf16: every frozen dense
    kernel (nearly all of a decoder's bytes; bf16 matmuls read them in bf16 anyway, so the
    numbers do not change). The embedding stays fp32, as the residual stream it starts is
    (in bf16 it would round the stream's first values), as do norm scales, biases, the
    adapters and the head."""
    return not trains(path) and path[-1] == "kernel"


def initial_a(key: str, fan_in: int, rank: int, seed: int) -> np.ndarray:
    """The start of adapter A of the layer whose `lora_A.weight` has Hugging Face key `key`:
    (rank, fan_in) fp32 in peft's layout, uniform in +-1/sqrt(fan_in) (what peft's
    `kaiming_uniform_(a=sqrt(5))` draws), from a numpy stream of (`seed`, `key`)."""
    stream = np.random.default_rng([seed, zlib.crc32(key.encode())])
    bound = 1.0 / math.sqrt(fan_in)
    return stream.uniform(-bound, bound, (rank, fan_in)).astype(np.float32)


def peft_key(name: str) -> str:
    """A peft model's parameter name -> the Hugging Face key jaxtpu gives it: peft's wrapper
    (`base_model.model.`), the adapter's name (`.default`) and the frozen layer's
    (`.base_layer`) taken out, so `layers.0.self_attn.q_proj.lora_A.default.weight` is
    `layers.0.self_attn.q_proj.lora_A.weight` and the frozen weight keeps its plain key."""
    name = name.removeprefix("base_model.model.")
    for part in (".default.", ".base_layer."):
        name = name.replace(part, ".")
    return name


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what a peft model's saved keys start with


def adapter_config(lora: LoraSpec, base: str | None, head_modules: list[str]) -> dict:
    """The `adapter_config.json` of a peft LoRA adapter for sequence classification: what
    `PeftModel.from_pretrained` reads (peft fills the fields it does not find with its
    defaults); `head_modules` are the classification head's modules, trained in full and
    saved with the adapter (peft's `modules_to_save`)."""
    return {
        "peft_type": "LORA",
        "task_type": "SEQ_CLS",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": list(lora.targets),
        "modules_to_save": head_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
    }


def adapter_tensors(
    encoder: dict[str, np.ndarray], head: dict[str, np.ndarray], encoder_prefix: str
) -> dict[str, np.ndarray]:
    """A peft adapter's tensors, as `save_pretrained` keys them, from a model's state dicts
    in Hugging Face keys (`encoder`: the adapters are its `lora_A`/`lora_B` keys; `head`: the
    classification head's keys, e.g. `score.weight`); `encoder_prefix` is where the
    `*ForSequenceClassification` model holds its encoder (`model` for the decoders)."""
    out = {
        f"{PEFT_PREFIX}{encoder_prefix}.{key}": value
        for key, value in encoder.items()
        if ".lora_A." in key or ".lora_B." in key
    }
    out.update({f"{PEFT_PREFIX}{key}": value for key, value in head.items()})
    return out


def is_adapter_dir(path: str | None) -> bool:
    """Whether `path` is a peft adapter directory (it holds `adapter_config.json`)."""
    return bool(path) and (Path(str(path)) / ADAPTER_CONFIG).is_file()


def read_adapter(path: str, flag: str = "--init-from") -> tuple[LoraSpec, dict[str, np.ndarray]]:
    """A peft LoRA adapter directory: its adapters (`LoraSpec`) and its tensors in peft's saved
    keys; one-line errors for what jaxtpu cannot continue from (another peft method, a rank
    or alpha per layer, DoRA, adapter biases, a missing or unreadable file). What the file
    leaves out is peft's default (r 8, alpha 8, dropout 0)."""
    d = Path(path)
    try:
        config = json.loads((d / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag} {path}: unreadable {ADAPTER_CONFIG} ({e})") from None
    problems = []
    if config.get("peft_type") != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r} (jaxtpu continues LORA)")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            problems.append(f"{key} (a rank or alpha per layer)")
    for key in ("use_dora", "use_rslora", "lora_bias"):
        if config.get(key):
            problems.append(key)
    if config.get("bias", "none") != "none":
        problems.append(f"bias {config['bias']!r}")
    targets = config.get("target_modules")
    if targets == ALL_LINEAR:
        targets = [ALL_LINEAR]
    if not isinstance(targets, list) or not targets:
        problems.append(
            f"target_modules {targets!r} (jaxtpu reads a list of module names or "
            f"{ALL_LINEAR!r}, not a pattern)"
        )
    if problems:
        raise ConfigError(
            f"{flag} {path}: a peft adapter jaxtpu cannot continue: {'; '.join(problems)}"
        )
    weights = d / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ConfigError(f"{flag} {path}: no {ADAPTER_WEIGHTS} beside {ADAPTER_CONFIG}")
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(weights))
    except Exception as e:  # safetensors raises its own error types
        raise ConfigError(f"{flag} {path}: unreadable {ADAPTER_WEIGHTS} ({e})") from None
    spec = LoraSpec(
        int(config.get("r", 8)),
        float(config.get("lora_alpha", 8)),
        float(config.get("lora_dropout", 0.0)),
        tuple(targets),
    )
    return spec, tensors


ALL_LINEAR = "all-linear"  # peft's shorthand: every dense layer but the output's


def peft_targets(
    targets: Sequence[str], dense: Sequence[str], layers: int, source: str
) -> tuple[str, ...]:
    """peft's `target_modules` (`read_adapter`'s `LoraSpec.targets`) as jaxtpu's --lora-targets,
    the layer kind's `dense` layers it names, in their order, read as peft reads them: a
    module whose name is a target or ends in `.target` (`q_proj`, `self_attn.q_proj`, or a
    full `model.layers.3.self_attn.q_proj`), or `all-linear`. One line refuses a target that
    is not one of `dense` (peft's `lm_head`, a `score`) or a layer set that is not every one of
    the `layers` (jaxtpu adapts a projection in every layer)."""
    if list(targets) == [ALL_LINEAR]:
        return tuple(dense)
    layers_of: dict[str, set[int] | None] = {}  # None: every layer
    for target in targets:
        name = target.rsplit(".", 1)[-1]
        if name not in dense:
            raise ConfigError(
                f"{source}: target_modules {target!r} is not a dense layer jaxtpu adapts "
                f"(one of {', '.join(dense)})"
            )
        at = re.search(r"(?:^|\.)layers\.(\d+)\.", target)
        if at is None:
            layers_of[name] = None
        elif layers_of.get(name, set()) is not None:
            layers_of.setdefault(name, set()).add(int(at.group(1)))  # type: ignore[union-attr]
    for name, found in layers_of.items():
        if found is not None and found != set(range(layers)):
            raise ConfigError(
                f"{source}: target_modules adapt {name} in layers {sorted(found)} of {layers}; "
                "jaxtpu adapts a dense layer in every layer"
            )
    return tuple(d for d in dense if d in layers_of)


def split_adapter(
    tensors: dict[str, np.ndarray], encoder_prefix: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An adapter's tensors (peft's saved keys, `adapter_tensors`) -> (the adapters by their
    Hugging Face keys below the encoder, the head's tensors by its keys)."""
    encoder, head = {}, {}
    inner = f"{PEFT_PREFIX}{encoder_prefix}."
    for key, value in tensors.items():
        if key.startswith(inner):
            encoder[key[len(inner) :]] = value
        else:
            head[key.removeprefix(PEFT_PREFIX)] = value
    return encoder, head
