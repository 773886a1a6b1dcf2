"""`RunSpec`: everything a run derives from its flags, resolved once, right after parsing, and
read everywhere after (framework-free, as MaxText's `pyconfig` does): the task, the encoder's
shape, the pooling and where it came from, the tokenizer directory, where the initial weights
come from, the strategy, the resolved `--sharding` and the mesh sizes.

Both sides build it from the same Config (`RunSpec.resolve`), log it once (`describe_*`) and
write it into the run's `config.json` (`to_dict`); nothing else reads a `config.json` from a
checkpoint directory or re-derives these from the flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.layout import mesh_sizes, resolve_matmul_output, resolve_sharding
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.flags.values import is_run_dir
from jaxtpu.core.hf.encoder import (
    EncoderConfig,
    exported_head,
    packaged_minilm_dir,
    read_classifier_dir,
    read_encoder,
    resolve_model_dir,
)
from jaxtpu.core.hf.families import default_pooling
from jaxtpu.core.hf.heads import hf_pooling
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.core.hf.tokenizer_dir import answer_ids, separator_id
from jaxtpu.core.lora import LoraSpec, is_adapter_dir, peft_targets, read_adapter
from jaxtpu.core.storage import local_input
from jaxtpu.core.tasks import Task
from jaxtpu.core.textformat import PAIR, PLAIN, TextFormat


def model_key(
    task: str | None,
    encoder: dict[str, Any] | None,
    head: str | None = "jaxtpu",
    lora: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What makes two checkpoints compatible, the one spelling of it (a checkpoint's metadata
    carries it): the task, the encoder's `config.json` fields and, when it is not jaxtpu's
    (checkpoints from before `--head` have none), the head; a LoRA run's adapters."""
    key = {"task": task, "encoder": encoder}
    if head not in (None, "jaxtpu"):
        key["head"] = head
    return {**key, "lora": lora} if lora else key


