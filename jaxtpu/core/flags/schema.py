"""The flag schema: one frozen configuration tree, each field one flag with everything known
about it, type-checked overrides and validation (framework-free).

Every field carries its help text, choices, accepted values (`Bounds`), whether it may change
on --resume, which side accepts it and whether it may shape the compiled programs (`_f`); the
tables `BOUNDS`, `RESUME_MAY_CHANGE`, `JAX_ONLY` and `OUTSIDE_PROGRAMS` are derived from the
fields. The command-line flag is the field name with dashes
(`batch_size` -> `--batch-size`, see `jaxtpu.core.flags.cli`). Unknown keys are an error that lists
the valid ones, and every value is type-checked when applied. What the flags resolve to (the
encoder, the pooling, the mesh) is `jaxtpu.core.flags.runspec.RunSpec`; presets:
`jaxtpu.core.flags.presets`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.layout import JAX_STRATEGIES, TORCH_STRATEGIES, mesh_sizes
from jaxtpu.core.flags.values import is_run_dir, parse_buckets, parse_trackers
from jaxtpu.core.hf.families import FAMILIES, POOLINGS
from jaxtpu.core.hf.kinds import DECODER_PROJECTIONS
from jaxtpu.core.lora import LoraSpec
from jaxtpu.core.serving.attributes import attribute_map
from jaxtpu.core.tasks import LABEL_COLUMNS, RANKING_MARGIN, TASKS, Task, get_task, monitor_names
from jaxtpu.core.textformat import TextFormat

PRECISIONS = ("fp32", "bf16", "fp16")
# torch.amp.GradScaler's defaults (the Lightning severity notebook's `precision=16`): the scale
# a --precision fp16 run starts from, and the finite steps in a row after which it doubles.
LOSS_SCALE = 2.0**16
LOSS_SCALE_GROWTH_INTERVAL = 2000
SCHEDULES = ("constant", "linear", "cosine", "cosine-restarts", "onecycle")
# How AdamW updates: torch.optim.AdamW's, or the (removed) transformers.AdamW the Kaggle
# notebooks ran, which adds eps before the bias correction and decays after the step.
ADAMW_FORMS = ("torch", "transformers")
# Which parameters AdamW decays: all but biases and LayerNorm (the notebooks' no_decay
# groups), or every one (`AdamW(model.parameters(), weight_decay=...)`).
DECAY_PARAMS = ("not-bias-or-norm", "all")
SCHEDULE_INTERVALS = ("step", "epoch")
# Where the params and AdamW moments live (jaxtpu's jit path; `jaxtpu.engine.parallel`).
SHARDINGS = ("auto", "replicated", "zero1", "fsdp")
# Rematerialisation of each encoder layer in the backward pass (`jaxtpu.models.layers.REMAT`).
REMATS = ("none", "layer", "dots")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Bounds:
    """The values a numeric flag accepts: finite, within [lo, hi] (open ends where said), or
    one of `special` (a sentinel such as -1 = 'the default')."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    special: tuple[float, ...] = ()

    def problem(self, value: float) -> str | None:
        """None when `value` is accepted, else what it must be (for the error message)."""
        if value in self.special:
            return None
        also = "".join(f" or {_num(x)}" for x in self.special)
        if not math.isfinite(value):
            return f"a finite number {self._range()}{also}"
        if value < self.lo or (self.lo_open and value == self.lo):
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}{also}"
        if value > self.hi or (self.hi_open and value == self.hi):
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}{also}"
        return None

    def _range(self) -> str:
        if self.hi == math.inf:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"in {left}{_num(self.lo)}, {_num(self.hi)}{right}"


_INF = math.inf
SIDES = ("both", "jax")


def _f(
    default: Any,
    help: str,
    choices: Sequence[str] | None = None,
    *,
    bounds: Bounds | None = None,
    resume: bool = False,
    side: str = "both",
    program: bool = True,
) -> Any:
    """A config field and everything known about its flag: its help text, its choices, the
    values it accepts (`bounds`, numeric flags), whether it may change when a run is resumed
    (`resume`: how long a run goes, how often it logs and saves, where things live and how
    they are placed, never what is computed), which side accepts it (`side`: 'jax' flags
    are refused by the torch side rather than silently ignored), and whether it may shape
    the compiled programs (`program=False`: where the run writes and what it shows, never
    what is compiled; `--programs` ignores those when it explains why programs differ)."""
    assert side in SIDES, side
    metadata = {"help": help, "choices": choices, "bounds": bounds, "resume": resume}
    return field(default=default, metadata={**metadata, "side": side, "program": program})


def _default_poolings() -> str:
    """'pooler for bert, roberta; cls for ...': each pooling and the families it is the
    default of, from the family table."""
    by = {p: [n for n, fam in FAMILIES.items() if fam.default_pooling == p] for p in POOLINGS}
    return "; ".join(f"{p} for {', '.join(names)}" for p, names in by.items() if names)


