"""The encoder families jaxtpu reads and writes, one table row each (framework-free).

A row says everything that differs between Hugging Face's `BertModel`, `RobertaModel`,
`XLMRobertaModel`, `DistilBertModel`, `ElectraModel`, `DebertaV2Model`, `ModernBertModel` and
`EuroBertModel` as far as a checkpoint directory is concerned: which layer kind builds it,
which `config.json` keys it reads and under which names, their defaults (transformers'
config-class defaults, for keys `save_pretrained` left out), the options the port does not
implement, whether the model has a pooler, how positions are numbered, the default pooling,
and the one weight-name table that maps jaxtpu's parameter names to the family's Hugging Face
keys (used in both directions by `jaxtpu.engine.weights`).

jaxtpu's Flax encoders name their modules as `BertModel` does (the BERT layer kind), as
`ModernBertModel` or as `EuroBertModel` does, their layers `encoder/layer_{i}` in every kind;
a family whose Hugging Face names differ (DistilBERT, DeBERTa, the `layers.{i}` of ModernBERT
and EuroBERT) lists the differences as (jaxtpu, Hugging Face) module-path pairs, `{i}` standing
for a layer index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.hf.kinds import LayerKind, get_kind

# 'last': the last token that is not padding, by id (the decoders' classifiers read it)
POOLINGS = ("pooler", "cls", "mean", "last")

# Canonical encoder fields every family has (jaxtpu's names = BertConfig's).
_COMMON = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "initializer_range",
    "pad_token_id",
)
_BERT_DEFAULTS = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
    "pad_token_id": 0,
}
_GELU = {"hidden_act": "gelu"}
_ABSOLUTE = {"hidden_act": "gelu", "position_embedding_type": "absolute"}


@dataclass(frozen=True)
class Family:
    """One encoder family (see the module docstring)."""

    model_type: str
    architecture: str  # the transformers class `AutoModel` builds for it
    fields: tuple[str, ...]  # canonical fields read from config.json
    defaults: Mapping[str, Any]  # transformers' defaults of those fields
    required: Mapping[str, Any]  # config.json options the port implements one value of
    pooler: bool  # the Hugging Face model has `pooler.dense`
    default_pooling: str
    # 'absolute' (0..L-1), 'after_padding' (RoBERTa), 'relative' (DeBERTa), 'rotary'
    # (ModernBERT: rotary embeddings of 0..L-1 in every attention layer, no position table)
    positions: str
    tokenizer: str  # the tokenizer kind its checkpoints ship (docs/families.md)
    names: Mapping[str, str] = field(default_factory=dict)  # canonical -> config.json key
    constants: Mapping[str, Any] = field(default_factory=dict)  # fixed, not in config.json
    renames: tuple[tuple[str, str], ...] = ()  # (jaxtpu module path, Hugging Face one)
    attention_output_dropout: bool = True  # dropout after the attention's output dense
    # How embeddings narrower than hidden_size are projected: 'embeddings_project' (ELECTRA:
    # a Dense after the embeddings' LayerNorm) or 'embed_proj' (DeBERTa: no bias, before it).
    projection: str = "embeddings_project"
    mask_embeddings: bool = False  # DeBERTa zeroes the embeddings of padding tokens
    # The layer kind that builds it: a record of `jaxtpu.core.hf.kinds.LAYER_KINDS`.
    layer_kind: str = "bert"
    # transformers' default ids of special tokens the encoder does not use (written as null
    # in an export whose vocabulary has no such row, which transformers warns about)
    special_ids: Mapping[str, int] = field(default_factory=dict)

    def hf_name(self, canonical: str) -> str:
        return self.names.get(canonical, canonical)

    @property
    def kind(self) -> LayerKind:
        """Its layer kind's record."""
        return get_kind(self.layer_kind)


_BERTLIKE = ("type_vocab_size", "layer_norm_eps")
_DEBERTA = (
    "relative_attention",
    "position_biased_input",
    "max_relative_positions",
    "position_buckets",
    "pos_att_type",
    "share_att_key",
    "norm_rel_ebd",
)