@dataclass(frozen=True)
class RunSpec:
    """A run's configuration, resolved.

    Attributes:
      task: the task's table row.
      encoder: the encoder's architecture: the checkpoint's config.json, else the random-init
        flags, with --encoder-dropout applied.
      pooling: how a comment becomes one vector ('pooler', 'cls' or 'mean').
      head: 'jaxtpu' (pooling -> dropout -> Dense) or 'hf' (the family's own classification
        head, `jaxtpu.core.hf.heads`).
      pooling_from: why that pooling ('--pooling', the export's record, the family default).
      model_dir: the checkpoint directory (--model-dir resolved; 'minilm' = the packaged one),
        or None for random init.
      weights: where the initial weights come from (--init-from, else model_dir), or None.
      tokenizer_from: --tokenizer-dir, else model_dir; None: the packaged MiniLM tokenizer
        (`tokenizer_dir` locates it when asked).
      parallel: the strategy (--parallel).
      sharding: --sharding with 'auto' resolved for the strategy.
      mesh: (data, fsdp) sizes over every device of the run.
      segment_sep: the separator id of text pairs' token types, or -1 (`segment_types`).
    """

    task: Task
    encoder: EncoderConfig
    pooling: str
    pooling_from: str
    model_dir: str | None
    weights: str | None
    tokenizer_from: str | None
    parallel: str
    sharding: str
    mesh: tuple[int, int]
    matmul_output: str = "fp32"  # the bf16 matmuls' result dtype (--matmul-output resolved)
    head: str = "jaxtpu"
    # text pairs (--task rules) on an encoder with token types: the tokenizer's separator id,
    # after which the model gives tokens type 1 (`segment_types`); -1: every token type 0
    segment_sep: int = -1
    # --token-head: the (yes, no) answer token ids whose LM-head rows start the score; ()
    answer_ids: tuple[int, ...] = ()
    # --lora-rank: the adapters trained on the frozen base (`jaxtpu.core.lora`); None: off
    lora: LoraSpec | None = None
    # --init-from a peft adapter directory: the adapters and head the run starts from (its
    # base is `weights`, the --model-dir); None: the adapters start new
    adapter: str | None = None
    # how each row becomes text (`jaxtpu.core.textformat`): a comment, a pair or a prompt
    text_format: TextFormat = PLAIN

    @classmethod
    def resolve(cls, cfg: Config, devices: int | None = None, platform: str = "") -> RunSpec:
        """Resolves `cfg` (already validated) for a run on `devices` devices over every process
        (default: --num-devices x --num-processes) of `platform` ('tpu', 'cpu', ...; '' =
        unknown), which picks the defaults tuned per platform (`layout`)."""
        model_dir = resolve_model_dir(cfg.model.model_dir)
        return cls._build(cfg, _encoder(cfg, model_dir), model_dir, devices, platform)

    @classmethod
    def of_checkpoint(
        cls, cfg: Config, encoder: EncoderConfig, recorded: dict[str, Any] | None = None
    ) -> RunSpec:
        """The spec of a finished run, scored from its checkpoint: the encoder its checkpoint
        carries and the pooling, text format, text pairs' separator and answer tokens its
        config.json recorded (`recorded`: the `resolved` entry; runs older than it resolve
        them from the flags again), so a run scores where its --model-dir no longer is."""
        model_dir = resolve_model_dir(cfg.model.model_dir)
        spec = cls._build(cfg, encoder, model_dir, None, known=recorded or {})
        if recorded and recorded.get("pooling"):
            spec = dataclasses.replace(
                spec, pooling=recorded["pooling"], pooling_from=recorded["pooling_from"]
            )
        return spec

    @classmethod
    def _build(
        cls,
        cfg: Config,
        enc: EncoderConfig,
        model_dir: str | None,
        devices: int | None,
        platform: str = "",
        known: dict[str, Any] | None = None,
    ) -> RunSpec:
        """The spec from its resolvers (`_pooling`, `_text_format`, `_answers`, `_weights`,
        `_check_lora`, `_segment_sep`), each owning one derived value; `known`: values a
        finished run's config.json recorded, which win over deriving them again."""
        model, place = cfg.model, cfg.placement
        known = known or {}
        pooling, pooling_from = _pooling(model, enc, model_dir)
        n = devices or place.num_devices * place.num_processes
        tokenizer_from = (
            local_input(model.tokenizer_dir, "--tokenizer-dir")
            if model.tokenizer_dir
            else model_dir
        )
        fmt = _text_format(cfg, known, enc)
        answers = _answers(cfg, enc, known, tokenizer_from)
        weights, adapter = _weights(model, enc, model_dir)
        _check_lora(model.lora, enc)
        return cls(
            task=cfg.task,
            encoder=enc,
            head=model.head,
            pooling=default_pooling(enc.family, pooling, enc.default_pooling),
            pooling_from=pooling_from,
            model_dir=model_dir,
            weights=weights,
            tokenizer_from=tokenizer_from,
            parallel=place.parallel,
            sharding=resolve_sharding(place.parallel, place.sharding, platform, place.mesh),
            mesh=mesh_sizes(place.parallel, place.sharding, place.mesh, n, platform),
            matmul_output=resolve_matmul_output(
                cfg.model.matmul_output, platform, cfg.train.precision
            ),
            segment_sep=_segment_sep(known, fmt.kind == PAIR, enc, tokenizer_from),
            answer_ids=answers,
            lora=model.lora,
            adapter=adapter,
            text_format=fmt,
        )

    def model_spec(self, cfg: Config, scan: bool | None = None) -> ModelSpec:
        """The model this run builds on either side (`ModelSpec`): its encoder, head and its
        dropout, pooling, outputs, separator, answers, LoRA, adapter and precision, and the
        JAX side's compile options (`scan`: the run's --scan-layers unless given)."""
        return ModelSpec(
            self.encoder,
            head_dropout=cfg.head_dropout,
            precision=cfg.train.precision,
            pooling=self.pooling,
            outputs=self.task.outputs,
            head=self.head,
            segment_sep=self.segment_sep,
            answers=self.answer_ids,
            lora=self.lora,
            adapter=self.adapter,
            remat=cfg.model.remat,
            scan=cfg.model.scan_layers if scan is None else scan,
            matmul_output=self.matmul_output,
        )

    @property
    def tokenizer_dir(self) -> str:
        """Where the tokenizer lives (the packaged MiniLM's only when no directory is given)."""
        return self.tokenizer_from or packaged_minilm_dir()

    @property
    def pad_id(self) -> int | None:
        """The id a decoder's tokens are padded with: its config's pad_token_id, the one its
        classifier pools by (`tokens.pad_with`); None for an encoder (its tokenizer's own)."""
        return self.encoder.pad_token_id if self.encoder.family.kind.causal else None

    @property
    def model_key(self) -> dict[str, Any]:
        """What a checkpoint of this run must match (`model_key`)."""
        lora = self.lora.to_dict() if self.lora else None
        return model_key(self.task.name, self.encoder.to_hf_dict(), self.head, lora)

    def describe_model(self, n_params: int, seed: int, n_trained: int | None = None) -> str:
        """The start-up line both sides print: family, shape, size, pooling, where from, and
        under LoRA its adapters and the parameters that train (`n_trained`)."""
        enc = self.encoder
        lora = ""
        if self.lora:
            lora = f", {self.lora.describe()}: {n_trained or 0:,} params train"
        return (
            f"{enc.model_type} ({enc.family.architecture}), {enc.num_hidden_layers} layers x "
            f"{enc.hidden_size} hidden, {n_params / 1e6:.1f}M params, "
            + ("its own classification head, " if self.head == "hf" else "")
            + f"pooling {self.pooling} ({self.pooling_from}), from "
            f"{self.weights or f'random init (seed {seed})'}{lora}"
        )

    def describe_placement(self) -> str:
        """The strategy, where the state lives and the mesh, for the start-up line."""
        data, fsdp = self.mesh
        mesh = f", mesh data={data},fsdp={fsdp}" if self.parallel != "pmap" else ""
        return f"strategy {self.parallel} (params {self.sharding}{mesh})"

    def to_dict(self) -> dict[str, Any]:
        """The resolved values, as `config.json` records them beside the flags."""
        return {
            "task": self.task.name,
            "encoder": self.encoder.to_hf_dict(),
            "pooling": self.pooling,
            "pooling_from": self.pooling_from,
            "head": self.head,
            "model_dir": self.model_dir,
            "weights": self.weights,
            "tokenizer_dir": self.tokenizer_from or "packaged all-MiniLM-L6-v2",
            "parallel": self.parallel,
            "sharding": self.sharding,
            "mesh": {"data": self.mesh[0], "fsdp": self.mesh[1]},
            "matmul_output": self.matmul_output,
            "segment_sep": self.segment_sep,
            "answer_ids": list(self.answer_ids),
            "lora": self.lora.to_dict() if self.lora else None,
            "text_format": self.text_format.to_dict(),
        }