@dataclass(frozen=True)
class ModelConfig:
    model_dir: str | None = _f(
        "minilm",
        "Hugging Face checkpoint directory (config.json + model.safetensors or "
        "pytorch_model.bin + tokenizer) of model_type "
        + ", ".join(FAMILIES)
        + " (DeBERTa-v3 is deberta-v2). 'minilm' = the packaged "
        "pretrained all-MiniLM-L6-v2. Empty ('') = random init of a BERT of the shape given by "
        "--num-layers/--hidden-size.",
    )
    init_from: str | None = _f(
        None,
        "Start from the weights of a PyTorch training notebook: a torch.save(model.state_dict())"
        " file (e.g. the PyTorch/XLA notebook's xm.save of BERTBaseUncased: bert.* + a "
        "Linear(hidden, 1) head) or a Lightning .ckpt; the encoder prefix and the head are "
        "detected. Needs --model-dir for config.json and the tokenizer. Or a peft LoRA "
        "adapter directory (adapter_config.json, adapter_model.safetensors: a jaxtpu export of "
        "a LoRA run, or peft's save_pretrained) to continue, on the base model --model-dir, "
        "with the adapter's --lora-rank, --lora-alpha and --lora-targets and --head hf. Or a "
        "jaxtpu run directory (RUN): continue from its best checkpoint, with its task, model "
        "and attribute flags, validating on the newest rows (--time-column time) and beside "
        "that on RUN's own validation rows, both reported against RUN's scores at the end: a "
        "community's model from its moderators' decisions (docs/community.md).",
    )
    tokenizer_dir: str | None = _f(
        None,
        "Directory of the Hugging Face fast tokenizer; default: --model-dir, or the "
        "packaged MiniLM tokenizer for random init.",
    )
    num_layers: int = _f(
        2, "Encoder layers (random init only; a checkpoint sets its own).", bounds=Bounds(1, 256)
    )
    hidden_size: int = _f(64, "Hidden size (random init only).", bounds=Bounds(1, 16384))
    num_heads: int = _f(4, "Attention heads (random init only).", bounds=Bounds(1, 256))
    intermediate_size: int = _f(
        128, "Feed-forward size (random init only).", bounds=Bounds(1, 65536)
    )
    vocab_size: int = _f(
        30522, "Vocabulary size (random init only; e.g. 250002 for XLM-R).", bounds=Bounds(2, 10**7)
    )
    dropout: float = _f(
        -1.0,
        "Dropout before the Dense head; -1 = the task's default ("
        + ", ".join(f"{t.head_dropout} {t.name}" for t in TASKS.values())
        + ").",
        bounds=Bounds(0, 1, hi_open=True, special=(-1.0,)),
    )
    encoder_dropout: float = _f(
        -1.0,
        "Dropout inside the encoder; -1 = the checkpoint's hidden_dropout_prob.",
        bounds=Bounds(0, 1, hi_open=True, special=(-1.0,)),
    )
    remat: str = _f(
        "none",
        "jaxtpu: recompute each encoder layer's activations in the backward pass instead of "
        "keeping them (less activation memory, about one more forward pass of compute). "
        "'layer' keeps only each layer's input; 'dots' also keeps the outputs of the dense "
        "(weight) matmuls and recomputes attention, softmax, GELU and LayerNorm.",
        REMATS,
        resume=True,
        side="jax",
    )
    pooling: str = _f(
        "auto",
        "How a comment becomes one vector for the head: 'pooler' (the checkpoint's pooler, "
        "tanh(Dense(first token)), where the family has one: "
        + ", ".join(name for name, fam in FAMILIES.items() if fam.pooler)
        + "), 'cls' (the first token's hidden state), 'mean' (mean over its real tokens), "
        "'last' (the last token that is not padding: what a decoder's classifier reads). "
        "'auto' = the checkpoint's classifier_pooling where its config names one (ModernBERT, "
        "mmBERT), else the family's default: " + _default_poolings() + ".",
        ("auto",) + POOLINGS,
    )
    head: str = _f(
        "jaxtpu",
        "The head on the encoder: 'jaxtpu' (pooling -> dropout -> Dense, the notebooks' head) "
        "or 'hf', the family's own *ForSequenceClassification head from transformers (BERT's "
        "pooler -> classifier, RoBERTa's dense -> tanh -> out_proj, ...; "
        "docs/elsewhere.md), so an export is a checkpoint AutoModelForSequenceClassification "
        "and pipeline() load, and such a checkpoint's head is trained on (--model-dir).",
        ("jaxtpu", "hf"),
    )
    token_head: bool = _f(
        False,
        "A decoder (qwen3, qwen2, llama) with --head hf: start its score from its language-model "
        "head as the log-odds of two answer tokens (--answer-tokens), logit(yes) - logit(no) at "
        "the last token, so the model scores sensibly before any training; then trained as a "
        "classifier and exported as its *ForSequenceClassification. Needs the checkpoint's LM "
        "head (lm_head.weight, or tied embeddings).",
    )
    answer_tokens: str = _f(
        "Yes,No",
        "--token-head: the answer that means 'toxic' (or 'breaks the rule') and the one that "
        "means not, each one token of the model's tokenizer.",
    )
    lora_rank: int = _f(
        0,
        "LoRA: train a rank-R adapter on each --lora-targets layer and the head, with the base "
        "model frozen (no gradient, no optimizer state) and, in a bf16 run, held in bf16: what "
        "makes a decoder of billions of parameters fit. 0 = off (every parameter trains). The "
        "torch side is peft's LoraConfig/get_peft_model.",
        bounds=Bounds(0, 4096),
    )
    lora_alpha: float = _f(
        -1.0,
        "LoRA: the update is scaled by alpha / rank (peft's lora_alpha); -1 = 2 x --lora-rank, "
        "as the Agile Community Rules solutions set it.",
        bounds=Bounds(0, 1e6, lo_open=True, special=(-1.0,)),
    )
    lora_dropout: float = _f(
        0.0,
        "LoRA: dropout on each adapter's input while training (peft's lora_dropout).",
        bounds=Bounds(0, 1, hi_open=True),
    )
    lora_targets: str = _f(
        ",".join(DECODER_PROJECTIONS),
        "LoRA: the dense layers adapted, by their Hugging Face module names (peft's "
        "target_modules); default every projection of a decoder layer.",
    )
    scan_layers: bool = _f(
        False,
        "jaxtpu: run the encoder layers as one nn.scan over stacked weights: compiles one "
        "layer instead of all of them (much faster compilation of deep models); the weights "
        "keep their Hugging Face names (stacked on load, unstacked on export). Dropout masks "
        "differ from the unscanned model's (each layer's own key).",
        side="jax",
    )
    matmul_output: str = _f(
        "auto",
        "jaxtpu, --precision bf16: the dtype of the bf16 matmuls' results, forward and "
        "backward (fp32 accumulation either way): fp32 keeps them exact until the next op, "
        "bf16 rounds them once, as torch.autocast does, and halves the bytes between ops. "
        "auto = bf16 on a TPU (the TPU compiler's cost model estimates the step shorter), "
        "fp32 elsewhere. The head's logits stay fp32.",
        ("auto", "fp32", "bf16"),
        side="jax",
    )

    @property
    def lora(self) -> LoraSpec | None:
        """The run's adapters (`jaxtpu.core.lora`), None without --lora-rank."""
        if not self.lora_rank:
            return None
        alpha = 2.0 * self.lora_rank if self.lora_alpha == -1 else self.lora_alpha
        targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        return LoraSpec(self.lora_rank, alpha, self.lora_dropout, targets)

    def check(self) -> None:
        targets = [t.strip() for t in self.lora_targets.split(",") if t.strip()]
        if self.lora_rank and not targets:
            raise ConfigError("--lora-targets is empty: name the dense layers LoRA adapts")
        if not self.lora_rank:
            lora_set = [
                f"--{name.replace('_', '-')}"
                for name in ("lora_alpha", "lora_dropout", "lora_targets")
                if getattr(self, name) != getattr(ModelConfig(), name)
            ]
            if lora_set:
                raise ConfigError(f"{', '.join(lora_set)} without --lora-rank: LoRA is off")
        if self.token_head and self.head != "hf":
            raise ConfigError(
                "--token-head starts the decoder's own classification head (--head hf) from "
                "its LM head; add --head hf"
            )
        if self.init_from and not self.model_dir and not is_run_dir(self.init_from):
            raise ConfigError(
                f"--init-from {self.init_from} needs --model-dir: the Hugging Face directory "
                "with the checkpoint's config.json and tokenizer"
            )
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"--hidden-size {self.hidden_size} is not divisible by --num-heads {self.num_heads}"
            )


