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

from jaxtpu.core import storage
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.hf.heads import architecture, head_layout
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.storage import check_output_path
from jaxtpu.core.textformat import PROMPT
from jaxtpu.engine import exports, weights
from jaxtpu.engine.scoring import load_trained

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
        # a --perspective run answers its learnt attributes from its auxiliary outputs
        every = args.all_outputs or model.cfg.train.perspective
        outputs = [*spec_task.label_columns, *(spec_task.aux_columns if every else ())]
        params = model.params
        layout = head_layout(model.spec.encoder.model_type, model.spec.head)
        if spec_task.aux_columns and not every:
            params = exports.task_head(params, spec_task.main_outputs, layout.output)
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


def _say_prompt(model: Any) -> None:
    """A run that read prompts (--prompt-template): the export scores the text it is given,
    so the user must give the same prompts."""
    fmt = model.spec.text_format
    if fmt.kind == PROMPT:
        print(
            f"this run read each comment inside {fmt.describe()}, laid out by "
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
    n = exports.state_dict_file(model, params, args.out, args.encoder_prefix, args.head_name)
    print(
        f"exported step {model.meta.get('step')} ({model.cfg.train.task}) as "
        f"{args.encoder_prefix}.* + {args.head_name}.* ({n} tensors) to {args.out}"
    )


def _export_directory(
    args: argparse.Namespace, model: Any, params: dict, outputs: list[str], hf_head: bool
) -> None:
    """--format hf or onnx: a directory that appears only when complete."""
    out, step, task = args.out, model.meta.get("step"), model.cfg.train.task
    meta = exports.directory(
        model, params, outputs, hf_head, out, args.workdir, args.format, args.quantize
    )
    if args.format == "onnx":
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in meta["diffs"].items())
        fused = ", ".join(f"{n} {k}" for k, n in meta["fused_for_onnxruntime"].items())
        fused = fused or "no op (the family's layers stay as exported)"
        print(
            f"exported step {step} ({task}) to {out} as ONNX opset {meta['opset']}: "
            f"{', '.join(meta['files'].values())}; onnxruntime's fused ops in model.onnx: "
            f"{fused}; largest |logit difference| from jaxtpu in fp32 on "
            f"{len(exports.CHECK_TEXTS)} comments: {diffs}"
        )
    elif not hf_head:
        print(
            f"exported step {step} ({task}) to {out}: the encoder for AutoModel and jaxtpu's "
            f"head in head.safetensors, which is not a transformers class (train with --head "
            "hf for a checkpoint AutoModelForSequenceClassification and pipeline() load)"
        )
    else:
        enc = model.spec.encoder
        name = architecture(enc.model_type, enc.family.architecture)
        print(f"exported step {step} ({task}) to {out} as a {name} ({', '.join(outputs)})")


def _export_adapter(args: argparse.Namespace, model: Any, params: dict, outputs: list[str]) -> None:
    """--format hf of a LoRA run: a peft adapter directory (`exports.adapter`)."""
    spec, lora = model.spec, model.spec.lora
    n, head_modules = exports.adapter(model, params, outputs, args.out)
    merged = architecture(spec.encoder.model_type, spec.encoder.family.architecture)
    print(
        f"exported step {model.meta.get('step')} ({model.cfg.train.task}) to {args.out} as a "
        f"peft LoRA adapter ({lora.describe()}; {n} tensors, the head "
        f"{', '.join(head_modules)} in full) for the base model {spec.model_dir}: "
        f"PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(BASE, "
        f"num_labels={len(outputs)}), OUT); --merge writes the merged {merged} instead"
    )


if __name__ == "__main__":
    sys.exit(main())