def _encoder(cfg: Config, model_dir: str | None) -> EncoderConfig:
    """The encoder shape: the checkpoint's config.json, or the random-init flags; checked
    against --max-len."""
    m = cfg.model
    if model_dir:
        enc = read_encoder(model_dir)
    else:
        enc = EncoderConfig(
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            intermediate_size=m.intermediate_size,
            vocab_size=m.vocab_size,
        )
    if m.encoder_dropout >= 0:
        enc = dataclasses.replace(
            enc,
            hidden_dropout_prob=m.encoder_dropout,
            attention_probs_dropout_prob=m.encoder_dropout,
            embedding_dropout=m.encoder_dropout if enc.family.kind.embedding_dropout else 0.0,
        )
    limit = enc.max_tokens
    if limit is not None and cfg.data.max_len > limit:
        positions = (
            "rotary positions go to"
            if enc.family.positions == "rotary"
            else "position table holds at most"
        )
        raise ConfigError(
            f"--max-len {cfg.data.max_len}: the {enc.model_type} encoder's {positions} {limit} "
            f"tokens (max_position_embeddings={enc.max_position_embeddings}); use --max-len "
            f"{limit} or less"
        )
    return enc


def _pooling(model: Any, enc: EncoderConfig, model_dir: str | None) -> tuple[str, str]:
    """(pooling, why): --pooling, else the classifier's or the export's record, else the
    family's default; under --head hf, the family head's own pooling."""
    exported = exported_head(model_dir).get("pooling")
    classifier = read_classifier_dir(model_dir, enc.model_type) if model.head == "hf" else None
    if model.pooling != "auto":
        pooling, pooling_from = model.pooling, "--pooling"
    elif classifier and classifier.pooling:
        pooling, pooling_from = classifier.pooling, "its classifier's config.json"
    elif exported and model.head != "hf":
        pooling, pooling_from = exported, "as exported, jaxtpu_head.json"
    elif enc.classifier_pooling:
        pooling, pooling_from = "auto", "config.json's classifier_pooling"
    elif model.head == "hf":
        pooling, pooling_from = "auto", f"{enc.model_type}'s classification head"
    else:
        pooling, pooling_from = "auto", f"{enc.model_type}'s default"
    if model.head == "hf":
        auto = pooling == "auto" and enc.classifier_pooling
        pooling = hf_pooling(enc.model_type, enc.classifier_pooling if auto else pooling)
    return pooling, pooling_from


def _text_format(cfg: Config, known: dict[str, Any], enc: EncoderConfig) -> TextFormat:
    """How rows become text: as the finished run recorded it, else as the flags ask; text
    pairs refused on a decoder, which reads a rule and a comment as one prompt."""
    recorded = known.get("text_format")
    fmt = TextFormat.from_dict(recorded) if recorded else cfg.text_format
    if fmt.kind == PAIR and enc.family.kind.causal:
        raise ConfigError(
            f"--task {cfg.task.name} on {enc.model_type}: a decoder reads the rule and the "
            "comment as one prompt, not as a text pair; give one, e.g. --prompt-template "
            "'Rule: {rule}\\nComment: {comment}\\nDoes the comment break the rule?'"
        )
    return fmt