@dataclass(frozen=True)
class DataConfig:
    train_csv: str | None = _f(
        "sample",
        "Training file (CSV; .parquet/.pq and .jsonl/.ndjson read the same way): Kaggle "
        "classification (comment_text, toxic, ...) or, for --task ranking, Rate Severity pairs "
        "(less_toxic, more_toxic). 'sample' = the packaged 2,000 real Jigsaw comments (the "
        "default run). Empty = generated demo comments.",
    )
    valid_csv: str | None = _f(
        None,
        "Validation file (CSV, Parquet or JSON Lines); empty = a seeded stratified split of the "
        "training file.",
    )
    valid_fraction: float = _f(
        0.1,
        "Share of the training file held out when no --valid-csv.",
        bounds=Bounds(0, 1, lo_open=True, hi_open=True),
    )
    n_folds: int = _f(
        0, "k-fold cross-validation: number of folds (0 = off).", bounds=Bounds(0, 1000)
    )
    fold: int = _f(
        0,
        "Which fold (0..n_folds-1) is the validation set when --n-folds > 0.",
        bounds=Bounds(0, 999),
    )
    max_len: int = _f(
        128,
        "Tokens per comment (truncate / pad); at most what the encoder's positions number "
        "(512 for BERT; ModernBERT's rotary positions: its max_position_embeddings, 8,192).",
        bounds=Bounds(8, 8192),
    )
    buckets: str = _f(
        "auto",
        "Length buckets: 'auto' (up to 4 edges chosen from the training set's token lengths "
        "to minimise padding; printed at start), 'none' (every batch padded to --max-len), or "
        "ascending edges such as 32,64,128. Each batch holds comments of one bucket, cut to "
        "its edge: one compilation per bucket, every example once per epoch.",
    )
    max_rows: int = _f(
        0, "Use only the first N rows of the training file (0 = all).", bounds=Bounds(0, 10**9)
    )
    subsample: int = _f(
        0,
        "Use a seeded random sample of N rows of the training file (the notebooks' "
        ".sample(n=N, random_state=seed)), stratified by label for labelled comments; 0 = all.",
        bounds=Bounds(0, 10**9),
    )
    fold_column: str = _f(
        "",
        "Take the folds from this column of the training file (e.g. kfold of "
        "train_5folds.csv): --fold K validates on the rows whose value is K and trains on the "
        "rest. Replaces --n-folds.",
    )
    weight_column: str = _f(
        "",
        "Weight each training row's loss by this column of the training file (numbers >= 0; "
        "a row of weight 0 contributes nothing): the loss is sum(w x loss) / sum(w) over a "
        "batch, on both sides. Any task; ranking needs a pairs file that has the column. "
        "Validation stays unweighted (val_loss and the metrics compare across weightings) "
        "unless --weighted-val-loss.",
    )
    bias_weights: bool = _f(
        False,
        "Weight the training rows by the Unintended Bias rule (detoxify's, after the 2nd-place "
        "solution; docs/competitions/unintended-bias.md): 0.25, +0.25 for a toxic comment "
        "without an identity or a non-toxic one with, +0.25 for an identity mention "
        "(any identity column >= 0.5). Needs the file's identity columns; one-comment tasks.",
    )
    weighted_val_loss: bool = _f(
        False,
        "With --weight-column or --bias-weights: val_loss is the weighted mean over the "
        "validation rows by the same rule (a --valid-csv needs the weight column or the "
        "identity columns too); the AUC and the competition metrics stay unweighted. Off by "
        "default, so val_loss compares across weightings.",
    )
    extra_train: str | None = _f(
        None,
        "More training rows from this classification file (CSV, Parquet or JSON Lines), added "
        "after the split so validation stays the labelled rows alone: e.g. pseudo-labels "
        "written by `jaxtpu predict --pseudo-label` (soft targets). Its rows weigh "
        "--extra-weight in the loss; a row whose text is a validation row's is left out (the "
        "log says how many). One-comment tasks.",
    )
    extra_weight: float = _f(
        1.0,
        "--extra-train: the loss weight of each of its rows (the training file's keep theirs).",
        bounds=Bounds(0, _INF, lo_open=True),
    )
    time_column: str = _f(
        "",
        "Validate on the newest rows by this column of the training file (ISO 8601 times, as "
        "`jaxtpu feedback export` writes in `time`, or numbers): the newest --valid-fraction "
        "of them, never a random draw, so the model is judged on decisions after those it "
        "learnt from. Set to 'time' by --init-from RUN; '' = a random split.",
        side="jax",
    )
    replay_csv: str | None = _f(
        None,
        "With --init-from RUN: replay rows of this classification file (RUN's training file) "
        "beside the new rows, so the model keeps what it knew; a row whose text is one of RUN's "
        "validation rows or a new validation row is never replayed. See --replay-share.",
        side="jax",
    )
    replay_share: float = _f(
        0.5,
        "--replay-csv: the share of the training rows that are replayed (0.5: as many replayed "
        "rows as new ones), a seeded sample without repeats (fewer when the file runs short).",
        bounds=Bounds(0, 1, hi_open=True),
        side="jax",
    )
    rule_template: str = _f(
        "{rule}",
        "--task rules: the first text of each (rule, comment) pair, over the file's columns: "
        "'{rule}' (the rule alone), or e.g. '{rule} r/{subreddit}' or '{rule} Breaks it: "
        "{positive_example_1} Does not: {negative_example_1}'. The comment (body) is the "
        "second text; at --max-len the comment is truncated, never this.",
    )
    prompt_template: str = _f(
        "",
        "Each row as one prompt, for a decoder classifier: text over the file's columns with "
        "{comment} where the comment goes ('\\n' in it is a newline), e.g. 'Rule: {rule}\\n"
        "Comment: {comment}\\nDoes the comment break the rule?' (--task rules: {rule} and "
        "any column; other tasks: {comment} alone). Laid out by the tokenizer's chat template "
        "when it has one (the user message, then the generation prompt), token for token as "
        "transformers' apply_chat_template; at --max-len the comment is cut, never the rest. "
        "Empty: a comment is read as it is (a rules row as a pair, --rule-template).",
    )
    rule_examples: str = _f(
        "",
        "--task rules: FILE[,FILE...] of Agile Community Rules rows whose examples "
        "(positive_example_1/2 labelled 1, negative_example_1/2 labelled 0) become training "
        "rows: a train file, or the test file itself (test-time training, as every medal "
        "solution did). One row per (rule, text), subreddit left out; a text given both "
        "labels takes the majority's, a tie is dropped; a text that is a validation row of the "
        "same rule is left out. The log says how many were added, merged and resolved.",
    )
    holdout_rules: int = _f(
        0,
        "--task rules: validate on every row of N of the training file's rules, chosen by "
        "--seed, and train on the others: a score on rules the model never saw, as most of "
        "the competition's test rules are (docs/competitions/rules.md). 0 = a row split.",
        bounds=Bounds(0, 1000),
    )
    pairs_per_comment: float = _f(
        1.0,
        "Ranking from labels: pairs built = this x number of comments.",
        bounds=Bounds(0, 100, lo_open=True),
    )
    demo_size: int = _f(
        2048, "Rows of the built-in demo dataset (when no --train-csv).", bounds=Bounds(1, 10**6)
    )
    cache_dir: str | None = _f(
        None, "Tokenization cache directory; default ~/.cache/jaxtpu/tokens.", resume=True
    )

    def check(self) -> None:
        parse_buckets(self.buckets, self.max_len)
        if self.prompt_template and "{comment}" not in self.prompt_template:
            raise ConfigError(
                f"--prompt-template {self.prompt_template!r} has no {{comment}}: it marks where "
                "each comment goes"
            )
        if self.prompt_template and self.rule_template != "{rule}":
            raise ConfigError(
                "--prompt-template and --rule-template both say what a rules row reads: give "
                "one (the prompt names the rule's columns itself)"
            )
        if self.n_folds == 1:
            raise ConfigError("--n-folds must be 0 (off) or >= 2, got 1")
        if self.fold_column and (self.n_folds or self.valid_csv):
            other = "--n-folds" if self.n_folds else "--valid-csv"
            raise ConfigError(
                f"--fold-column {self.fold_column} takes the folds from the file; drop {other}"
            )
        if self.holdout_rules and (self.valid_csv or self.n_folds or self.fold_column):
            other = (
                "--valid-csv"
                if self.valid_csv
                else ("--n-folds" if self.n_folds else "--fold-column")
            )
            raise ConfigError(
                f"--holdout-rules {self.holdout_rules} chooses the validation rows; drop {other}"
            )
        if self.weighted_val_loss and not (self.weight_column or self.bias_weights):
            raise ConfigError("--weighted-val-loss goes with --weight-column or --bias-weights")
        if self.time_column and (self.valid_csv or self.n_folds or self.fold_column):
            other = (
                "--valid-csv"
                if self.valid_csv
                else "--n-folds"
                if self.n_folds
                else "--fold-column"
            )
            raise ConfigError(
                f"--time-column {self.time_column} chooses the validation rows (the newest); "
                f"drop {other}"
            )
        if self.replay_share != 0.5 and not self.replay_csv:
            raise ConfigError(f"--replay-share {self.replay_share} applies with --replay-csv only")
        if self.extra_weight != 1.0 and not self.extra_train:
            raise ConfigError(f"--extra-weight {self.extra_weight} applies with --extra-train only")
        if self.weight_column and self.bias_weights:
            raise ConfigError(
                f"--weight-column {self.weight_column} and --bias-weights both weight the rows; "
                "give one"
            )
        if self.fold and not self.fold_column and not self.fold < self.n_folds:
            raise ConfigError(
                f"--fold must be in 0..{max(self.n_folds - 1, 0)}"
                f"{'' if self.n_folds else ' (--n-folds is 0: no folds)'}, got {self.fold}"
            )


