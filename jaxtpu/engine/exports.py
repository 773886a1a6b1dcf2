"""What `jaxtpu export` writes, for the command to call: a trained model's tensors as a
notebook's state dict, a Hugging Face directory or a peft adapter, its model card and
calibration, and the ONNX graph with its check against jaxtpu's own scores.

The ONNX graph is torch's exporter's of the reference's model of the same weights
(`torchxla_ref.onnxexport`): `torch.onnx` exports a torch module, so this is the one module of
the JAX side that imports the reference (`devtools.codeshape.REFERENCE_IMPORTS`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from jaxtpu.core import calibration, storage
from jaxtpu.core.data import community, templates
from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
from jaxtpu.core.errors import UserError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.hf.directory import save_tensors
from jaxtpu.core.hf.heads import classifier_fields, hf_head
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.core.hf.statedict import notebook_state_dict
from jaxtpu.core.hf.tokenizer_dir import export_tokenizer
from jaxtpu.core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config, adapter_tensors
from jaxtpu.core.serving import card as cards
from jaxtpu.core.serving.attributes import recorded_map
from jaxtpu.core.versions import installed
from jaxtpu.engine import weights
from jaxtpu.engine.scoring import params_digest


def save_state_dict(tensors: dict, out: Path) -> None:
    """`torch.save` of numpy tensors, atomically (a killed export leaves no half file)."""
    try:
        import torch
    except ImportError:
        raise UserError("--format state-dict writes a torch file: install jaxtpu[torch]") from None
    with atomic_write(out, "wb") as f:
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, f)


ONNX_TOLERANCE = 1e-4  # largest |logit difference| from jaxtpu in fp32 an export may have
CHECK_RULE = "No insults or personal attacks."  # a rules model's checks ask about this rule

# Comments of several lengths that an ONNX export is checked on as it is written.
CHECK_TEXTS = (
    "you are a nice person",
    "What a stupid, ignorant thing to say. Nobody cares about your opinion.",
    "ok",
    "Thanks for the edit; I have added the reference to the article as you asked.",
)


def write_card(
    workdir: str, model: Any, params: dict, outputs: list[str], attrs: list, out: Path
) -> None:
    """The run's model card (`GET /v1/model`'s fields: version, validation AUCs and bias
    metrics, calibration, training files' hashes, the run's config) of what the export holds,
    as `model_card.json` (`card.CARD_FILE`)."""
    metrics = cards.numeric(model.meta)
    cal = model.calibration
    _, card = cards.build(
        f"jaxtpu export --workdir {workdir}",
        model.cfg.train.task,
        outputs,
        attrs,
        cards.languages_of(metrics),
        model.cfg,
        metrics,
        model.meta.get("config") or {},
        params_digest(params),
        model.tokenizer_dir,
        None if cal is None else cal.subset(outputs).to_dict(),
        installed("jaxtpu", "unknown"),
    )
    feedback = community.record(workdir)
    if feedback:  # the decisions it learnt from: counts, dates, communities; never a text
        card["feedback"] = feedback
    (out / cards.CARD_FILE).write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")


def carry_calibration(model: Any, outputs: list[str], config: Path) -> None:
    """The run's calibration of the exported `outputs` in the export's config.json
    (`calibration.CONFIG_KEY`), which `predict --model-dir` and `serve --model-dir` apply;
    transformers ignores the key (its pipeline() gives the uncalibrated sigmoid)."""
    if model.calibration is None:
        return
    d = json.loads(config.read_text())
    d[calibration.CONFIG_KEY] = model.calibration.subset(outputs).to_dict()
    config.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")


def _calibration_meta(model: Any, outputs: list[str]) -> dict[str, Any]:
    """jaxtpu_onnx.json's `calibration`: the Platt scaling of each output, for onnxruntime
    users to apply to the graph's logits (sigmoid(scale * logit + shift))."""
    if model.calibration is None:
        return {}
    return {"calibration": model.calibration.subset(outputs).to_dict()}


