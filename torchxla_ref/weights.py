"""Hugging Face directories for the torch side: the run's model (a seeded init filled from a
checkpoint through the same checks as the JAX side) and saving it. A seeded torch init saved
here is what both sides start from in parity runs (`parity_tests.harness.shared_init`)."""

from __future__ import annotations

from pathlib import Path

import torch

from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.hf.directory import fit_state_dict, write_hf_dir
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.heads import head_layout, hf_head
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.core.lora import LoraSpec, initial_a, peft_key, read_adapter, split_adapter
from torchxla_ref.models import Classifier


def load_model(spec: ModelSpec, model_dir: str | Path | None, seed: int) -> Classifier:
    """The model of `spec` (`jaxtpu.core.hf.modelspec.ModelSpec`): seeded random init, then
    filled from `model_dir` (encoder, and head if the directory has one) through
    `jaxtpu.core.hf.directory.fit_state_dict`, as on the JAX side. Every key is accounted
    for: a tensor is either loaded or one the checks allow to keep its init (a new head, a
    missing pooler), and `load_state_dict` runs strict. Encoder dropout comes from the
    encoder either way. With LoRA, the loaded model then gets its adapters (`add_adapters`)."""
    enc = spec.encoder
    torch.manual_seed(seed)
    model = Classifier(
        enc, spec.head_dropout, spec.pooling, spec.outputs, spec.head, spec.segment_sep
    )
    if model_dir:
        state = model.state_dict()
        names = {_hf(k): k for k in state}
        expected = {hf: tuple(state[k].shape) for hf, k in names.items()}
        layout = head_layout(enc.model_type, spec.head, spec.answers)
        found, _ = fit_state_dict(model_dir, expected, layout=layout)
        state.update({names[k]: torch.from_numpy(v) for k, v in found.items()})
        model.load_state_dict(state, strict=True)
    if spec.lora:
        add_adapters(model, spec.lora, enc.model_type, seed, spec.precision, spec.adapter)
    return model


def add_adapters(
    model: Classifier,
    lora: LoraSpec,
    model_type: str,
    seed: int,
    precision: str = "fp32",
    adapter: str | None = None,
) -> None:
    """peft's LoRA on the encoder, in place (`get_peft_model` with `LoraConfig`): the base
    frozen, the head trained in full, each adapter A started as the JAX side starts it
    (`jaxtpu.core.lora.initial_a`, B at zero), and in a bf16 (fp16) run every frozen dense
    weight held in bf16 (fp16) (`jaxtpu.core.lora.held_in_bf16`: the kernels; autocast reads
    them in that dtype anyway). `model.bert` becomes the `PeftModel`; a `--head hf` model's
    forward runs through the same, now adapted, layers. `adapter`: a peft adapter directory
    (`--init-from`) whose adapters and head replace the new ones (the JAX side's
    `weights.load_adapter`)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.targets),
        bias="none",
    )
    model.bert = get_peft_model(model.bert, config)
    with torch.no_grad():
        for name, p in model.bert.named_parameters():
            if name.endswith("lora_A.default.weight"):
                key = peft_key(name)
                rank, fan_in = p.shape
                p.copy_(torch.from_numpy(initial_a(key, fan_in, rank, seed)))
            elif name.endswith("lora_B.default.weight"):
                p.zero_()
        if adapter:
            _, tensors = read_adapter(adapter)
            encoder, head = split_adapter(tensors, hf_head(model_type).prefix)
            found = {**encoder, **head}
            for name, p in model.named_parameters():
                if not p.requires_grad:
                    continue
                key = peft_key(name.removeprefix("bert.")).removeprefix("head.")
                if key not in found or tuple(found[key].shape) != tuple(p.shape):
                    raise CheckpointError(
                        f"--init-from {adapter}: {key} is missing or of another shape; an "
                        "adapter of another model or rank"
                    )
                p.copy_(torch.from_numpy(found[key]))
        if precision in ("bf16", "fp16"):
            held = torch.bfloat16 if precision == "bf16" else torch.float16
            for module in model.bert.modules():
                if isinstance(module, torch.nn.Linear) and not module.weight.requires_grad:
                    module.weight.data = module.weight.data.to(held)


def _hf(key: str) -> str:
    """Module key -> Hugging Face key (the encoder as its family's plain AutoModel, the
    family's own head in its `*ForSequenceClassification` keys)."""
    return key.removeprefix("bert.").removeprefix("head.")


def save_hf(
    model: Classifier,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None,
    head_meta: dict | None = None,
    classifier: dict | None = None,
) -> Path:
    """Writes encoder (its family's keys), head and tokenizer as a Hugging Face directory
    (with `classifier`, an `hf` head's config.json keys: a `*ForSequenceClassification`
    one)."""

    def numpy(sd: dict, prefix: str = "") -> dict:
        return {prefix + k: v.detach().float().cpu().numpy() for k, v in sd.items()}

    enc = EncoderConfig.from_hf_dict(model.bert.config.to_dict())
    encoder = numpy(model.bert.state_dict())
    if model.head_kind == "hf":
        head = numpy(model.head.state_dict())
    else:
        head = numpy(model.classifier.state_dict(), "classifier.")
    return write_hf_dir(out_dir, enc, encoder, head, tokenizer_dir, head_meta, classifier)