_MODERNBERT = (
    "layer_norm_eps",
    "embedding_dropout",
    "layer_types",
    "local_attention",
    "global_rope_theta",
    "local_rope_theta",
    "classifier_pooling",
)

_EUROBERT = ("layer_norm_eps", "num_key_value_heads", "global_rope_theta")
_DECODER = (*_EUROBERT, "head_dim", "rope_scaling")
_DECODER_NAMES = {
    "attention_probs_dropout_prob": "attention_dropout",
    "layer_norm_eps": "rms_norm_eps",
}


def _decoder(
    model_type: str,
    architecture: str,
    defaults: Mapping[str, Any],
    required: Mapping[str, Any],
    tokenizer: str,
    qkv_bias: bool = False,
    qk_norm: bool = False,
) -> Family:
    """A decoder family's row (the 'decoder' layer kind): read as a classifier of the last
    token that is not padding (`last` pooling, its `*ForSequenceClassification`'s)."""
    return Family(
        model_type,
        architecture,
        tuple(f for f in _COMMON if f != "hidden_dropout_prob") + _DECODER,
        {
            "attention_probs_dropout_prob": 0.0,
            "initializer_range": 0.02,
            "num_key_value_heads": None,  # = num_attention_heads
            "head_dim": 0,  # = hidden / heads
            "global_rope_theta": 10_000.0,
            "rope_scaling": (),
            **defaults,
        },
        {"hidden_act": "silu", **required},
        pooler=False,
        default_pooling="last",
        positions="rotary",
        tokenizer=tokenizer,
        names=_DECODER_NAMES,
        constants={
            "type_vocab_size": 0,
            "hidden_dropout_prob": 0.0,
            "qkv_bias": qkv_bias,
            "qk_norm": qk_norm,
        },
        renames=(("encoder.layer.{i}", "layers.{i}"),),
        layer_kind="decoder",
    )


