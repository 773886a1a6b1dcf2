"""`python -m jaxtpu.export`: write a run's best model for PyTorch.

`--format hf` (default): a Hugging Face directory. A run with the family's own head (`--head
hf`) exports a `*ForSequenceClassification` checkpoint that
`transformers.AutoModelForSequenceClassification.from_pretrained(DIR)` and
`pipeline("text-classification", model=DIR)` load, with the task's labels (`id2label`) and
`problem_type`. A run with jaxtpu's head exports the encoder, which
`transformers.AutoModel.from_pretrained(DIR)` loads, plus `head.safetensors`
(`nn.Linear(hidden, outputs)`: one output per score of the task, six for multilabel), which
only jaxtpu and `torchxla_ref.weights.load_model` read.

`--format onnx [--quantize int8]`: a directory of `model.onnx` (and `model_int8.onnx`), the
tokenizer and `jaxtpu_onnx.json`, for onnxruntime on a CPU: the run's torch model exported by
torch's exporter (`torchxla_ref.onnxexport`), checked against jaxtpu's scores as it is written.

`--format state-dict`: one `torch.save` file of a training notebook's module, the encoder under
`--encoder-prefix` and the head as `--head-name` (default `bert.*` + `fc1.*`, the PyTorch/XLA
Jigsaw notebook's `BERTBaseUncased`), which that module class loads with
`load_state_dict(torch.load(FILE), strict=True)`. The reverse of `--init-from`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxtpu.core import calibration, storage
from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
from jaxtpu.core.errors import UserError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.hf.directory import save_tensors
from jaxtpu.core.hf.heads import architecture, classifier_fields, head_layout, hf_head
from jaxtpu.core.hf.statedict import notebook_state_dict
from jaxtpu.core.hf.tokenizer_dir import export_tokenizer
from jaxtpu.core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config, adapter_tensors
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.serving import card as cards
from jaxtpu.core.serving.attributes import recorded_map
from jaxtpu.core.storage import check_output_path
from jaxtpu.core.versions import installed
from jaxtpu.engine import weights
from jaxtpu.engine.scoring import load_trained, params_digest


def save_state_dict(tensors: dict, out: Path) -> None:
    """`torch.save` of numpy tensors, atomically (a killed export leaves no half file)."""
    try:
        import torch
    except ImportError:
        raise UserError("--format state-dict writes a torch file: install jaxtpu[torch]") from None
    with atomic_write(out, "wb") as f:
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, f)


_ATTRIBUTE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _check_module_names(encoder_prefix: str, head_name: str) -> None:
    """Refuses names no module can hold: the state dict's keys are `PREFIX.<encoder key>` and
    `HEAD.weight/bias`, attribute paths of the notebook's module."""
    for flag, name in (("--encoder-prefix", encoder_prefix), ("--head-name", head_name)):
        if not _ATTRIBUTE.match(name):
            raise UserError(
                f"{flag} {name!r}: not a module attribute (a Python name such as bert or "
                "model.bert); the notebook's module holds its parts under such names"
            )
    if head_name == encoder_prefix or head_name.startswith(encoder_prefix + "."):
        raise UserError(
            f"--head-name {head_name!r} is inside --encoder-prefix {encoder_prefix!r}: the head "
            "would be read back as a part of the encoder; give the head its own name (e.g. fc1)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "export",
        "Export the best checkpoint of a run as a Hugging Face directory, as ONNX for CPU "
        "scoring, or as the state-dict file of a PyTorch training notebook's module.",
    )
    args = p.parse_args(argv)
    with user_errors():
        check_command_flags("export", args)
        _check_output(args)
        model = load_trained(args.workdir)
        spec_task = model.spec.task
        outputs = [*spec_task.label_columns, *(spec_task.aux_columns if args.all_outputs else ())]
        params = model.params
        layout = head_layout(model.spec.encoder.model_type, model.spec.head)
        if spec_task.aux_columns and not args.all_outputs:
            params = task_head(params, spec_task.main_outputs, layout.output)
        lora = model.spec.lora
        if args.merge and not lora:
            raise UserError(
                f"--merge merges a LoRA run's adapters into its weights; {args.workdir} trained "
                "every weight (no --lora-rank): export it without --merge"
            )
        if lora and args.format == "hf" and not args.merge:
            if layout.kind != "hf":
                raise UserError(
                    "this LoRA run trained jaxtpu's head, which is not a transformers module, so "
                    "its adapters are not a peft adapter of a transformers classifier: export it "
                    "with --merge"
                )
            _export_adapter(args, model, params, outputs)
            _say_prompt(model)
            return 0
        if lora:
            params = weights.merge_adapters(params, lora)
            print(f"merged the run's adapters ({lora.describe()}) into its weights")
        if args.format == "state-dict":
            if layout.kind == "hf":
                raise UserError(
                    "--format state-dict writes a notebook's Linear(hidden, outputs) head; this "
                    "run trained its family's own classification head (--head hf): use --format "
                    "hf"
                )
            _export_state_dict(args, model, params)
        else:
            _export_directory(args, model, params, outputs, layout.kind == "hf")
        _say_prompt(model)
    return 0


