"""The flags of every command besides the trainers' (framework-free): one dataclass of fields per
command, each field with its help, choices, bounds and how the command line takes it, so that
`--help`, the checks of numeric values and the docs' flag reference come from one place, as
the training flags' do (`core.flags.schema`). The scoring flags the commands share
(`--num-devices`, `--batch-size`, `--max-len`, `--chunk-rows`) are `schema.ScoringConfig`'s.

A command builds its parser with `command_parser(name)` and checks what it parsed with
`check_command_flags(name, args)`; `command_reference()` is the docs' page section.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.cli import (
    _bounds_text,
    _Parser,
    add_scoring_flags,
    check_scoring_flags,
)
from jaxtpu.core.flags.fields import _c, _no_calibration
from jaxtpu.core.flags.schema import Bounds, ScoringConfig, base_type
from jaxtpu.core.flags.serving import (
    FeedbackDeleteFlags,
    FeedbackExportFlags,
    HeadFlags,
    HistoryCompareFlags,
    HistoryImportFlags,
    HistoryScaleFlags,
    ServeFlags,
    ShadowReportFlags,
)


@dataclass(frozen=True)
class PredictFlags:
    workdir: list[str] | None = _c(
        None,
        "Run directory written by jaxtpu.train (its best model); several (the folds or seeds of "
        "one recipe) are an ensemble: the mean of their probabilities (rankers: of their "
        "scores).",
        nargs="+",
        one_of="source",
    )
    init_from: str | None = _c(
        None,
        "Instead of a run: a PyTorch training notebook's state-dict file (.bin/.pt, or a "
        "Lightning .ckpt) with a BERT encoder and a Linear(hidden, 1) head; needs --model-dir.",
        one_of="source",
    )
    model_dir: str | None = _c(
        None,
        "Alone: a fine-tuned classifier to score (a *ForSequenceClassification checkpoint of "
        "one score or the six Jigsaw labels, or a jaxtpu export). With --init-from: the Hugging "
        "Face directory with the model's config.json and tokenizer ('minilm' = the packaged "
        "MiniLM).",
    )
    input: str | None = _c(
        None,
        "File to score (CSV, or .parquet/.pq, .jsonl/.ndjson): comments_to_score.csv "
        "(comment_id,text), comment_text (or the Multilingual test.csv's content) with an "
        "optional id, or for a rules run an Agile Community Rules test.csv (row_id, body, "
        "rule, ...; written as row_id,rule_violation).",
        required=True,
    )
    output: str | None = _c(None, "Where to write the scores (CSV).", required=True)
    overwrite: bool = _c(False, "Replace an existing --output.")
    pseudo_label: bool = _c(
        False,
        "Write a training file instead of scores: id, comment_text and the model's (an "
        "ensemble's mean) probability of each label as a soft target, for `jaxtpu train "
        "--extra-train` (the Multilingual winners' pseudo-labelling round). Empty comments are "
        "left out.",
    )
    confidence: float | None = _c(
        None,
        "With --pseudo-label: keep only the comments whose toxic probability is >= C or <= 1 - "
        "C (0.5 < C < 1). [default: every comment]",
    )
    label_weights: str | None = _c(
        None,
        "A multilabel model on a Rate Severity file (comment_id, text): score each comment by "
        "these weights of its six label probabilities (w1,...,w6 in the order toxic, "
        "severe_toxic, obscene, threat, insult, identity_hate; `jaxtpu severity-weights` "
        "searches them) instead of the built-in severity weights.",
    )
    all_outputs: bool = _c(
        False,
        "Also write the probability of each auxiliary target of a run trained with "
        "--aux-columns (after the task's own columns); without it, the task's columns alone.",
    )
    rank_by_rule: bool = _c(
        False,
        "An Agile Community Rules test file (row_id, body, rule, ...) scored by a rules run or "
        "an ensemble of them: write each model's score ranked among its rule's rows, scaled to "
        "[0, 1] and averaged over the models (the medal solutions' blend), instead of the mean "
        "probability. The runs may be of different families and tokenizers (a decoder's "
        "prompts beside an encoder's pairs): each reads the rows with its own template. Each "
        "rule's AUC is unchanged; the file is scored in one chunk.",
    )
    no_calibration: bool = _no_calibration()
    resume: bool = _c(
        False,
        "Continue a predict into --output that was stopped (killed, preempted) from its last "
        "finished chunk; the file it ends with is the one an uninterrupted run writes. Refused "
        "when the input, models or settings differ.",
    )


@dataclass(frozen=True)
class EvaluateFlags:
    workdir: str | None = _c(
        None, "Run directory written by jaxtpu.train.", required=True, one_of="source"
    )  # required: this or --model-dir
    model_dir: str | None = _c(
        None,
        "Instead of a run: a fine-tuned classifier directory, a *ForSequenceClassification "
        "checkpoint (transformers', or an export of a --head hf run; one score or the six "
        "Jigsaw labels) or a jaxtpu export, scored in fp32 with no training run.",
        one_of="source",
    )
    input: str | None = _c(
        None,
        "Labelled file (CSV, Parquet or JSON Lines): comment_text (or content) with toxic or "
        "target [+ the six labels, identity columns, lang], or less_toxic, more_toxic pairs for "
        "a ranking run.",
        required=True,
    )
    out: str | None = _c(
        None, "Also write the metric and every part as JSON here ({metric, value, ...})."
    )
    label_weights: str | None = _c(
        None,
        "A multilabel run on a pairs file: score each comment by these weights of its six "
        "label probabilities (w1,...,w6 in the order toxic, severe_toxic, obscene, threat, "
        "insult, identity_hate; `jaxtpu severity-weights` searches them) and report agreement.",
    )
    overwrite: bool = _c(False, "Replace an existing --out.")


ONNX_OPSET = 18  # torchxla_ref.onnxexport.OPSET (kept here so --help needs no torch)


@dataclass(frozen=True)
class ExportFlags:
    workdir: str | None = _c(None, "Run directory written by jaxtpu.train.", required=True)
    out: str | None = _c(
        None,
        "--format hf, onnx: a new (or empty) directory; state-dict: a new file (e.g. model.bin).",
        required=True,
    )
    format: str = _c(
        "hf",
        "hf: Hugging Face directory (a --head hf run: a *ForSequenceClassification checkpoint "
        "+ tokenizer; a --head jaxtpu run: the encoder + head.safetensors + tokenizer); onnx: "
        "model.onnx (input_ids, attention_mask -> logits, dynamic batch and length, opset "
        f"{ONNX_OPSET}) + tokenizer + jaxtpu_onnx.json, for onnxruntime; state-dict: one "
        "torch.save file for the notebook's module.",
        choices=("hf", "onnx", "state-dict"),
    )
    quantize: str | None = _c(
        None,
        "--format onnx: also write model_int8.onnx, onnxruntime's dynamic int8 quantization "
        "(int8 weights, activations quantized per batch): smaller and usually faster on a CPU; "
        "`jaxtpu evaluate`-style AUCs of both are in docs/elsewhere.md.",
        choices=("int8",),
    )
    encoder_prefix: str = _c(
        "bert",
        "state-dict: the module attribute holding the encoder (BertModel, RobertaModel, ...); "
        "Lightning notebooks often use model.",
    )
    head_name: str = _c(
        "fc1", "state-dict: the module attribute holding the Linear(hidden, 1) head."
    )
    overwrite: bool = _c(False, "state-dict: replace an existing --out.")
    merge: bool = _c(
        False,
        "A LoRA run (--lora-rank): write the plain model, each adapter merged into its layer's "
        "weight (W + alpha/r A B, peft's merge_and_unload), instead of the peft adapter "
        "directory (adapter_config.json + adapter_model.safetensors) that --format hf writes "
        "for one. ONNX and state-dict exports of a LoRA run are always merged.",
    )
    all_outputs: bool = _c(
        False,
        "A run trained with --aux-columns: keep the head's auxiliary outputs (listed in "
        "jaxtpu_head.json) after the task's own; without it the head is the task's alone, what "
        "a run without them has. A --perspective run keeps them always (its learnt attributes).",
    )


@dataclass(frozen=True)
class SeverityFlags:
    workdir: list[str] | None = _c(
        None,
        "A multilabel run directory; several: their mean probabilities.",
        nargs="+",
        required=True,
    )
    input: str | None = _c(None, "Validation pairs file (less_toxic, more_toxic).", required=True)
    step: float = _c(0.1, "Grid step of each weight.", bounds=Bounds(0, 10, lo_open=True))
    top: float = _c(2.0, "Largest weight on the grid.", bounds=Bounds(0, 1000, lo_open=True))
    out: str | None = _c(None, "Also write the weights and agreements as JSON here.")


@dataclass(frozen=True)
class LrFindFlags:
    # checked together by the command: 0 < start < end
    start_lr: float = _c(1e-7, "Rate of the first step.")
    end_lr: float = _c(1.0, "Rate of the last step.")
    lr_find_steps: int = _c(
        100,
        "Steps of the sweep (one optimizer update each; the data repeat if the training set "
        "has fewer batches).",
        bounds=Bounds(5, 10**6),
    )
    out: str = _c(
        "lr-find",
        "Directory for lr_find.csv and lr_find.png (never a run directory: no checkpoint is "
        "written).",
    )


@dataclass(frozen=True)
class PreflightFlags:
    target: str = _c(
        "cpu",
        "Where the run would train: cpu (this machine's --num-devices devices; capacity = host "
        "RAM / devices) or a TPU slice, compiled here by libtpu (`jaxtpu preflight --help` "
        "lists each with its topology and memory).",
    )
    sweep: str | None = _c(
        None,
        "Compile every memory option (--sharding replicated/zero1/fsdp x --remat "
        "none/layer/dots) instead of only the flags' own, or those listed, e.g. "
        "replicated,zero1,fsdp,fsdp+layer.",
        nargs="?",
        const="all",
        metavar="LIST",
    )
    find_batch: bool = _c(
        False,
        "For each configuration, find the largest --batch-size (per device) whose train and "
        "eval steps fit the target, to within 1/8 (doubling or halving from --batch-size, then "
        "bisection; one compilation per batch tried).",
    )
    save_programs: str | None = _c(
        None,
        "Also compile every program the run uses (a train call of each length its buckets use, "
        "an eval batch of each validation length; the data are read as the run reads them) for "
        "--target and save them in DIR, for python -m jaxtpu.train --programs DIR on the "
        "target's machine (the same flags, jax, libtpu and XLA flags), which then compiles "
        "nothing. Not with --sweep or --find-batch.",
        metavar="DIR",
    )
    json: str | None = _c(
        None, "Where to write the reports as JSON [default: runs/preflight/<target>.json]."
    )


@dataclass(frozen=True)
class LaunchFlags:
    tpu: str | None = _c(None, "The TPU VM's name.", required=True)
    zone: str | None = _c(None, "Its zone, e.g. us-west4-a.", required=True)
    project: str = _c("", "Its project [default: gcloud's].")
    accelerator_type: str | None = _c(
        None,
        "What to create, e.g. v5litepod-8 (Kaggle's v5e-8 shape), v6e-8, v4-8.",
        required=True,
    )
    version: str = _c("tpu-ubuntu2204-base", "The TPU software version to create it with.")
    spot: bool = _c(False, "Create it as a spot VM.")
    setup: str = _c(
        "",
        'A shell command run on every worker after each creation, e.g. "pip install '
        "'jaxtpu[tpu,gcs]'\" [default: none: the image has jaxtpu].",
    )
    retries: int = _c(
        10, "Attempts after the first when the VM is preempted.", bounds=Bounds(0, 10**6)
    )
    retry_wait: float = _c(
        150.0,
        "Seconds between attempts (longer than the run directory's lease, so a killed run's "
        "lease has expired when the next attempt starts).",
        bounds=Bounds(0, 10**6),
    )
    python: str = _c("python3", "The workers' Python.")
    gcloud: str = _c("gcloud", "The gcloud command.")


@dataclass(frozen=True)
class Command:
    """One command's flags: its own (`flags`) and the shared scoring flags it takes
    (`scoring`; those in `unset` default to None, so the command can tell they were not
    given)."""

    prog: str
    flags: type
    scoring: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()


COMMANDS: dict[str, Command] = {
    "predict": Command(
        "python -m jaxtpu.predict",
        PredictFlags,
        ("max_len", "num_devices", "batch_size", "chunk_rows"),
        ("max_len",),
    ),
    "evaluate": Command(
        "python -m jaxtpu.evaluate",
        EvaluateFlags,
        ("max_len", "num_devices", "batch_size"),
        ("max_len",),
    ),
    "export": Command("python -m jaxtpu.export", ExportFlags),
    "severity-weights": Command(
        "jaxtpu severity-weights", SeverityFlags, ("num_devices", "batch_size")
    ),
    "lr-find": Command("jaxtpu lr-find", LrFindFlags),
    "preflight": Command("jaxtpu preflight", PreflightFlags),
    "launch": Command("jaxtpu launch", LaunchFlags),
    "serve": Command("jaxtpu serve", ServeFlags, ("max_len", "num_devices"), ("max_len",)),
    "feedback delete": Command("jaxtpu feedback delete", FeedbackDeleteFlags),
    "feedback export": Command("jaxtpu feedback export", FeedbackExportFlags),
    "shadow report": Command("jaxtpu shadow report", ShadowReportFlags),
    "history import": Command("jaxtpu history import", HistoryImportFlags),
    "history fit-scale": Command(
        "jaxtpu history fit-scale", HistoryScaleFlags, ("num_devices", "batch_size")
    ),
    "history compare": Command(
        "jaxtpu history compare", HistoryCompareFlags, ("num_devices", "batch_size")
    ),
    "head": Command("jaxtpu head", HeadFlags, ("num_devices", "batch_size")),
}


def _help(f: dataclasses.Field) -> str:
    text = f.metadata["help"]
    if "[default:" in text or f.metadata["required"] or f.default in (None, False):
        return text
    return f"{text} [default: {f.default}]"


def add_command_flags(
    parser: argparse.ArgumentParser,
    name: str,
    choices: Mapping[str, Sequence[str]] | None = None,
    help_text: Mapping[str, str] | None = None,
    grouped: bool = False,
) -> None:
    """Adds command `name`'s flags (`COMMANDS`) to `parser`.

    Args:
      parser: the command's parser.
      name: a key of `COMMANDS`.
      choices: choices known only above core (preflight's TPU targets), by field.
      help_text: help replaced by the command (text known only above core), by field.
      grouped: in a group of their own under the command's name (lr-find's and preflight's
        flags come after the training flags).
    """
    command = COMMANDS[name]
    hints = get_type_hints(command.flags)
    target: Any = parser.add_argument_group(name) if grouped else parser
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(command.flags):
        m = f.metadata
        where = target
        if m["one_of"]:
            required = any(
                g.metadata["required"]
                for g in dataclasses.fields(command.flags)
                if g.metadata["one_of"] == m["one_of"]
            )
            if m["one_of"] not in groups:
                groups[m["one_of"]] = target.add_mutually_exclusive_group(required=required)
            where = groups[m["one_of"]]
        text = (help_text or {}).get(f.name, _help(f))
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": text}
        typ = base_type(hints[f.name])
        if typ is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = str if m["nargs"] in ("+", "*") else typ
            for key in ("nargs", "const", "metavar"):
                if m[key] is not None:
                    kwargs[key] = m[key]
            options = (choices or {}).get(f.name, m["choices"])
            if options:
                kwargs["choices"] = list(options)
            if m["required"] and not m["one_of"]:
                kwargs["required"] = True
        where.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    if command.scoring:
        add_scoring_flags(target, command.scoring, unset=command.unset)


def run_action(
    command: str,
    actions: Mapping[str, tuple[str, Callable[[Sequence[str]], int]]],
    argv: Sequence[str] | None,
) -> int:
    """`jaxtpu COMMAND ACTION [flags]`: the action's function (`actions`: name -> (one line for
    the usage, function of the remaining flags)) on the rest of `argv`; the usage for none or
    --help (0), and for an unknown action on stderr (2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    width = max(map(len, actions)) + 2
    usage = "\n".join(
        [f"usage: jaxtpu {command} ACTION [flags]   (jaxtpu {command} ACTION --help)", ""]
        + [f"  {name:<{width}}{text}" for name, (text, _) in actions.items()]
    )
    if not args or args[0] in ("-h", "--help"):
        print(usage)
        return 0
    if args[0] not in actions:
        print(f"jaxtpu {command}: unknown action {args[0]!r}\n\n{usage}", file=sys.stderr)
        return 2
    return actions[args[0]][1](args[1:])


def command_parser(
    name: str, description: str, epilog: str | None = None, **kwargs: Any
) -> argparse.ArgumentParser:
    """A parser of command `name`'s flags alone (`add_command_flags`' keyword arguments)."""
    parser = _Parser(prog=COMMANDS[name].prog, description=description, epilog=epilog)
    add_command_flags(parser, name, **kwargs)
    return parser


def check_command_flags(name: str, args: argparse.Namespace) -> None:
    """The numeric flags of command `name` given in `args` within their bounds (ConfigError
    naming the flag, what it must be and the value), the scoring flags included."""
    for f in dataclasses.fields(COMMANDS[name].flags):
        bounds, value = f.metadata["bounds"], getattr(args, f.name, None)
        problem = None if bounds is None or value is None else bounds.problem(value)
        if problem:
            raise ConfigError(f"--{f.name.replace('_', '-')} must be {problem}, got {value}")
    check_scoring_flags(args)


def command_reference() -> str:
    """Every command's own flags as Markdown (the docs' flag reference): one table per command
    with the help text, the accepted values and the default."""
    scoring = {f.name: f for f in dataclasses.fields(ScoringConfig)}
    out = []
    for name, command in COMMANDS.items():
        out += [f"## {name}", "", "| flag | what it does | default |", "|---|---|---|"]
        rows = [*dataclasses.fields(command.flags), *(scoring[s] for s in command.scoring)]
        for f in rows:
            notes = []
            group = f.metadata.get("one_of")
            if group:
                members = [
                    g for g in dataclasses.fields(command.flags) if g.metadata["one_of"] == group
                ]
                others = " or ".join(
                    f"`--{g.name.replace('_', '-')}`" for g in members if g is not f
                )
                needed = any(g.metadata["required"] for g in members)
                notes.append(f"this or {others} is required" if needed else f"not with {others}")
            elif f.metadata.get("required"):
                notes.append("required")
            if f.metadata.get("choices"):
                notes.append("one of " + ", ".join(f"`{c}`" for c in f.metadata["choices"]))
            if f.metadata.get("bounds") is not None:
                notes.append("accepts " + _bounds_text(f.metadata["bounds"]))
            text = f.metadata["help"].replace("|", "\\|")
            if notes:
                text += " (" + "; ".join(notes) + ")"
            shown = "" if f.default in (None, "", False) else f"`{f.default}`"
            out.append(f"| `--{f.name.replace('_', '-')}` | {text} | {shown} |")
        out.append("")
    return "\n".join(out)