def onnx_export(
    model: Any,
    params: dict,
    outputs: list[str],
    out: Path,
    head_meta: dict[str, Any],
    classifier: dict[str, Any] | None,
    quantize: str | None,
) -> dict[str, Any]:
    """`--format onnx`: the run's model as ONNX in the (staging) directory `out` (with
    `--quantize int8`, its int8 twin too), its tokenizer, and `jaxtpu_onnx.json`. The graph is
    torch's exporter's of the torch side's model of the same weights, fused for onnxruntime
    (`torchxla_ref.onnxexport`), checked on `CHECK_TEXTS` against jaxtpu's fp32 scores (at most
    `ONNX_TOLERANCE`, else a `UserError`). Returns the metadata written to jaxtpu_onnx.json."""
    import shutil
    import tempfile

    try:
        from torchxla_ref import onnxexport
        from torchxla_ref.weights import load_model
    except ImportError as e:
        raise UserError(
            f"--format onnx needs torch, onnx, onnxscript and onnxruntime ({e.name} is "
            "missing): pip install 'jaxtpu[torch,onnx]'"
        ) from None
    enc = model.spec.encoder
    hf_dir = out / "hf"
    weights.save_hf(params, enc, hf_dir, None, head_meta, classifier)
    torch_model = load_model(_fp32_spec(model, len(outputs)), hf_dir, 0)
    shutil.rmtree(hf_dir)
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # inside the staging directory
        raw = onnxexport.export_onnx(torch_model, Path(tmp) / "model.onnx", enc)
        del torch_model
        fused = onnxexport.optimize_for_onnxruntime(raw, out / "model.onnx")
        files = {"fp32": "model.onnx"}
        if quantize:
            files["int8"] = onnxexport.quantize_int8(raw, out / "model_int8.onnx").name
    export_tokenizer(model.tokenizer_dir, out, model.spec.text_format.collapses_whitespace)

    diffs = _onnx_differences(model, params, len(outputs), out, files)
    if not diffs["fp32"] <= ONNX_TOLERANCE:
        raise UserError(
            f"--format onnx: the exported graph's logits differ from jaxtpu's fp32 ones by "
            f"{diffs['fp32']:.2e} (more than {ONNX_TOLERANCE:g}) on {len(CHECK_TEXTS)} "
            "check comments; nothing was written. Please report this with the run's "
            "config.json"
        )
    meta = {
        "opset": onnxexport.OPSET,
        "files": files,
        "inputs": ["input_ids", "attention_mask"],
        "output": "logits (batch x labels); a label's probability is its sigmoid",
        "labels": outputs,
        "task": head_meta["task"],
        "head": model.spec.head,
        "max_len": model.cfg.data.max_len,
        # how a row became the text it scores (`jaxtpu serve --onnx` reads rows so)
        "text_format": model.spec.text_format.to_dict(),
        **({"attributes": head_meta["attributes"]} if "attributes" in head_meta else {}),
        "metrics": head_meta.get("metrics", {}),
        "step": head_meta["step"],
        "fused_for_onnxruntime": fused,
        **_calibration_meta(model, outputs),
        "check": {
            "texts": len(CHECK_TEXTS),
            **{f"max_abs_logit_diff_{k}_vs_jaxtpu_fp32": v for k, v in diffs.items()},
        },
    }
    (out / "jaxtpu_onnx.json").write_text(json.dumps(meta, indent=2) + "\n")
    meta["diffs"] = diffs
    return meta


def _onnx_differences(
    model: Any, params: dict, outputs: int, out: Path, files: dict[str, str]
) -> dict[str, float]:
    """The largest |logit difference| of each ONNX file from jaxtpu's model of the same params
    in fp32, on `CHECK_TEXTS` (comments of several lengths; a rules model's as the second text
    of pairs, so the token types its graph derives are checked too)."""
    import numpy as np

    from jaxtpu.models.encoder import create_module
    from torchxla_ref import onnxexport

    fmt = model.spec.text_format
    texts: list[Any] = list(CHECK_TEXTS)
    template = templates.template_of(fmt)
    if template is not None:  # a rules row's pair, or each row's prompt: its columns a rule
        first = template.render(dict.fromkeys(template.fields, CHECK_RULE))
        texts = [(first, t) for t in texts]
    ids, mask = encode_texts(
        texts,
        load_tokenizer(model.tokenizer_dir, model.spec.pad_id),
        model.cfg.data.max_len,
        fmt.kind,
    )
    fp32 = create_module(_fp32_spec(model, outputs))
    ours = np.asarray(fp32.apply({"params": params}, ids, mask), np.float64)
    ours = ours.reshape(len(CHECK_TEXTS), -1)
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
    return {
        kind: float(np.abs(onnxexport.session(out / name).run(None, feeds)[0] - ours).max())
        for kind, name in files.items()
    }


def _fp32_spec(model: Any, outputs: int) -> ModelSpec:
    """The trained model as both sides build it for the ONNX graph and its check: fp32, no
    dropout, no adapters (they are merged), its `outputs` (the task's, or every one), its
    head the trained one the export holds (no answer tokens to start one from)."""
    spec = model.spec.model_spec(model.cfg, scan=False)
    return dataclasses.replace(
        spec,
        head_dropout=0.0,
        precision="fp32",
        outputs=outputs,
        lora=None,
        adapter=None,
        answers=(),
        remat="none",
        matmul_output="fp32",
        pooling=model.module.pooling,
    )