def _raw_text(model: Any) -> bool:
    """Whether the export's tokenizer collapses whitespace as jaxtpu did before tokenizing a
    comment (`export_tokenizer`): not for a run that read prompts, whose newlines it kept."""
    return not model.cfg.data.prompt_template


def _say_prompt(model: Any) -> None:
    """A run that read prompts (--prompt-template): the export scores the text it is given,
    so the user must give the same prompts."""
    template = model.cfg.data.prompt_template
    if template:
        print(
            f"this run read each comment inside --prompt-template {template!r}, laid out by "
            "its tokenizer's chat template (when it has one; apply_chat_template with the "
            "prompt as the user message and add_generation_prompt=True): the export scores the "
            "text it is given, so give it those prompts (its tokenizer keeps their whitespace; "
            "collapse the comment's own as jaxtpu did)"
        )


def _check_output(args: argparse.Namespace) -> None:
    """Refuses, before the model is loaded, flags that do not go together and an --out that
    cannot be written."""
    if args.quantize and args.format != "onnx":
        raise UserError("--quantize int8 quantizes an ONNX export: add --format onnx")
    if args.format == "state-dict":
        storage.check_output_file(args.out, "--out", args.overwrite)
        _check_module_names(args.encoder_prefix, args.head_name)
    elif storage.is_remote(args.out):
        storage.check_output_dir(args.out, "--out")
    else:
        check_output_path(Path(args.out), "--out", is_dir=True)


def _export_state_dict(args: argparse.Namespace, model: Any, params: dict) -> None:
    """--format state-dict: one torch.save file of the notebook's module."""
    out, step, task = args.out, model.meta.get("step"), model.cfg.train.task
    encoder, head = weights.to_state_dicts(params, model.spec.encoder.model_type)
    tensors = notebook_state_dict(encoder, head, args.encoder_prefix, args.head_name)
    if storage.is_remote(out):
        save_state_dict(tensors, storage.output_copy(out))
        storage.put(storage.output_copy(out), out)
    else:
        save_state_dict(tensors, Path(out))
    print(
        f"exported step {step} ({task}) as {args.encoder_prefix}.* + "
        f"{args.head_name}.* ({len(tensors)} tensors) to {out}"
    )


def _export_directory(
    args: argparse.Namespace, model: Any, params: dict, outputs: list[str], hf_head: bool
) -> None:
    """--format hf or onnx: a directory that appears only when complete."""
    out, step, task = args.out, model.meta.get("step"), model.cfg.train.task
    head = {
        "task": task,
        "head_dropout": model.cfg.head_dropout,
        "pooling": model.module.pooling,
        # the head's outputs in order (the task's, then --aux-columns' with --all-outputs)
        "outputs": outputs,
        "step": step,
        "metrics": {k: v for k, v in model.meta.items() if k.startswith("val_")},
        **({"prompt_template": p} if (p := model.cfg.data.prompt_template) else {}),
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
    with storage.staged_dir(out) as staging:  # `out` appears only when complete
        if args.format == "onnx":
            meta = onnx_export(model, params, outputs, staging, head, classifier, args.quantize)
        else:
            weights.save_hf(params, enc, staging, None, head, classifier)
            export_tokenizer(model.tokenizer_dir, staging, _raw_text(model))
            carry_calibration(model, outputs, staging / "config.json")
        write_card(args.workdir, model, params, outputs, attrs or [], staging)
    if args.format == "onnx":
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in meta["diffs"].items())
        fused = ", ".join(f"{n} {k}" for k, n in meta["fused_for_onnxruntime"].items())
        fused = fused or "no op (the family's layers stay as exported)"
        print(
            f"exported step {step} ({task}) to {out} as ONNX opset {meta['opset']}: "
            f"{', '.join(meta['files'].values())}; onnxruntime's fused ops in model.onnx: "
            f"{fused}; largest |logit difference| from jaxtpu in fp32 on {len(CHECK_TEXTS)} "
            f"comments: {diffs}"
        )
    elif classifier is None:
        print(
            f"exported step {step} ({task}) to {out}: the encoder for AutoModel and jaxtpu's "
            f"head in head.safetensors, which is not a transformers class (train with --head "
            "hf for a checkpoint AutoModelForSequenceClassification and pipeline() load)"
        )
    else:
        name = architecture(enc.model_type, enc.family.architecture)
        print(f"exported step {step} ({task}) to {out} as a {name} ({', '.join(outputs)})")