@dataclass(frozen=True)
class OptimConfig:
    lr: float = _f(1e-4, "Peak learning rate.", bounds=Bounds(0, _INF, lo_open=True))
    scale_lr: bool = _f(False, "Multiply --lr by the number of devices (as the TPU notebooks do).")
    layer_lr_decay: float = _f(
        1.0,
        "Layer-wise learning-rate decay F (Kaggle fine-tuning's 0.8-0.95): the top encoder "
        "layer trains at --lr, each layer below at F times the one above, the embeddings at "
        "F^layers; the rest of the encoder (final norm, pooler) as the top layer. 1 = off. "
        "Composes with the schedule, warm-up, --decay-params and both --adamw forms (rule: "
        "jaxtpu/core/schedules.py layer_lr_scale).",
        bounds=Bounds(0, 1, lo_open=True),
    )
    head_lr: float = _f(
        0.0,
        "Peak learning rate of the classification head (larger than --lr in Kaggle recipes); "
        "follows the same schedule and --scale-lr. 0 = --lr.",
        bounds=Bounds(0, _INF),
    )
    weight_decay: float = _f(
        0.01, "AdamW weight decay (see --decay-params).", bounds=Bounds(0, _INF)
    )
    decay_params: str = _f(
        "not-bias-or-norm",
        "Which parameters weight decay applies to: every one but the biases and LayerNorm "
        "weights (the notebooks' no_decay parameter groups), or all (AdamW(model.parameters(),"
        " weight_decay=...) as the Lightning severity notebook has it).",
        DECAY_PARAMS,
    )
    adamw: str = _f(
        "torch",
        "The AdamW update: 'torch' (torch.optim.AdamW, optax.adamw: decay before the step, eps "
        "added after bias correction) or 'transformers' (the transformers.AdamW the Kaggle "
        "notebooks ran: eps added to sqrt(v) before the bias correction, decay applied to "
        "the stepped weights).",
        ADAMW_FORMS,
    )
    adam_eps: float = _f(
        1e-8,
        "AdamW eps (torch's default 1e-8; transformers.AdamW's 1e-6).",
        bounds=Bounds(0, _INF, lo_open=True),
    )
    adam_beta1: float = _f(0.9, "AdamW beta1.", bounds=Bounds(0, 1, hi_open=True))
    adam_beta2: float = _f(0.999, "AdamW beta2.", bounds=Bounds(0, 1, hi_open=True))
    schedule: str = _f(
        "linear",
        "Learning-rate schedule (formulas in jaxtpu/core/schedules.py): constant and linear "
        "(transformers' with warm-up), cosine (CosineAnnealingLR: --t-max, --eta-min), "
        "cosine-restarts (CosineAnnealingWarmRestarts: --t0, --t-mult, --eta-min), onecycle "
        "(OneCycleLR).",
        SCHEDULES,
    )
    schedule_interval: str = _f(
        "step",
        "When the schedule steps: every optimizer update, or once per epoch (a Lightning "
        "scheduler returned without an interval; the rate is then constant within an epoch, "
        "and --t-max/--t0 count epochs).",
        SCHEDULE_INTERVALS,
    )
    warmup_frac: float = _f(
        0.1,
        "Warm-up steps as a share of all steps. constant and linear: the rate rises as peak x "
        "update / warm-up updates (transformers' get_constant_schedule_with_warmup and "
        "get_linear_schedule_with_warmup); onecycle: OneCycleLR's pct_start (0 = 0.3); the "
        "cosine schedules have none (refused).",
        bounds=Bounds(0, 1, hi_open=True),
    )
    t_max: int = _f(
        -1,
        "cosine: CosineAnnealingLR's T_max, in schedule steps (see --schedule-interval); past "
        "it the rate rises again, as torch's does. -1 = the run's length.",
        bounds=Bounds(1, 10**12, special=(-1.0,)),
    )
    t0: int = _f(
        -1,
        "cosine-restarts: CosineAnnealingWarmRestarts' T_0, schedule steps to the first "
        "restart (required with that schedule).",
        bounds=Bounds(1, 10**12, special=(-1.0,)),
    )
    t_mult: int = _f(
        1,
        "cosine-restarts: T_mult, how much longer each cycle is than the one before.",
        bounds=Bounds(1, 10**6),
    )
    eta_min: float = _f(0.0, "Cosine schedules: the floor of the rate.", bounds=Bounds(0, _INF))
    accumulate: int = _f(
        1, "Gradient accumulation: optimizer update every N steps.", bounds=Bounds(1, 10**6)
    )
    clip_norm: float = _f(
        1.0, "Clip gradients to this global norm (0 = off).", bounds=Bounds(0, _INF)
    )

    @property
    def head_scale(self) -> float:
        """The head's learning rate as a multiple of --lr (--head-lr / --lr; 1 without it)."""
        return self.head_lr / self.lr if self.head_lr > 0 else 1.0

    @property
    def layerwise(self) -> bool:
        """Whether parameters train at different rates (--layer-lr-decay or --head-lr)."""
        return self.layer_lr_decay != 1.0 or self.head_scale != 1.0

    def check(self) -> None:
        _check_schedule(self)