def task_head(params: dict, outputs: int, output: str = "classifier") -> dict:
    """`params` with the head's last dense layer (`output`, its module path: `classifier`,
    RoBERTa's own `classifier.out_proj`) cut to its first `outputs` outputs (the task's own,
    before the auxiliary targets')."""
    *path, last = output.split(".")

    def cut(tree: dict, keys: list[str]) -> dict:
        if not keys:
            dense = tree[last]
            return {
                **tree,
                last: {"kernel": dense["kernel"][:, :outputs], "bias": dense["bias"][:outputs]},
            }
        return {**tree, keys[0]: cut(tree[keys[0]], keys[1:])}

    return cut(params, path)


def state_dict_file(model: Any, params: dict, out: str, prefix: str, head_name: str) -> int:
    """--format state-dict: the notebook's module's `torch.save` file at `out` (local or in a
    bucket), the encoder under `prefix` and the head as `head_name`; returns its tensors."""
    encoder, head = weights.to_state_dicts(params, model.spec.encoder.model_type)
    tensors = notebook_state_dict(encoder, head, prefix, head_name)
    if storage.is_remote(out):
        save_state_dict(tensors, storage.output_copy(out))
        storage.put(storage.output_copy(out), out)
    else:
        save_state_dict(tensors, Path(out))
    return len(tensors)


def directory(
    model: Any,
    params: dict,
    outputs: list[str],
    hf_head: bool,
    out: str,
    workdir: str,
    fmt: str,
    quantize: str | None,
) -> dict[str, Any]:
    """--format hf or onnx: the export directory at `out`, which appears only when complete,
    with its model card; returns the ONNX metadata (`onnx_export`), {} for hf."""
    step, task = model.meta.get("step"), model.cfg.train.task
    head = {
        "task": task,
        "head_dropout": model.cfg.head_dropout,
        "pooling": model.module.pooling,
        # the head's outputs in order (the task's, then --aux-columns' with --all-outputs)
        "outputs": outputs,
        "step": step,
        "metrics": {k: v for k, v in model.meta.items() if k.startswith("val_")},
        # how each row became its text (`jaxtpu.core.textformat`), as the run's config.json
        "text_format": model.spec.text_format.to_dict(),
    }
    # the Perspective attributes `jaxtpu serve` answers with it (the run's --attributes)
    attrs = recorded_map(outputs, bool(model.spec.task.text_pairs), model.cfg.output.attributes)
    if attrs:
        head["attributes"] = attrs
    enc = model.spec.encoder
    classifier = None
    if hf_head:
        classifier = classifier_fields(
            enc.model_type, tuple(outputs), task, model.cfg.head_dropout, model.module.pooling
        )
    meta: dict[str, Any] = {}
    with storage.staged_dir(out) as staging:  # `out` appears only when complete
        if fmt == "onnx":
            meta = onnx_export(model, params, outputs, staging, head, classifier, quantize)
        else:
            weights.save_hf(params, enc, staging, None, head, classifier)
            export_tokenizer(
                model.tokenizer_dir, staging, model.spec.text_format.collapses_whitespace
            )
            carry_calibration(model, outputs, staging / "config.json")
        write_card(workdir, model, params, outputs, attrs or [], staging)
    return meta


def adapter(model: Any, params: dict, outputs: list[str], out: str) -> tuple[int, list[str]]:
    """--format hf of a LoRA run: a peft adapter directory at `out` (`adapter_config.json`,
    `adapter_model.safetensors`: the adapters and the classification head, which trained in
    full) and the tokenizer, for `PeftModel.from_pretrained` on the family's
    `AutoModelForSequenceClassification` of the base model the run started from. Returns
    (tensors, the head's modules)."""
    spec, lora = model.spec, model.spec.lora
    layout = hf_head(spec.encoder.model_type)
    encoder, head = weights.to_state_dicts(params, spec.encoder.model_type)
    tensors = adapter_tensors(encoder, head, layout.prefix)
    head_modules = sorted({key.split(".", 1)[0] for key in head})
    # peft loads the base from this path: absolute, so the adapter works from any directory
    base = spec.model_dir
    if base and Path(base).exists():
        base = str(Path(base).resolve())
    config = adapter_config(lora, base, head_modules)
    with storage.staged_dir(out) as staging:  # `out` appears only when complete
        save_tensors(tensors, staging / ADAPTER_WEIGHTS)
        (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        export_tokenizer(model.tokenizer_dir, staging, model.spec.text_format.collapses_whitespace)
        if model.calibration is not None:  # beside the adapter: peft's config has no room
            calibration.write(staging, model.calibration.subset(outputs))
    return len(tensors), head_modules
