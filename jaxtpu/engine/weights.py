"""Hugging Face checkpoint directory <-> Flax params, both directions, and the model a run
starts from (a seeded init, filled from --model-dir).

The directory format and the shape checks are framework-free and shared with the torch side
(`jaxtpu.core.hf.directory`); this module only maps Flax parameter paths to Hugging Face keys:
module paths one to one in BERT's names (`layer_3` is `layer.3`), then the family's rename table
(`jaxtpu.core.hf.families`, e.g. DistilBERT's `transformer.layer.3.attention.q_lin`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config, OptimConfig
from jaxtpu.core.flags.values import is_run_dir
from jaxtpu.core.hf.directory import fit_state_dict, write_hf_dir
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.families import get_family, rename
from jaxtpu.core.hf.heads import head_layout, hf_head
from jaxtpu.core.lora import (
    ADAPTER_LEAVES,
    LoraSpec,
    held_in_bf16,
    initial_a,
    read_adapter,
    split_adapter,
)
from jaxtpu.core.schedules import layer_lr_scale

# The mapping table: Flax leaf name -> (Hugging Face leaf name, transpose?). Module paths map
# one to one, except that Flax's `layer_3` is Hugging Face's `layer.3`.
LEAVES = {
    "kernel": ("weight", True),  # nn.Dense (in, out) <-> nn.Linear (out, in)
    "embedding": ("weight", False),
    "scale": ("weight", False),  # LayerNorm
    "bias": ("bias", False),
    **ADAPTER_LEAVES,  # LoRA's A and B (peft's keys, `jaxtpu.core.lora`)
}


def hf_key(path: tuple[str, ...], model_type: str = "bert") -> str:
    """Flax param path below `bert` (('encoder', 'layer_0', ..., 'kernel')) or of the head
    (('classifier', 'kernel')) -> the family's Hugging Face state-dict key."""
    *modules, leaf = path
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", m) for m in modules]
    return rename(get_family(model_type), ".".join(parts + [LEAVES[leaf][0]]))


def param_name(path: tuple[str, ...], model_type: str = "bert") -> str:
    """A Flax param path -> the torch side's parameter name (`bert.` + the Hugging Face key for
    the encoder, the head's key as it is)."""
    if path[0] == "bert":
        return "bert." + hf_key(path[1:], model_type)
    return hf_key(path, model_type)


def lr_scales(params: Mapping[str, Any], enc: EncoderConfig, cfg: OptimConfig) -> Any:
    """Every leaf's learning-rate multiplier under --layer-lr-decay/--head-lr, by the rule the
    torch side's parameter groups use (`jaxtpu.core.schedules.layer_lr_scale`), for the
    unscanned params (`jaxtpu.models.encoder.stack_for_scan` stacks it as it stacks them)."""
    return _unflatten(
        {
            path: np.float32(
                layer_lr_scale(
                    param_name(path, enc.model_type),
                    enc.num_hidden_layers,
                    cfg.layer_lr_decay,
                    cfg.head_scale,
                    enc.family.kind.embedding_modules,
                )
            )
            for path in _flatten(params)
        }
    )