@dataclass(frozen=True)
class TrainConfig:
    """What is trained, on what batches, for how long: the task and its loss, the precision,
    batch sizes, epochs and steps, early stopping and the seed."""

    # the choices are the live table: a task added to TASKS is a valid --task
    task: str = _f(
        "toxicity",
        "Which model to train: toxicity (one score per comment, BCE, ROC AUC), ranking (margin "
        "ranking loss on less/more toxic pairs, agreement), multilabel (the six Jigsaw labels, "
        "mean column AUC) or rules (Agile Community Rules: does the comment break the rule? "
        "(rule, comment) text pairs, mean per-rule AUC).",
        TASKS,  # type: ignore[arg-type]
    )
    margin: float = _f(
        RANKING_MARGIN,
        "--task ranking: the margin of the ranking loss (torch's MarginRankingLoss(margin)).",
        bounds=Bounds(0, _INF),
    )
    monitor: str = _f(
        "",
        "The validation metric that chooses the best checkpoint and drives --patience "
        "(Lightning's ModelCheckpoint/EarlyStopping monitor): val_loss (minimised), or a "
        "metric the task reports (maximised): val_auc, val_agreement, val_mean_auc, "
        "val_mean_rule_auc (--task rules: the mean of the per-rule AUCs), and on files that "
        "have the columns, val_jigsaw_bias (identity columns) or val_mean_language_auc "
        "(lang). Empty = val_jigsaw_bias on a file with identity columns, else the task's "
        "metric.",
        ("", *monitor_names()),
    )
    precision: str = _f(
        "bf16",
        "Compute precision; params and optimizer stay fp32. bf16: TPUs and GPUs from the "
        "A100 on, no loss scaling. fp16: GPUs without bfloat16 (Kaggle's T4 and P100), with "
        "dynamic loss scaling as torch.amp.GradScaler does it (--loss-scale, "
        "--loss-scale-growth-interval; a step whose gradients are not finite is skipped: no "
        "update, the schedule not advanced). fp32: no rounding.",
        PRECISIONS,
    )
    loss_scale: float = _f(
        LOSS_SCALE,
        "--precision fp16: the loss scale the run starts from (GradScaler's init_scale). A "
        "step with an inf/NaN gradient halves it and is skipped.",
        bounds=Bounds(1, 2.0**127),
    )
    loss_scale_growth_interval: int = _f(
        LOSS_SCALE_GROWTH_INTERVAL,
        "--precision fp16: after this many finite steps in a row the loss scale doubles "
        "(GradScaler's growth_interval).",
        bounds=Bounds(1, 10**9),
    )
    batch_size: int = _f(4, "Examples (or pairs) per device per step.", bounds=Bounds(1, 65536))
    valid_batch_size: int = _f(
        0,
        "Examples (or pairs) per device per evaluation batch; 0 = --batch-size.",
        bounds=Bounds(0, 65536),
        resume=True,
    )
    epochs: int = _f(1, "Passes over the training data.", bounds=Bounds(1, 10**6), resume=True)
    max_steps: int = _f(
        0, "Stop after this many steps (0 = run all epochs).", bounds=Bounds(0, 10**12), resume=True
    )
    patience: int = _f(
        0,
        "Early stopping: evaluations without improvement (0 = off).",
        bounds=Bounds(0, 10**6),
        resume=True,
    )
    seed: int = _f(0, "Seed of data order, splits, init and dropout.", bounds=Bounds(0, 2**31 - 1))
    aux_columns: str = _f(
        "",
        "Auxiliary targets: comma-separated columns of the training file (soft targets in "
        "[0, 1], blank = not scored for that row), learnt as extra head outputs after the "
        "task's own, e.g. the Unintended Bias sub-types and identities. Predictions, the "
        "metrics and exports stay the task's outputs (predict and export --all-outputs keep "
        "every one). One-comment tasks.",
    )
    aux_weight: float = _f(
        1.0,
        "--aux-columns: each row's loss is the task's plus this x the mean BCE over its known "
        "auxiliary targets.",
        bounds=Bounds(0, _INF),
    )
    perspective: bool = _f(
        False,
        "Learn Perspective's scores: each column of the training file named exactly as a "
        "Perspective attribute (TOXICITY, SEVERE_TOXICITY, IDENTITY_ATTACK, INSULT, PROFANITY, "
        "THREAT, SEXUALLY_EXPLICIT, FLIRTATION; jaxtpu history import writes them) is learnt as "
        "a soft target (blank = not scored) beside the task's labels, and the model answers it "
        "under Perspective's name (sets --aux-columns and --attributes). A row without a toxic "
        "label takes its TOXICITY score as one (a share of raters, as Unintended Bias's "
        "target); a row with neither is left out. The rows read are written to "
        "WORKDIR/perspective/ (train.csv, valid.csv): history fit-scale reads them. "
        "One-comment tasks: --task toxicity (the default) for a history of Perspective's "
        "scores alone, multilabel where the file has Jigsaw's sub-labels too.",
    )
    all_folds: bool = _f(
        False,
        "Train every fold (--n-folds K, or the values of --fold-column) into --workdir/fold-K "
        "in turn, then write folds.json (each fold's best metric, mean and spread) and oof.csv "
        "(the out-of-fold predictions). With --resume, finished folds are kept.",
        resume=True,
    )

    def check(self) -> None:
        scaling = {
            "--loss-scale": (self.loss_scale, LOSS_SCALE),
            "--loss-scale-growth-interval": (
                self.loss_scale_growth_interval,
                LOSS_SCALE_GROWTH_INTERVAL,
            ),
        }
        for flag, (value, default) in scaling.items():
            if value != default and self.precision != "fp16":
                raise ConfigError(
                    f"{flag} {value} goes with --precision fp16 (loss scaling); --precision "
                    f"{self.precision} has none"
                )
        if self.margin != RANKING_MARGIN and self.task != "ranking":
            raise ConfigError(f"--margin {self.margin} applies to --task ranking only")
        aux = self.aux
        if self.aux_weight != 1.0 and not aux:
            raise ConfigError(f"--aux-weight {self.aux_weight} applies with --aux-columns only")
        if not aux:
            return
        task = get_task(self.task)
        if task.comments_per_example != 1:
            raise ConfigError(
                f"--aux-columns: the {self.task} task scores pairs; auxiliary targets go with "
                "the one-comment tasks (toxicity, multilabel)"
            )
        if len(set(aux)) < len(aux) or not all(aux):
            raise ConfigError(
                f"--aux-columns {self.aux_columns}: expected distinct column names separated "
                "by commas"
            )
        taken = [c for c in aux if c in (*task.label_columns, *LABEL_COLUMNS)]
        if taken:
            raise ConfigError(
                f"--aux-columns: {', '.join(taken)} is the {self.task} task's own label; "
                "give other columns"
            )

    @property
    def aux(self) -> tuple[str, ...]:
        """--aux-columns as a tuple of names (empty without)."""
        return tuple(c.strip() for c in self.aux_columns.split(",")) if self.aux_columns else ()


