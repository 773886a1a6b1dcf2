"""`python -m jaxtpu.export`: write a run's best model for PyTorch.

`--format hf` (default): a Hugging Face directory. A run with the family's own head (`--head
hf`) exports a `*ForSequenceClassification` checkpoint that
`transformers.AutoModelForSequenceClassification.from_pretrained(DIR)` and
`pipeline("text-classification", model=DIR)` load, with the task's labels (`id2label`) and
`problem_type`. A run with jaxtpu's head exports the encoder, which
`transformers.AutoModel.from_pretrained(DIR)` loads, plus `head.safetensors`
(`nn.Linear(hidden, outputs)`: one output per score of the task, six for multilabel), which
only jaxtpu and `torchxla_ref.weights.load_model` read.

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

from jaxtpu.core.errors import UserError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.hf.heads import architecture, classifier_fields, head_layout
from jaxtpu.core.run.rundir import check_output_path, user_errors


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
    p = argparse.ArgumentParser(
        prog="python -m jaxtpu.export",
        description="Export the best checkpoint of a run as a Hugging Face directory, or as "
        "the state-dict file of a PyTorch training notebook's module.",
    )
    p.add_argument("--workdir", required=True, help="Run directory written by jaxtpu.train.")
    p.add_argument(
        "--out",
        required=True,
        help="--format hf: a new (or empty) directory; state-dict: a new file (e.g. model.bin).",
    )
    p.add_argument(
        "--format",
        choices=("hf", "state-dict"),
        default="hf",
        help="hf: Hugging Face directory (a --head hf run: a *ForSequenceClassification "
        "checkpoint + tokenizer; a --head jaxtpu run: the encoder + head.safetensors + "
        "tokenizer); state-dict: "
        "one torch.save file for the notebook's module [default: hf].",
    )
    p.add_argument(
        "--encoder-prefix",
        default="bert",
        help="state-dict: the module attribute holding the encoder (BertModel, RobertaModel, "
        "...) [default: bert; Lightning notebooks often use model].",
    )
    p.add_argument(
        "--head-name",
        default="fc1",
        help="state-dict: the module attribute holding the Linear(hidden, 1) head [default: fc1].",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="state-dict: replace an existing --out."
    )
    p.add_argument(
        "--all-outputs",
        action="store_true",
        help="A run trained with --aux-columns: keep the head's auxiliary outputs (listed in "
        "jaxtpu_head.json) after the task's own; without it the head is the task's alone, "
        "what a run without them has.",
    )
    args = p.parse_args(argv)
    with user_errors():
        from jaxtpu import weights
        from jaxtpu.core.hf.directory import notebook_state_dict
        from jaxtpu.predict import load_trained

        out = Path(args.out)
        state_dict = args.format == "state-dict"
        check_output_path(out, "--out", is_dir=not state_dict)
        if state_dict and out.exists() and not args.overwrite:
            raise UserError(f"--out {out} exists; pass --overwrite to replace it")
        if state_dict:
            _check_module_names(args.encoder_prefix, args.head_name)
        model = load_trained(args.workdir)
        step, task = model.meta.get("step"), model.cfg.train.task
        spec_task = model.spec.task
        outputs = [*spec_task.label_columns, *(spec_task.aux_columns if args.all_outputs else ())]
        params = model.params
        layout = head_layout(model.spec.encoder.model_type, model.spec.head)
        if spec_task.aux_columns and not args.all_outputs:
            params = task_head(params, spec_task.main_outputs, layout.output)
        if state_dict and layout.kind == "hf":
            raise UserError(
                "--format state-dict writes a notebook's Linear(hidden, outputs) head; this run "
                "trained its family's own classification head (--head hf): use --format hf"
            )
        if state_dict:
            encoder, head = weights.to_state_dicts(params, model.spec.encoder.model_type)
            tensors = notebook_state_dict(encoder, head, args.encoder_prefix, args.head_name)
            save_state_dict(tensors, out)
            print(
                f"exported step {step} ({task}) as {args.encoder_prefix}.* + "
                f"{args.head_name}.* ({len(tensors)} tensors) to {out}"
            )
            return 0
        head = {
            "task": task,
            "head_dropout": model.cfg.head_dropout,
            "pooling": model.module.pooling,
            # the head's outputs in order (the task's, then --aux-columns' with --all-outputs)
            "outputs": outputs,
            "step": step,
            "metrics": {k: v for k, v in model.meta.items() if k.startswith("val_")},
        }
        enc = model.spec.encoder
        classifier = None
        if layout.kind == "hf":
            classifier = classifier_fields(
                enc.model_type, tuple(outputs), task, model.cfg.head_dropout, model.module.pooling
            )
        weights.save_hf(params, enc, out, model.tokenizer_dir, head, classifier)
        if classifier is None:
            print(
                f"exported step {step} ({task}) to {out}: the encoder for AutoModel and jaxtpu's "
                f"head in head.safetensors, which is not a transformers class (train with --head "
                "hf for a checkpoint AutoModelForSequenceClassification and pipeline() load)"
            )
        else:
            name = architecture(enc.model_type, enc.family.architecture)
            print(f"exported step {step} ({task}) to {out} as a {name} ({', '.join(outputs)})")
    return 0


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