def _answers(
    cfg: Config, enc: EncoderConfig, known: dict[str, Any], tokenizer_from: str | None
) -> tuple[int, ...]:
    """--token-head's (yes, no) answer token ids (recorded, else from the tokenizer); ()."""
    answers: tuple[int, ...] = tuple(known.get("answer_ids") or ())
    if not cfg.model.token_head or answers:
        return answers
    if not enc.family.kind.causal or cfg.task.outputs != 1:
        why = (
            f"{enc.model_type} is not a decoder"
            if not enc.family.kind.causal
            else f"--task {cfg.task.name} scores {cfg.task.outputs} outputs"
        )
        raise ConfigError(
            f"--token-head starts one score from a decoder's LM head (qwen3, qwen2, llama); {why}"
        )
    return answer_ids(tokenizer_from or packaged_minilm_dir(), cfg.model.answer_tokens)


def _weights(model: Any, enc: EncoderConfig, model_dir: str | None) -> tuple[Any, str | None]:
    """(where the initial weights come from, the peft adapter directory the run continues or
    None): --init-from (a state-dict file, a peft adapter or a jaxtpu run directory), else
    the --model-dir."""
    if is_run_dir(model.init_from):  # a jaxtpu run: its best checkpoint, LoRA and all
        return model.init_from, None
    weights = local_input(model.init_from, "--init-from") if model.init_from else model_dir
    if model.init_from and is_adapter_dir(weights):
        _check_adapter(weights, model, enc)
        return model_dir, weights
    if model.lora and model.init_from:
        raise ConfigError(
            f"--lora-rank with --init-from {model.init_from}: LoRA starts from --model-dir, "
            "or continues a peft adapter directory (adapter_config.json)"
        )
    return weights, None


def _check_lora(lora: LoraSpec | None, enc: EncoderConfig) -> None:
    """Refuses --lora-rank on a layer kind without adapter targets, or targets it lacks."""
    if not lora:
        return
    kind = enc.family.kind
    if not kind.lora_targets:
        raise ConfigError(
            f"--lora-rank on {enc.model_type}: jaxtpu adapts the decoders (qwen3, "
            f"qwen2, llama) with LoRA, not the {kind.name} layer kind; train it whole"
        )
    unknown = [t for t in lora.targets if t not in kind.lora_targets]
    if unknown:
        raise ConfigError(
            f"--lora-targets {','.join(unknown)}: not a dense layer of {enc.model_type}; "
            f"one or more of {','.join(kind.lora_targets)}"
        )


def _segment_sep(
    known: dict[str, Any], pairs: bool, enc: EncoderConfig, tokenizer_from: str | None
) -> int:
    """Text pairs' separator id on an encoder with token types (recorded, else the
    tokenizer's), after which tokens are type 1; -1: every token type 0."""
    if "segment_sep" in known:
        return int(known["segment_sep"])
    if pairs and enc.type_vocab_size >= 2:
        return separator_id(tokenizer_from or packaged_minilm_dir())
    return -1


def _check_adapter(adapter: str, model: Any, enc: EncoderConfig) -> None:
    """Refuses --init-from a peft adapter directory (`adapter`) unless --lora-* are its own,
    with its `target_modules` read as peft reads them (`peft_targets`), and --head hf."""
    found, _ = read_adapter(adapter)
    dense = enc.family.kind.lora_targets  # none: refused by the caller, with --lora-rank
    where = f"--init-from {model.init_from}"
    targets = (
        peft_targets(found.targets, dense, enc.num_hidden_layers, where) if dense else found.targets
    )
    found = dataclasses.replace(found, targets=tuple(targets))
    lora = model.lora
    if lora is None or (found.rank, found.alpha, set(targets)) != (
        lora.rank,
        lora.alpha,
        set(lora.targets),
    ):
        raise ConfigError(
            f"--init-from {model.init_from} is a peft LoRA adapter ({found.describe()}); "
            f"continue it with --lora-rank {found.rank} --lora-alpha {found.alpha:g} "
            f"--lora-targets {','.join(targets)}"
        )
    if model.head != "hf":
        raise ConfigError(
            f"--init-from {model.init_from}: a peft adapter holds the family's own "
            "classification head (peft's modules_to_save); add --head hf"
        )