@dataclass(frozen=True)
class PlacementConfig:
    """Where a run computes: the strategy, the devices and processes, where the state lives,
    how many steps a device call holds, and programs compiled ahead."""

    parallel: str = _f(
        "jit",
        "Data-parallel strategy (each command accepts its own side's; see its --help).",
        JAX_STRATEGIES + TORCH_STRATEGIES,
        resume=True,
    )
    num_devices: int = _f(
        8,
        "Devices to use (virtual CPU devices when no accelerator); per process when "
        "--num-processes > 1.",
        bounds=Bounds(1, 65536),
    )
    sharding: str = _f(
        "auto",
        "jaxtpu: where the fp32 params and AdamW moments live. 'replicated': every device "
        "holds everything; 'zero1': params replicated, moments split over all devices (ZeRO-1);"
        " 'fsdp': params, gradients and moments split over the --mesh fsdp axis, gathered per "
        "layer by the compiler (--parallel jit). 'auto' = fsdp over every device under jit "
        "on a TPU without --mesh (the TPU compiler's cost model estimates it faster), zero1 "
        "for jit/shard_map otherwise, replicated for pmap.",
        SHARDINGS,
        resume=True,
        side="jax",
    )
    mesh: str = _f(
        "",
        "jaxtpu --parallel jit: the device mesh as data=D,fsdp=F (D x F = all devices); the "
        "batch is split over both axes, --sharding fsdp splits params over fsdp. Empty = every "
        "device on data, or on fsdp with --sharding fsdp.",
        resume=True,
        side="jax",
    )
    steps_per_call: int = _f(
        1,
        "jaxtpu: run K training steps per device call (lax.scan, like Keras' "
        "steps_per_execution): one dispatch per K steps. --log-every, --eval-every and "
        "--checkpoint-every must be multiples of K. Calls end at epoch ends too; each shorter "
        "length compiles once (at most K programs). The torch side runs them one by one.",
        bounds=Bounds(1, 10**4),
        resume=True,
    )
    programs: str = _f(
        "",
        "DIR of compiled programs from python -m jaxtpu.preflight --save-programs DIR (e.g. "
        "compiled for a TPU slice on a CPU host): each program found there is loaded instead "
        "of compiled. Programs of another environment (devices, jax/jaxlib/libtpu version, "
        "XLA flags) or of another program (flags or data that change it) are refused. "
        "--parallel jit or shard_map, one process. Empty = compile here.",
        resume=True,
        side="jax",
        program=False,
    )
    coordinator_address: str = _f(
        "",
        "Multi-host JAX (jax.distributed.initialize): HOST:PORT of process 0's coordinator, "
        "given to every process with --num-processes and --process-id; 'auto' lets JAX detect "
        "the cluster (TPU pod, SLURM). Each process feeds only its rows of every global batch; "
        "only process 0 writes the run directory. Empty = one process.",
        resume=True,
    )
    num_processes: int = _f(
        1, "Multi-host: how many processes take part (jaxtpu only).", bounds=Bounds(1, 65536)
    )
    process_id: int = _f(
        0,
        "Multi-host: this process's index, 0..--num-processes - 1.",
        bounds=Bounds(0, 65535),
        resume=True,
    )

    def check(self) -> None:
        if self.programs and (self.parallel == "pmap" or self.num_processes > 1):
            why = (
                "--parallel pmap compiles on first use"
                if self.parallel == "pmap"
                else "--num-processes > 1 is not supported"
            )
            raise ConfigError(
                f"--programs {self.programs}: saved programs run under --parallel jit or "
                f"shard_map in one process ({why})"
            )
        if not 0 <= self.process_id < self.num_processes:
            raise ConfigError(
                f"--process-id must be in 0..{self.num_processes - 1}, got {self.process_id}"
            )
        if self.num_processes > 1 and not self.coordinator_address:
            raise ConfigError(
                "--num-processes > 1 needs --coordinator-address HOST:PORT (process 0's address)"
            )
        # a --sharding or --mesh this strategy cannot use is refused here
        mesh_sizes(self.parallel, self.sharding, self.mesh, self.num_devices * self.num_processes)


@dataclass(frozen=True)
class OutputConfig:
    """What a run writes and shows, and how often: the run directory, resume, the logging,
    evaluation and checkpoint intervals, progress, trackers and profiles."""

    workdir: str = _f(
        "",
        "Run directory: config, metrics.jsonl, checkpoints; default runs/<task>-<date-time>. "
        "An existing run is never overwritten: continue it with --resume.",
        resume=True,
        program=False,
    )
    resume: bool = _f(
        False, "Continue from the latest checkpoint in --workdir.", resume=True, program=False
    )
    attributes: str = _f(
        "",
        "The Perspective attribute each score column is served as (`jaxtpu serve`), kept in "
        "the run's config.json and carried by every export: column=NAME,... (e.g. "
        "'toxic=TOXICITY,my_column=SPAM'); a rules run NAME=\"rule text\",... [default: "
        "every Jigsaw column's Perspective name, as docs/perspective.md lists].",
        resume=True,
        program=False,
    )
    log_every: int = _f(
        10,
        "Fetch loss from the devices every N steps (no sync in between).",
        bounds=Bounds(1, 10**12),
        resume=True,
    )
    eval_every: int = _f(
        0,
        "Also evaluate every N steps (0 = only at epoch end).",
        bounds=Bounds(0, 10**12),
        resume=True,
    )
    checkpoint_every: str = _f(
        "0",
        "Also save the latest state for --resume every N steps (e.g. 500), or at the first "
        "logging step after a time interval (e.g. 30m, 1h, 90s; Google advises about hourly "
        "on TPU VMs that may be preempted without notice). 0 = at evaluations only.",
        resume=True,
    )
    async_checkpoint: bool = _f(
        False,
        "Write checkpoints in the background (orbax's asynchronous checkpointing): a save "
        "returns once the state is on the host, so a slow disk or bucket does not stall "
        "training; the next save and the end of the run wait for it. A run killed meanwhile "
        "resumes from the previous checkpoint.",
        resume=True,
        side="jax",
        program=False,
    )
    progress: bool = _f(True, "Show a live progress bar.", resume=True, program=False)
    tracker: str = _f(
        "tensorboard",
        "Experiment trackers, comma-separated: tensorboard (RUN/tensorboard/), wandb (Weights &"
        " Biases, its own client: pip install 'jaxtpu[wandb]'; WANDB_PROJECT, WANDB_MODE=offline"
        " as usual), or none. metrics.jsonl is always written; only process 0 reports.",
        resume=True,
        program=False,
    )
    profile_steps: str = _f(
        "",
        "A:B = write a profiler trace of training steps A to B (1-based, whole device calls) "
        "into RUN/profile/ (jax.profiler; open it in TensorBoard's profile tab or Perfetto). "
        "Empty = no profile.",
        resume=True,
        side="jax",
        program=False,
    )

    def check(self) -> None:
        parse_trackers(self.tracker)
        profile_range(self.profile_steps)
        checkpoint_interval(self.checkpoint_every)
        if self.resume and not self.workdir:
            raise ConfigError("--resume needs --workdir: the run directory to continue")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    @property
    def task(self) -> Task:
        """The task's row of `jaxtpu.core.tasks.TASKS`, with the run's auxiliary targets."""
        return get_task(self.train.task).with_aux(self.train.aux, self.train.aux_weight)

    @property
    def text_format(self) -> TextFormat:
        """How each row becomes text (`jaxtpu.core.textformat`), as these flags ask: the one
        resolution of --prompt-template and --rule-template (`RunSpec` records it)."""
        return TextFormat.of(self.data, self.task)

    @property
    def head_dropout(self) -> float:
        """--dropout, or the task's default."""
        return self.model.dropout if self.model.dropout >= 0 else self.task.head_dropout

    def replace(self, **overrides: Any) -> Config:
        """Returns a copy with flat overrides (`lr=1e-4`, `task='ranking'`) applied."""
        return apply_overrides(self, overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "placement": PlacementConfig,
    "output": OutputConfig,
}