def _flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple, Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _unflatten(flat: Mapping[tuple, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree


def load_params(
    model_dir: str | Path,
    template: Mapping[str, Any],
    head_required: bool = False,
    model_type: str = "bert",
    head: str = "jaxtpu",
    answers: tuple[int, ...] = (),
) -> tuple[dict[str, Any], list[str]]:
    """Fills a Flax param tree from a Hugging Face directory (see `fit_state_dict`).

    Args:
      model_dir: the checkpoint directory, or a notebook's state-dict file (`--init-from`).
      template: the model's param tree (arrays or ShapeDtypeStructs) giving paths and shapes;
        leaves not found in the checkpoint keep the template's value.
      head_required: fail if the directory has no head (loading a fine-tuned model).
      model_type: the encoder family, whose Hugging Face names the directory uses.
      head: the model's head, 'jaxtpu' or 'hf' (`jaxtpu.core.hf.heads`).
      answers: --token-head's (yes, no) token ids (`RunSpec.answer_ids`), or ().
    Returns:
      (params, kept): the filled tree (numpy fp32) and the HF keys left at their initial value.
    """
    # LoRA adapters are the run's own, never a checkpoint's: they keep the template's value
    every = _flatten(template)
    leaves = {
        hf_key(path[1:] if path[0] == "bert" else path, model_type): (path, leaf)
        for path, leaf in every.items()
        if path[-1] not in ADAPTER_LEAVES
    }
    adapters = {p: leaf for p, leaf in every.items() if p[-1] in ADAPTER_LEAVES}

    def hf_shape(path: tuple[str, ...], leaf: Any) -> tuple[int, ...]:
        return tuple(leaf.shape[::-1] if LEAVES[path[-1]][1] else leaf.shape)

    expected = {key: hf_shape(path, leaf) for key, (path, leaf) in leaves.items()}
    layout = head_layout(model_type, head, answers)
    found, kept = fit_state_dict(model_dir, expected, head_required, layout)
    flat = {p: np.asarray(leaf, np.float32) for p, leaf in adapters.items()}
    for key, (path, leaf) in leaves.items():
        if key in found:
            value = found[key].T if LEAVES[path[-1]][1] else found[key]
            flat[path] = np.ascontiguousarray(value, np.float32)
        else:
            flat[path] = np.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf
    return _unflatten(flat), kept


def to_state_dicts(
    params: Mapping[str, Any], model_type: str = "bert"
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Flax params -> (encoder state dict in the family's Hugging Face keys, head)."""
    encoder, head = {}, {}
    for path, leaf in _flatten(params).items():
        value = np.asarray(leaf, np.float32)
        value = np.ascontiguousarray(value.T if LEAVES[path[-1]][1] else value)
        if path[0] == "bert":
            encoder[hf_key(path[1:], model_type)] = value
        else:
            head[hf_key(path, model_type)] = value
    return encoder, head


def save_hf(
    params: Mapping[str, Any],
    enc: EncoderConfig,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    head_meta: dict[str, Any] | None = None,
    classifier: dict[str, Any] | None = None,
) -> Path:
    """Writes Flax params as a Hugging Face directory (see the module docstring); with
    `classifier` (an `hf` head's config.json keys), a `*ForSequenceClassification` one."""
    encoder, head = to_state_dicts(params, enc.model_type)
    return write_hf_dir(out_dir, enc, encoder, head, tokenizer_dir, head_meta, classifier)


@dataclass
class LoadedModel:
    """A model, its encoder shape and its fp32 params (pretrained, or a seeded random init)."""

    module: Any
    encoder: EncoderConfig
    params: Any
    lr_scales: Any = None  # per-leaf rate multipliers, stacked as params; None = all 1


def load_model(
    cfg: Config, spec: RunSpec, head_required: bool = False, start: Any = None
) -> LoadedModel:
    """The run's model: a seeded random init, filled from the spec's weights (--init-from or
    --model-dir) when it has some (every tensor it has; a new head keeps its init); `start`:
    the params of the run --init-from names (`scoring.load_trained`), which must fill the
    model whole, LoRA adapters included."""
    from jaxtpu.models import encoder as models

    module = models.for_run(cfg, spec, scan=False)
    # Initialised (and mapped from Hugging Face names) as the unscanned model, so a scanned
    # run starts from exactly the same weights, stacked.
    example = spec.task.example_shape(cfg.data.max_len)
    params = models.init_params(module, example, cfg.train.seed)
    from_run = is_run_dir(spec.weights)  # --init-from RUN: its best params, adapters and all
    if from_run:
        if start is None:
            raise ValueError(f"--init-from {spec.weights}: a run's params are given as `start`")
        params = run_params(str(spec.weights), start, params)
    elif spec.weights:
        params, _ = load_params(
            spec.weights,
            params,
            head_required,
            spec.encoder.model_type,
            spec.head,
            spec.answer_ids,
        )
    if spec.lora:
        if not from_run:
            params = start_adapters(params, spec.encoder.model_type, cfg.train.seed)
        if spec.adapter:
            params = load_adapter(params, spec.adapter, spec.encoder.model_type)
        params = hold_frozen(params, cfg.train.precision)
    scales = lr_scales(params, spec.encoder, cfg.optim) if cfg.optim.layerwise else None
    if cfg.model.scan_layers:
        module = models.for_run(cfg, spec)
        params = models.stack_for_scan(spec.encoder, params)
        scales = None if scales is None else models.stack_for_scan(spec.encoder, scales)
    return LoadedModel(module, spec.encoder, params, scales)


def run_params(run: str, params: Any, template: Mapping[str, Any]) -> dict[str, Any]:
    """The best params of jaxtpu run `run` (unscanned) as numpy fp32, which must fill
    `template`'s tree leaf for leaf at the same shapes.

    Raises:
      CheckpointError: the run's model is not this one (a leaf missing, extra or reshaped).
    """
    theirs, ours = _flatten(params), _flatten(template)
    for path in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(path), ours.get(path)
        if a is None or b is None or tuple(a.shape) != tuple(b.shape):
            where = "/".join(path)
            found = "absent" if a is None else str(tuple(a.shape))
            wanted = "absent" if b is None else str(tuple(b.shape))
            raise CheckpointError(
                f"--init-from {run}: its model is not this run's ({where}: {found} there, "
                f"{wanted} here); a run continues the model it was trained as"
            )
    return _unflatten({p: np.asarray(v, np.float32) for p, v in theirs.items()})


def start_adapters(params: Mapping[str, Any], model_type: str, seed: int) -> dict[str, Any]:
    """Every LoRA adapter at its start (`jaxtpu.core.lora.initial_a` for A, zeros for B): the
    A the torch side (peft) starts from too, for the same seed."""
    flat = _flatten(params)
    for path, leaf in flat.items():
        if path[-1] == "lora_a":
            fan_in, rank = leaf.shape
            flat[path] = initial_a(hf_key(path[1:], model_type), fan_in, rank, seed).T
        elif path[-1] == "lora_b":
            flat[path] = np.zeros(leaf.shape, np.float32)
    return _unflatten(flat)


def hold_frozen(params: Mapping[str, Any], precision: str) -> dict[str, Any]:
    """A LoRA run's params as it holds them: in a bf16 (fp16) run every frozen matrix in bf16
    (fp16) (`jaxtpu.core.lora.held_in_bf16` says which), the rest as they are; arrays or, for
    a program's shapes, `jax.ShapeDtypeStruct`s."""
    if precision not in ("bf16", "fp16"):
        return dict(params)
    import jax
    import ml_dtypes

    held = ml_dtypes.bfloat16 if precision == "bf16" else np.float16
    flat = _flatten(params)
    for path, leaf in flat.items():
        if held_in_bf16(path):
            if isinstance(leaf, jax.ShapeDtypeStruct):
                flat[path] = jax.ShapeDtypeStruct(leaf.shape, held)
            else:
                flat[path] = np.asarray(leaf, held)
    return _unflatten(flat)


def merge_adapters(params: Mapping[str, Any], lora: LoraSpec) -> dict[str, Any]:
    """LoRA params -> the plain model's, fp32: each adapted kernel W + (alpha / r) A B, the
    adapters dropped (what peft's `merge_and_unload` does)."""
    flat = {path: np.asarray(leaf, np.float32) for path, leaf in _flatten(params).items()}
    for path in [p for p in flat if p[-1] == "lora_a"]:
        module = path[:-1]
        a, b = flat.pop(path), flat.pop(module + ("lora_b",))
        flat[module + ("kernel",)] = flat[module + ("kernel",)] + np.float32(lora.scaling) * (a @ b)
    return _unflatten(flat)


def load_adapter(params: Mapping[str, Any], adapter: str, model_type: str) -> dict[str, Any]:
    """The adapters and the head of a peft adapter directory (`--init-from`) in place of
    theirs: every adapter of the model and every head tensor must be in it, at its shape."""
    _, tensors = read_adapter(adapter)
    encoder, head = split_adapter(tensors, hf_head(model_type).prefix)
    flat = _flatten(params)
    wanted = {
        (hf_key(path[1:], model_type) if path[0] == "bert" else hf_key(path, model_type)): path
        for path in flat
        if path[-1] in ADAPTER_LEAVES or path[0] != "bert"
    }
    found = {**encoder, **head}
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise CheckpointError(
            f"--init-from {adapter}: {len(missing)} of the model's adapter and head tensors are "
            f"not in it (first: {missing[0]}); it adapts other layers or another model"
        )
    for key, path in wanted.items():
        value = found[key].T if LEAVES[path[-1]][1] else found[key]
        if value.shape != np.shape(flat[path]):
            theirs = np.shape(value.T) if LEAVES[path[-1]][1] else np.shape(value)
            ours = np.shape(flat[path])[:: -1 if LEAVES[path[-1]][1] else 1]
            raise CheckpointError(
                f"--init-from {adapter}: {key} is {tuple(theirs)}, the model's {tuple(ours)}; "
                "an adapter of another model or rank"
            )
        flat[path] = np.ascontiguousarray(value, np.float32)
    return _unflatten(flat)