# transformers 5's config-class defaults of the decoders (pad_token_id: none, which a
# classifier refuses: `_decoder_fields`)
_QWEN_DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
    "pad_token_id": None,
    "layer_norm_eps": 1e-6,
}

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(
            "bert",
            "BertModel",
            _COMMON + _BERTLIKE,
            _BERT_DEFAULTS,
            _ABSOLUTE,
            pooler=True,
            default_pooling="pooler",
            positions="absolute",
            tokenizer="WordPiece",
        ),
        Family(
            "roberta",
            "RobertaModel",
            _COMMON + _BERTLIKE,
            {**_BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1},
            _ABSOLUTE,
            pooler=True,
            default_pooling="pooler",
            positions="after_padding",
            tokenizer="byte-level BPE",
        ),
        Family(
            "xlm-roberta",
            "XLMRobertaModel",
            _COMMON + _BERTLIKE,
            {**_BERT_DEFAULTS, "pad_token_id": 1},
            _ABSOLUTE,
            pooler=True,
            default_pooling="pooler",
            positions="after_padding",
            tokenizer="SentencePiece Unigram",
        ),
        Family(
            "distilbert",
            "DistilBertModel",
            _COMMON,
            {**_BERT_DEFAULTS, "num_hidden_layers": 6},
            {"activation": "gelu"},
            pooler=False,
            default_pooling="cls",
            positions="absolute",
            tokenizer="WordPiece",
            names={
                "hidden_size": "dim",
                "num_hidden_layers": "n_layers",
                "num_attention_heads": "n_heads",
                "intermediate_size": "hidden_dim",
                "hidden_dropout_prob": "dropout",
                "attention_probs_dropout_prob": "attention_dropout",
            },
            constants={"type_vocab_size": 0, "layer_norm_eps": 1e-12},
            renames=(
                ("encoder.layer.{i}.attention.self.query", "transformer.layer.{i}.attention.q_lin"),
                ("encoder.layer.{i}.attention.self.key", "transformer.layer.{i}.attention.k_lin"),
                ("encoder.layer.{i}.attention.self.value", "transformer.layer.{i}.attention.v_lin"),
                (
                    "encoder.layer.{i}.attention.output.dense",
                    "transformer.layer.{i}.attention.out_lin",
                ),
                (
                    "encoder.layer.{i}.attention.output.LayerNorm",
                    "transformer.layer.{i}.sa_layer_norm",
                ),
                ("encoder.layer.{i}.intermediate.dense", "transformer.layer.{i}.ffn.lin1"),
                ("encoder.layer.{i}.output.dense", "transformer.layer.{i}.ffn.lin2"),
                ("encoder.layer.{i}.output.LayerNorm", "transformer.layer.{i}.output_layer_norm"),
            ),
            attention_output_dropout=False,
        ),
        Family(
            "electra",
            "ElectraModel",
            _COMMON + _BERTLIKE + ("embedding_size",),
            {
                **_BERT_DEFAULTS,
                "embedding_size": 128,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
            },
            _ABSOLUTE,
            pooler=False,
            default_pooling="cls",
            positions="absolute",
            tokenizer="WordPiece",
        ),
        Family(
            "deberta-v2",
            "DebertaV2Model",
            _COMMON + _BERTLIKE + ("embedding_size",) + _DEBERTA,
            {
                **_BERT_DEFAULTS,
                "vocab_size": 128100,
                "hidden_size": 1536,
                "num_hidden_layers": 24,
                "num_attention_heads": 24,
                "intermediate_size": 6144,
                "type_vocab_size": 0,
                "layer_norm_eps": 1e-7,
                "embedding_size": 0,  # 0 = hidden_size (transformers: getattr default)
                "relative_attention": False,
                "position_biased_input": True,
                "max_relative_positions": -1,
                "position_buckets": -1,
                "pos_att_type": (),
                "share_att_key": False,
                "norm_rel_ebd": "none",
            },
            {**_GELU, "conv_kernel_size": 0},
            pooler=False,
            default_pooling="mean",
            positions="relative",
            tokenizer="SentencePiece Unigram",
            projection="embed_proj",
            mask_embeddings=True,
            renames=(
                (
                    "encoder.layer.{i}.attention.self.query",
                    "encoder.layer.{i}.attention.self.query_proj",
                ),
                (
                    "encoder.layer.{i}.attention.self.key",
                    "encoder.layer.{i}.attention.self.key_proj",
                ),
                (
                    "encoder.layer.{i}.attention.self.value",
                    "encoder.layer.{i}.attention.self.value_proj",
                ),
                (
                    "encoder.layer.{i}.attention.self.pos_key",
                    "encoder.layer.{i}.attention.self.pos_key_proj",
                ),
                (
                    "encoder.layer.{i}.attention.self.pos_query",
                    "encoder.layer.{i}.attention.self.pos_query_proj",
                ),
            ),
        ),
        Family(
            "modernbert",
            "ModernBertModel",
            _COMMON + _MODERNBERT,
            {
                # transformers 5's ModernBertConfig defaults (ModernBERT-base)
                "vocab_size": 50368,
                "hidden_size": 768,
                "num_hidden_layers": 22,
                "num_attention_heads": 12,
                "intermediate_size": 1152,
                "max_position_embeddings": 8192,
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
                "initializer_range": 0.02,
                "pad_token_id": 50283,
                "layer_norm_eps": 1e-5,
                "embedding_dropout": 0.0,
                "layer_types": None,  # from global_attn_every_n_layers (`_modernbert_fields`)
                "local_attention": 128,
                "global_rope_theta": 160_000.0,
                "local_rope_theta": 10_000.0,
                "classifier_pooling": "cls",
            },
            {
                "hidden_activation": "gelu",
                "norm_bias": False,
                "attention_bias": False,
                "mlp_bias": False,
            },
            pooler=False,
            default_pooling="cls",
            positions="rotary",
            tokenizer="BPE (mmBERT: Gemma's)",
            names={
                "hidden_dropout_prob": "mlp_dropout",
                "attention_probs_dropout_prob": "attention_dropout",
                "layer_norm_eps": "norm_eps",
            },
            constants={"type_vocab_size": 0},
            renames=(("encoder.layer.{i}", "layers.{i}"),),
            layer_kind="modernbert",
            special_ids={
                "bos_token_id": 50281,
                "cls_token_id": 50281,
                "eos_token_id": 50282,
                "sep_token_id": 50282,
            },
        ),
        Family(
            "eurobert",
            "EuroBertModel",
            tuple(f for f in _COMMON if f != "hidden_dropout_prob") + _EUROBERT,
            {
                # transformers 5's EuroBertConfig defaults (EuroBERT-210m's shape)
                "vocab_size": 128256,
                "hidden_size": 768,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "intermediate_size": 3072,
                "max_position_embeddings": 8192,
                "attention_probs_dropout_prob": 0.0,
                "initializer_range": 0.02,
                "pad_token_id": 128001,
                "layer_norm_eps": 1e-5,
                "num_key_value_heads": None,  # = num_attention_heads
                "global_rope_theta": 10_000.0,
            },
            {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False},
            pooler=False,
            default_pooling="mean",
            positions="rotary",
            tokenizer="byte-level BPE (Llama 3's)",
            names={
                "attention_probs_dropout_prob": "attention_dropout",
                "layer_norm_eps": "rms_norm_eps",
            },
            constants={"type_vocab_size": 0, "hidden_dropout_prob": 0.0},
            renames=(("encoder.layer.{i}", "layers.{i}"),),
            layer_kind="eurobert",
            special_ids={"bos_token_id": 128000, "eos_token_id": 128001},
        ),
        _decoder(
            "qwen3",
            "Qwen3Model",
            _QWEN_DEFAULTS,
            {"attention_bias": False, "use_sliding_window": False},
            "byte-level BPE (Qwen's)",
            qk_norm=True,
        ),
        _decoder(
            "qwen2",
            "Qwen2Model",
            _QWEN_DEFAULTS,
            {"use_sliding_window": False},
            "byte-level BPE (Qwen's)",
            qkv_bias=True,
        ),
        _decoder(
            "llama",
            "LlamaModel",
            {
                "vocab_size": 32000,
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "intermediate_size": 11008,
                "max_position_embeddings": 2048,
                "pad_token_id": None,
                "layer_norm_eps": 1e-6,
            },
            {"attention_bias": False, "mlp_bias": False},
            "byte-level BPE (Llama 3's)",
        ),
    )
}