@dataclass(frozen=True)
class ScoringConfig:
    """The flags of the commands that score with a trained model (`predict`, `evaluate`) and
    the defaults of the Python API (`jaxtpu.load`): not part of a training run's `Config`,
    but spelled, bounded and checked by the same schema (`cli.add_scoring_flags`)."""

    num_devices: int = _f(
        0,
        "Devices to score on; 0: every local accelerator, or on a machine without one a "
        "single CPU device (XLA:CPU spreads each op over the cores, where virtual devices "
        "would only copy the weights: docs/elsewhere.md).",
        bounds=Bounds(0, 65536),
    )
    batch_size: int = _f(
        16, "Comments (or pairs) per device per scoring batch.", bounds=Bounds(1, 65536)
    )
    max_len: int = _f(
        128,
        "A model scored without a run (--model-dir, --init-from): tokens per comment (a run "
        "scores at its own --max-len).",
        bounds=Bounds(8, 8192),
    )
    chunk_rows: int = _f(
        32768,
        "Comments read, scored and written at a time (memory is that of one chunk).",
        bounds=Bounds(1, 10**9),
    )


SCORING = ScoringConfig()  # the scoring commands' defaults


def _field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    index = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            index[f.name] = (section, f)
    return index


FIELDS = _field_index()
# What the fields' metadata says, as tables: every numeric flag's accepted values (checked the
# same way for both sides), the flags that may change on --resume, the jaxtpu-only flags.
BOUNDS: dict[str, Bounds] = {
    k: f.metadata["bounds"] for k, (_, f) in FIELDS.items() if f.metadata["bounds"]
}
RESUME_MAY_CHANGE = frozenset(k for k, (_, f) in FIELDS.items() if f.metadata["resume"])
JAX_ONLY = tuple(k for k, (_, f) in FIELDS.items() if f.metadata["side"] == "jax")
OUTSIDE_PROGRAMS = frozenset(k for k, (_, f) in FIELDS.items() if not f.metadata["program"])


def base_type(typ: Any) -> type:
    """`int` for `int`, `str` for `str | None`."""
    args = [a for a in get_args(typ) if a is not type(None)]
    return args[0] if args else typ


def _check_type(name: str, value: Any, typ: Any) -> Any:
    """Coerces/validates one value against the field's annotated type."""
    if value is None and type(None) in get_args(typ):
        return None
    base = base_type(typ)
    bad = ConfigError(f"{name}={value!r} is not a valid {base.__name__}")
    if base is bool:
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("1", "true", "yes", "0", "false", "no"):
            return text in ("1", "true", "yes")
        raise bad
    if base is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise bad
    if base is str and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # e.g. `checkpoint_every: 500` in a config file
    if base is str and not isinstance(value, str):
        raise bad
    try:
        return base(value)
    except (TypeError, ValueError, OverflowError):
        raise bad from None


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """Applies flat `{field: value}` overrides, type-checked; unknown keys are an error."""
    by_section: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            valid = ", ".join(sorted(FIELDS))
            raise ConfigError(f"unknown config key {key!r}; valid keys: {valid}")
        section, f = FIELDS[name]
        hints = get_type_hints(SECTIONS[section])
        value = _check_type(name, value, hints[name])
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")
        by_section[section][name] = value
    cfg = dataclasses.replace(
        cfg,
        **{
            s: dataclasses.replace(getattr(cfg, s), **vals)
            for s, vals in by_section.items()
            if vals
        },
    )
    validate(cfg)
    return cfg


_UNITS = {"s": 1, "m": 60, "h": 3600}


def checkpoint_interval(text: str) -> tuple[int, float]:
    """`--checkpoint-every`: (steps, 0) for a step count such as '500', (0, seconds) for a
    time interval such as '30m', '1.5h' or '90s'; (0, 0) for '0'. A ConfigError otherwise."""
    value = str(text).strip().lower()
    try:
        if value and value[-1] in _UNITS:
            seconds = float(value[:-1]) * _UNITS[value[-1]]
            if math.isfinite(seconds) and seconds > 0:
                return 0, seconds
        elif value.isdigit():
            return int(value), 0.0
    except ValueError:
        pass
    raise ConfigError(
        f"--checkpoint-every {text}: expected a step count (e.g. 500, 0 = at evaluations "
        "only) or a time interval (e.g. 30m, 1h, 90s)"
    )


def profile_range(steps: str) -> tuple[int, int] | None:
    """`--profile-steps A:B` -> (A, B), None when empty; a ConfigError says what is wrong."""
    if not steps.strip():
        return None
    first, _, last = steps.partition(":")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        a = b = 0
    if not 1 <= a <= b:
        raise ConfigError(
            f"--profile-steps {steps}: expected A:B, training steps with 1 <= A <= B (e.g. 10:20)"
        )
    return a, b