def _export_adapter(args: argparse.Namespace, model: Any, params: dict, outputs: list[str]) -> None:
    """--format hf of a LoRA run: a peft adapter directory (`adapter_config.json`,
    `adapter_model.safetensors`: the adapters and the classification head, which trained in
    full) and the tokenizer, for `PeftModel.from_pretrained` on the family's
    `AutoModelForSequenceClassification` of the base model the run started from."""
    import json

    out, step, task = args.out, model.meta.get("step"), model.cfg.train.task
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
    merged = architecture(spec.encoder.model_type, spec.encoder.family.architecture)
    with storage.staged_dir(out) as staging:  # `out` appears only when complete
        save_tensors(tensors, staging / ADAPTER_WEIGHTS)
        (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        export_tokenizer(model.tokenizer_dir, staging, _raw_text(model))
        if model.calibration is not None:  # beside the adapter: peft's config has no room
            calibration.write(staging, model.calibration.subset(outputs))
    print(
        f"exported step {step} ({task}) to {out} as a peft LoRA adapter ({lora.describe()}; "
        f"{len(tensors)} tensors, the head {', '.join(head_modules)} in full) for the base "
        f"model {spec.model_dir}: PeftModel.from_pretrained("
        f"AutoModelForSequenceClassification.from_pretrained(BASE, num_labels={len(outputs)}), "
        f"OUT); --merge writes the merged {merged} instead"
    )


ONNX_TOLERANCE = 1e-4  # largest |logit difference| from jaxtpu in fp32 an export may have
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
    import json

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
    (out / cards.CARD_FILE).write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")


def carry_calibration(model: Any, outputs: list[str], config: Path) -> None:
    """The run's calibration of the exported `outputs` in the export's config.json
    (`calibration.CONFIG_KEY`), which `predict --model-dir` and `serve --model-dir` apply;
    transformers ignores the key (its pipeline() gives the uncalibrated sigmoid)."""
    import json

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
    import json
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
    spec, enc = model.spec, model.spec.encoder
    pooling = model.module.pooling
    hf_dir = out / "hf"
    weights.save_hf(params, enc, hf_dir, None, head_meta, classifier)
    torch_model = load_model(
        enc, 0.0, hf_dir, 0, pooling, len(outputs), spec.head, spec.segment_sep
    )
    shutil.rmtree(hf_dir)
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # inside the staging directory
        raw = onnxexport.export_onnx(torch_model, Path(tmp) / "model.onnx", enc)
        del torch_model
        fused = onnxexport.optimize_for_onnxruntime(raw, out / "model.onnx")
        files = {"fp32": "model.onnx"}
        if quantize:
            files["int8"] = onnxexport.quantize_int8(raw, out / "model_int8.onnx").name
    export_tokenizer(model.tokenizer_dir, out, _raw_text(model))

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
        "head": spec.head,
        "max_len": model.cfg.data.max_len,
        # how a row became the text it scores (`jaxtpu serve --onnx` reads rows so)
        "text_format": {
            "rule_template": model.cfg.data.rule_template,
            "prompt_template": model.cfg.data.prompt_template,
        },
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

    spec = model.spec
    texts: list[Any] = list(CHECK_TEXTS)
    if spec.task.text_pairs:
        texts = [("No insults or personal attacks.", t) for t in texts]
    ids, mask = encode_texts(
        texts, load_tokenizer(model.tokenizer_dir, model.spec.pad_id), model.cfg.data.max_len
    )
    fp32 = create_module(
        spec.encoder,
        0.0,
        "fp32",
        pooling=model.module.pooling,
        outputs=outputs,
        head=spec.head,
        segment_sep=spec.segment_sep,
    )
    ours = np.asarray(fp32.apply({"params": params}, ids, mask), np.float64)
    ours = ours.reshape(len(CHECK_TEXTS), -1)
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
    return {
        kind: float(np.abs(onnxexport.session(out / name).run(None, feeds)[0] - ours).max())
        for kind, name in files.items()
    }


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


if __name__ == "__main__":
    sys.exit(main())