def get_family(model_type: str, source: str = "config.json") -> Family:
    if model_type not in FAMILIES:
        raise ConfigError(
            f"{source}: model_type={model_type!r} is not supported; supported: "
            + ", ".join(FAMILIES)
        )
    return FAMILIES[model_type]


def _pos_att_type(value: Any) -> tuple[str, ...]:
    """DeBERTa's `pos_att_type`: a list, or the legacy 'p2c|c2p' string."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [x.strip() for x in value.lower().split("|") if x.strip()]
    return tuple(str(x) for x in value)


def read_fields(family: Family, d: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The canonical encoder fields of a `config.json` dict of `family`, its defaults for
    keys left out, after refusing (in one line naming the option and its value) every option
    the port does not implement."""
    for key, wanted in family.required.items():
        value = d.get(key, wanted)
        if value != wanted:
            raise ConfigError(
                f"{source}: {key}={value!r} is not supported for {family.model_type} "
                f"(jaxtpu implements {key}={wanted!r})"
            )
    out = {name: d.get(family.hf_name(name), family.defaults[name]) for name in family.fields}
    out.update(family.constants)
    kind = family.kind
    pad = out["pad_token_id"]
    if kind.pads_embedding and pad is not None and not 0 <= pad < out["vocab_size"]:
        raise ConfigError(
            f"{source}: pad_token_id={out['pad_token_id']} is outside the vocabulary "
            f"(vocab_size={out['vocab_size']}); the {family.model_type} embedding pads with it"
        )
    out.update(kind.read_extra(d, out, source))
    if "embedding_size" in out and not out["embedding_size"]:
        out["embedding_size"] = out["hidden_size"]  # DeBERTa: absent = hidden_size
    if "pos_att_type" in out:
        out["pos_att_type"] = _pos_att_type(out["pos_att_type"])
        bad = [x for x in out["pos_att_type"] if x not in ("c2p", "p2c")]
        if bad:
            raise ConfigError(
                f"{source}: pos_att_type={list(out['pos_att_type'])!r} is not supported "
                "(jaxtpu implements c2p and p2c)"
            )
        norm = [x.strip() for x in str(out["norm_rel_ebd"]).lower().split("|")]
        if any(x not in ("none", "layer_norm") for x in norm):
            raise ConfigError(
                f"{source}: norm_rel_ebd={out['norm_rel_ebd']!r} is not supported "
                "(jaxtpu implements 'none' and 'layer_norm')"
            )
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    head_size = d.get("attention_head_size", hidden // heads if heads else 0)
    if heads <= 0 or hidden % heads or head_size != hidden // heads:
        raise ConfigError(
            f"{source}: hidden_size={hidden} with num_attention_heads={heads}"
            + (f" and attention_head_size={head_size}" if "attention_head_size" in d else "")
            + " is not supported (jaxtpu needs heads of hidden_size / num_attention_heads)"
        )
    return out


def write_fields(family: Family, values: Mapping[str, Any]) -> dict[str, Any]:
    """The `config.json` dict of a family's canonical field values (inverse of `read_fields`),
    complete enough that transformers' `AutoModel` builds the same model from it."""
    out = {family.hf_name(name): values[name] for name in family.fields}
    if "pos_att_type" in out:
        out["pos_att_type"] = list(out["pos_att_type"])
    out = family.kind.write_extra(out)
    # transformers' default special-token ids (of the family's vocabulary), unused by the
    # encoder, written as null where a smaller vocabulary has no such row
    for key, default in family.special_ids.items():
        if default >= out["vocab_size"]:
            out[key] = None
    out.update(family.required)
    out.update(model_type=family.model_type, architectures=[family.architecture])
    return out


def _module_regex(template: str) -> re.Pattern:
    """'encoder.layer.{i}.x' -> a regex matching that module path at the start of a key."""
    regex = re.escape(template).replace(r"\{i\}", r"(\d+)")
    return re.compile(rf"^{regex}(?=\.|$)")


def rename(family: Family, key: str, to_hf: bool = True) -> str:
    """A parameter key in jaxtpu's BERT names -> the family's Hugging Face key (`to_hf`), or
    back. Keys the table does not mention are the same on both sides."""
    for ours, theirs in family.renames:
        src, dst = (ours, theirs) if to_hf else (theirs, ours)
        new, n = _module_regex(src).subn(dst.replace("{i}", r"\1"), key)
        if n:
            return new
    return key


def default_pooling(family: Family, pooling: str, auto: str = "") -> str:
    """`--pooling` resolved for a family: 'auto' is `auto` (the encoder's
    `EncoderConfig.default_pooling`: its checkpoint's own, else the family's), or the
    family's default when not given; a pooler it does not have is a one-line error."""
    chosen = (auto or family.default_pooling) if pooling == "auto" else pooling
    if chosen not in POOLINGS:
        raise ConfigError(f"--pooling {pooling!r}: expected auto or one of {', '.join(POOLINGS)}")
    if chosen == "pooler" and not family.pooler:
        raise ConfigError(
            f"--pooling pooler: {family.model_type} has no pooler; use cls (first token) or "
            "mean (masked mean of the last hidden state)"
        )
    if chosen == "cls" and family.kind.causal:
        raise ConfigError(
            f"--pooling cls: {family.model_type} is a decoder, whose first token sees only "
            "itself; use last (its classifiers' pooling) or mean"
        )
    return chosen