def validate(cfg: Config) -> None:
    """Range checks of every numeric flag (`BOUNDS`: NaN and infinities never pass), then each
    section's own cross-field checks (`check`), then the checks across sections, with
    messages that say what to do instead."""
    for name, bounds in BOUNDS.items():
        section, _ = FIELDS[name]
        value = getattr(getattr(cfg, section), name)
        problem = bounds.problem(value)
        if problem:
            raise ConfigError(f"--{name.replace('_', '-')} must be {problem}, got {value}")
    for section in SECTIONS:
        getattr(cfg, section).check()
    if cfg.output.attributes:  # column names and attribute names, before anything trains
        attribute_map(cfg.task.score_columns(True), cfg.task.text_pairs, cfg.output.attributes)
    if cfg.data.weight_column and cfg.data.weight_column in cfg.train.aux:
        raise ConfigError(
            f"--weight-column {cfg.data.weight_column} is also in --aux-columns: a column is a "
            "row weight or a target, not both"
        )
    if cfg.data.extra_train and cfg.task.comments_per_example != 1:
        raise ConfigError(
            f"--extra-train adds labelled comments; --task {cfg.train.task} trains on pairs"
        )
    if cfg.data.replay_csv and not cfg.model.init_from:
        raise ConfigError(
            f"--replay-csv {cfg.data.replay_csv} replays a run's training rows while it "
            "learns new ones: give the run with --init-from RUN"
        )
    if (cfg.data.replay_csv or cfg.data.time_column) and cfg.task.comments_per_example != 1:
        flag = "--replay-csv" if cfg.data.replay_csv else "--time-column"
        raise ConfigError(
            f"{flag} reads labelled comments; --task {cfg.train.task} trains on pairs"
        )
    rule_flags = {
        "--rule-template": cfg.data.rule_template != "{rule}",
        "--rule-examples": bool(cfg.data.rule_examples),
        "--holdout-rules": bool(cfg.data.holdout_rules),
    }
    given = [k for k, v in rule_flags.items() if v]
    if given and not cfg.task.text_pairs:
        raise ConfigError(
            f"{', '.join(given)}: the Agile Community Rules options go with --task rules, "
            f"not --task {cfg.train.task}"
        )
    if cfg.data.prompt_template and cfg.task.comments_per_example != 1:
        raise ConfigError(
            f"--prompt-template: --task {cfg.train.task} compares two comments; a prompt holds "
            "one (toxicity, multilabel, rules)"
        )
    if cfg.data.bias_weights and cfg.task.comments_per_example != 1:
        raise ConfigError(
            f"--bias-weights weights comments by identity mentions; --task {cfg.train.task} "
            "trains on pairs (use --weight-column with a pairs file)"
        )
    if cfg.train.precision == "fp16":
        _check_fp16(cfg)
    k = max(cfg.placement.steps_per_call, 1)
    steps = {
        "log_every": cfg.output.log_every,
        "eval_every": cfg.output.eval_every,
        "checkpoint_every": checkpoint_interval(cfg.output.checkpoint_every)[0],
    }
    for name, value in steps.items():
        if value % k:
            raise ConfigError(
                f"--{name.replace('_', '-')} {value} is not a multiple of --steps-per-call {k}"
            )


def _check_fp16(cfg: Config) -> None:
    """What --precision fp16 does not combine with (yet)."""
    if cfg.optim.accumulate > 1:
        raise ConfigError(
            f"--precision fp16 with --accumulate {cfg.optim.accumulate}: loss scaling checks "
            "each step's gradients, not an accumulated sum, so the two are not combined; "
            "raise --batch-size, or use --precision bf16 or fp32 to accumulate"
        )
    if cfg.model.matmul_output == "bf16":
        raise ConfigError(
            "--matmul-output bf16 rounds bf16 matmuls' results; --precision fp16 keeps its "
            "matmuls' results in fp32: drop --matmul-output"
        )


def _check_schedule(o: OptimConfig) -> None:
    """The schedule flags that go together; a flag of another schedule is refused rather than
    ignored."""
    cosine = o.schedule in ("cosine", "cosine-restarts")
    if cosine and o.warmup_frac:
        raise ConfigError(
            f"--warmup-frac {o.warmup_frac}: the {o.schedule} schedule has no warm-up "
            "(CosineAnnealingLR); use --schedule linear or onecycle for one, or --warmup-frac 0"
        )
    if o.schedule == "cosine-restarts" and o.t0 < 1:
        raise ConfigError(
            "--schedule cosine-restarts needs --t0: schedule steps to the first restart "
            "(CosineAnnealingWarmRestarts' T_0)"
        )
    given = {
        "t_max": o.t_max != -1,
        "t0": o.t0 != -1,
        "t_mult": o.t_mult != 1,
        "eta_min": o.eta_min != 0,
    }
    owner = {
        "t_max": ("cosine",),
        "t0": ("cosine-restarts",),
        "t_mult": ("cosine-restarts",),
        "eta_min": ("cosine", "cosine-restarts"),
    }
    for name, set_ in given.items():
        if set_ and o.schedule not in owner[name]:
            raise ConfigError(
                f"--{name.replace('_', '-')} goes with --schedule {' or '.join(owner[name])}, "
                f"not {o.schedule}"
            )


def require_strategy(cfg: Config, strategies: Sequence[str], side: str) -> None:
    """Refuses, before anything is created, a --parallel value that `side` does not run (the
    command line already refuses it; this guards callers of `train_and_evaluate`)."""
    if cfg.placement.parallel not in strategies:
        raise ConfigError(
            f"--parallel {cfg.placement.parallel} is not a {side} strategy; choose one of "
            f"{', '.join(strategies)}"
        )


def jax_only_options(cfg: Config) -> list[str]:
    """The jaxtpu-only flags (`JAX_ONLY`) that `cfg` sets away from their defaults (the
    torch side refuses them rather than silently run without)."""
    set_away = []
    for name in JAX_ONLY:
        section = FIELDS[name][0]
        value = getattr(getattr(cfg, section), name)
        if value != getattr(getattr(Config(), section), name):
            set_away.append(f"--{name.replace('_', '-')} {value}")
    return set_away


# The sections a recorded config may have besides today's: before the flags were split by
# owner, `run` held the train, placement and output flags (config.json of older runs).
FORMER_SECTIONS = ("run",)


def flat_record(recorded: dict[str, Any]) -> dict[str, Any]:
    """A `to_dict()` (e.g. config.json's, of this or an older version) as {field: value}: the
    values of every section, today's or a former one, by field name."""
    return {
        name: value
        for section, values in recorded.items()
        if (section in SECTIONS or section in FORMER_SECTIONS) and isinstance(values, dict)
        for name, value in values.items()
    }


# Flags whose written value stands for another: compared by what they resolve to, so that
# `--lora-alpha 8` is the run's default alpha of 2 x rank 4 (-1), and targets in any order.
RESOLVED: dict[str, Callable[[Config], Any]] = {
    "lora_alpha": lambda cfg: cfg.model.lora and cfg.model.lora.alpha,
    "lora_targets": lambda cfg: cfg.model.lora and set(cfg.model.lora.targets),
}


def changed_flags(recorded: dict[str, Any], cfg: Config) -> list[tuple[str, Any, Any]]:
    """(field, recorded value, value in `cfg`) of each field whose value in `cfg` differs from
    the one `recorded` (a `to_dict()`, e.g. config.json's) holds, by what it resolves to where
    `RESOLVED` says how; a field it does not hold (recorded by an older version) counts as
    unchanged."""
    before = flat_record(recorded)
    changed = [
        (name, before.get(name, value), value)
        for values in cfg.to_dict().values()
        for name, value in values.items()
        if before.get(name, value) != value
    ]
    if any(name in RESOLVED for name, _, _ in changed):
        old = from_dict(recorded)
        changed = [
            c for c in changed if c[0] not in RESOLVED or RESOLVED[c[0]](old) != RESOLVED[c[0]](cfg)
        ]
    return changed


def from_dict(d: dict[str, Any]) -> Config:
    """Rebuilds a Config from `to_dict()` output (e.g. a run directory's config.json, of this
    or an older version)."""
    return apply_overrides(Config(), flat_record(d))
