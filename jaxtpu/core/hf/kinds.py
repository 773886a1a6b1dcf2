"""The layer kinds of jaxtpu's encoders, one record each (framework-free): everything the shared
code needs to know of a kind beyond the family rows that use it (`core.hf.families`).

A kind is a way of building the layers: 'bert' (post-LayerNorm, absolute or relative positions:
BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA, DeBERTa-v3), 'modernbert' (pre-LayerNorm, no biases,
fused Wqkv, rotary positions, alternating global and sliding-window attention, GeGLU) and
'eurobert' (Llama-style: RMSNorm, grouped-query attention, SwiGLU, rotary). Its record says
which config.json fields it reads and writes beyond the family's (`read_extra`, `write_extra`),
how many matrices its feed-forward has (the FLOP count), how a scanned encoder groups its layers
(`scan_layout`), which Hugging Face modules are its embedding (`--layer-lr-decay`), whether
`--encoder-dropout` drops its embeddings too, and which module of `jaxtpu.models` builds it (its
`Backbone`). 'decoder' is the causal kind of Qwen3, Qwen2.5 and Llama 3 (EuroBERT's layers, with
causal attention, q/k/v biases, per-head q/k norms and Llama 3.1's rotary scaling as their
configs say). Adding a kind is a record here, that Flax module and a test checkpoint in
`parity_tests/families.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.errors import ConfigError

log = logging.getLogger(__name__)

# The attention kinds of ModernBERT's `layer_types`: every token, or a window of
# `local_attention // 2` tokens on each side.
FULL, SLIDING = "full_attention", "sliding_attention"


# A decoder layer's dense modules: attention's four projections and SwiGLU's three.
DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _no_fields(d: Mapping[str, Any], out: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {}


def _as_written(out: dict[str, Any]) -> dict[str, Any]:
    return out


@dataclass(frozen=True)
class LayerKind:
    """One layer kind (see the module docstring)."""

    name: str
    module: str  # the `jaxtpu.models` module whose `Backbone` builds it
    ffn_matrices: int  # 2 (up, down) or 3 (a gated feed-forward: the gate too)
    # the Hugging Face module names (first part of a parameter's key) of the embedding: its
    # rate under --layer-lr-decay is the lowest
    embedding_modules: tuple[str, ...]
    embedding_dropout: bool = False  # --encoder-dropout drops the embeddings' output too
    # transformers builds the token embedding with padding_idx=pad_token_id (so the pad id
    # must be a row of the vocabulary)
    pads_embedding: bool = False
    # (first, period) of a scanned encoder from its `layer_types`: layers before `first` run
    # on their own, the rest are scanned in groups of `period` (0: one stack of every layer)
    scan_layout: Callable[[tuple[str, ...]], tuple[int, int]] = lambda types: (0, 0)
    # the kind's own canonical fields from a config.json dict (`d`) once the family's are
    # read (`out`), each unsupported value a one-line ConfigError naming `source`
    read_extra: Callable[[Mapping[str, Any], Mapping[str, Any], str], dict[str, Any]] = _no_fields
    # the config.json dict written for the kind's fields (from the family's, in place)
    write_extra: Callable[[dict[str, Any]], dict[str, Any]] = _as_written
    # the layer-by-layer bisection's capture points (`parity_tests.forward`), as jaxtpu names
    # its modules: the embedding, each layer's blocks under `encoder.layer.{i}` ('' = the
    # layer's own output) and the last ('': BERT's pooler, when the family has one); a kind
    # whose layers Hugging Face names otherwise finds its torch modules through the family's
    # renames (`renamed_capture`)
    capture: tuple[str, tuple[str, ...], str] = (
        "embeddings",
        ("attention", "intermediate", "output"),
        "",
    )
    renamed_capture: bool = False
    # causal attention: a token sees itself and the tokens before it (the decoders), so the
    # first token's state says nothing of the text
    causal: bool = False
    # the dense modules `--lora-rank` may adapt, by their Hugging Face names (peft's
    # target_modules); () = the kind has no LoRA
    lora_targets: tuple[str, ...] = ()


def scan_period(layer_types: tuple[str, ...]) -> int:
    """The layers a scanned ModernBERT repeats as one group: the shortest period of the kinds
    of layers 1..n-1 (layer 0, without an attention LayerNorm, runs on its own): 3 for
    ModernBERT's every-third-global (sliding, sliding, global); all of them (one group) when
    they repeat no shorter pattern; 0 for a one-layer model."""
    rest = tuple(layer_types[1:])
    for period in range(1, len(rest) + 1):
        if len(rest) % period == 0 and rest == rest[:period] * (len(rest) // period):
            return period
    return 0


def _modernbert_fields(d: Mapping[str, Any], out: Mapping[str, Any], source: str) -> dict:
    """ModernBERT's layer kinds and rotary bases as both config.json forms write them:
    transformers 5's `layer_types` and `rope_parameters` per layer kind, or the hub's older
    `global_attn_every_n_layers`, `global_rope_theta` and `local_rope_theta`. Anything but the
    default rotary embedding, or a layer kind the port does not know, is a one-line error."""
    n = out["num_hidden_layers"]
    kinds = d.get("layer_types")
    if not kinds:
        every = d.get("global_attn_every_n_layers", 3)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(
                f"{source}: global_attn_every_n_layers={every!r} (expected an integer >= 1 when "
                "the config has no layer_types)"
            )
        kinds = [SLIDING if i % every else FULL for i in range(n)]
    if len(kinds) != n or any(k not in (FULL, SLIDING) for k in kinds):
        raise ConfigError(
            f"{source}: layer_types={list(kinds)!r} is not supported (jaxtpu implements "
            f"{n} layers of {FULL!r} or {SLIDING!r})"
        )
    if d.get("rope_scaling"):
        raise ConfigError(f"{source}: rope_scaling={d['rope_scaling']!r} is not supported")
    rope = d.get("rope_parameters") or {}
    thetas = {}
    for kind, name in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConfigError(
                f"{source}: rope_parameters[{kind!r}].rope_type={params['rope_type']!r} is not "
                "supported (jaxtpu implements 'default')"
            )
        thetas[name] = float(params.get("rope_theta", d.get(name, out[name])))
    pooling, window = out["classifier_pooling"], out["local_attention"]
    if pooling not in ("cls", "mean"):
        raise ConfigError(f"{source}: classifier_pooling={pooling!r} (expected cls or mean)")
    if not isinstance(window, int) or window < 2:
        raise ConfigError(f"{source}: local_attention={window!r} (expected an integer >= 2)")
    # sentence-transformers' older ModernBERT configs spell norm_eps as layer_norm_eps
    eps = d.get("norm_eps", d.get("layer_norm_eps", out["layer_norm_eps"]))
    return {"layer_types": tuple(str(k) for k in kinds), **thetas, "layer_norm_eps": eps}


def _modernbert_written(out: dict[str, Any]) -> dict[str, Any]:
    out["layer_types"] = list(out["layer_types"])
    out["rope_parameters"] = {
        kind: {"rope_type": "default", "rope_theta": out.pop(name)}
        for kind, name in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta"))
    }
    return out


def _kv_heads(out: Mapping[str, Any], source: str) -> int:
    """Grouped-query attention's key/value heads (absent = one per query head), refused in one
    line when they do not divide the query heads."""
    heads = out["num_attention_heads"]
    kv = out["num_key_value_heads"] or heads
    if kv <= 0 or heads % kv:
        raise ConfigError(
            f"{source}: num_key_value_heads={kv} does not divide num_attention_heads={heads}"
        )
    return kv


def _eurobert_fields(d: Mapping[str, Any], out: Mapping[str, Any], source: str) -> dict:
    """EuroBERT's key/value heads (absent = one per query head) and its one rotary base
    (`rope_parameters.rope_theta`, or an older `rope_theta`); another rotary type, a head_dim
    other than hidden / heads is a one-line error."""
    heads, kv = out["num_attention_heads"], _kv_heads(out, source)
    head_dim = d.get("head_dim") or out["hidden_size"] // max(heads, 1)
    if head_dim * heads != out["hidden_size"]:
        raise ConfigError(
            f"{source}: head_dim={head_dim} is not supported (jaxtpu needs hidden_size / "
            "num_attention_heads)"
        )
    rope = d.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or d.get("rope_scaling"):
        raise ConfigError(
            f"{source}: rope_parameters={rope!r} is not supported (jaxtpu implements "
            "rope_type 'default')"
        )
    theta = rope.get("rope_theta", d.get("rope_theta", out["global_rope_theta"]))
    return {"num_key_value_heads": kv, "global_rope_theta": float(theta)}


def _eurobert_written(out: dict[str, Any]) -> dict[str, Any]:
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": out.pop("global_rope_theta")}
    return out


LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _decoder_fields(d: Mapping[str, Any], out: Mapping[str, Any], source: str) -> dict:
    """A decoder's key/value heads, head width, rotary base and scaling, as transformers 5
    writes them (`rope_parameters`) or the hub's configs do (`rope_theta`, `rope_scaling`):
    `default`, or Llama 3.1's `llama3` with its four numbers; another rotary type, layers that
    are not all full attention, or no pad_token_id (a classifier reads the last token that is
    not padding) is a one-line error."""
    heads, kv = out["num_attention_heads"], _kv_heads(out, source)
    pad = d.get("pad_token_id")
    if pad is None:  # Llama 3's configs: transformers' classifiers are told to pad with eos
        eos = d.get("eos_token_id")
        pad = eos[0] if isinstance(eos, list) and eos else eos
        if pad is None:
            raise ConfigError(
                f"{source}: no pad_token_id and no eos_token_id; a {d.get('model_type')} "
                "classifier reads each text's last token that is not padding, so the config "
                "needs one (set pad_token_id to the tokenizer's pad token id)"
            )
        log.info(
            "%s: no pad_token_id; padding with eos_token_id %d as transformers does", source, pad
        )
    kinds = d.get("layer_types") or []
    if any(k != FULL for k in kinds):
        raise ConfigError(
            f"{source}: layer_types={list(kinds)!r} is not supported (jaxtpu implements "
            f"{FULL!r} layers)"
        )
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", d.get("rope_theta", out["global_rope_theta"]))
    scaling: tuple[float, ...] = ()
    if kind == "llama3":
        missing = [k for k in LLAMA3_KEYS if k not in rope]
        if missing:
            raise ConfigError(f"{source}: rope_type llama3 without {', '.join(missing)}")
        scaling = tuple(float(rope[k]) for k in LLAMA3_KEYS)
    elif kind != "default":
        raise ConfigError(
            f"{source}: rope_type={kind!r} is not supported (jaxtpu implements 'default' and "
            "'llama3')"
        )
    return {
        "pad_token_id": int(pad),
        "num_key_value_heads": kv,
        "head_dim": int(d.get("head_dim") or out["hidden_size"] // max(heads, 1)),
        "global_rope_theta": float(theta),
        "rope_scaling": scaling,
    }


def _decoder_written(out: dict[str, Any]) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": out.pop("global_rope_theta")}
    scaling = out.pop("rope_scaling")
    if scaling:
        rope.update(rope_type="llama3", **dict(zip(LLAMA3_KEYS, scaling, strict=True)))
        rope["original_max_position_embeddings"] = int(scaling[-1])
    out["rope_parameters"] = rope
    return out


LAYER_KINDS: dict[str, LayerKind] = {
    k.name: k
    for k in (
        LayerKind(
            "bert",
            "jaxtpu.models.bert",
            ffn_matrices=2,
            # BERT's `embeddings`, ELECTRA's `embeddings_project` after them
            embedding_modules=("embeddings", "embeddings_project"),
        ),
        LayerKind(
            "modernbert",
            "jaxtpu.models.modernbert",
            ffn_matrices=3,  # GeGLU
            embedding_modules=("embeddings",),
            embedding_dropout=True,  # ModernBERT's own embedding_dropout
            pads_embedding=True,
            # layer 0 has no attention norm; the rest repeat their attention kinds
            scan_layout=lambda types: (1, scan_period(types)),
            read_extra=_modernbert_fields,
            write_extra=_modernbert_written,
            capture=("embeddings", ("attn", "mlp", ""), "final_norm"),
            renamed_capture=True,
        ),
        LayerKind(
            "eurobert",
            "jaxtpu.models.eurobert",
            ffn_matrices=3,  # SwiGLU
            embedding_modules=("embed_tokens",),
            pads_embedding=True,
            scan_layout=lambda types: (0, 1),  # every layer alike
            read_extra=_eurobert_fields,
            write_extra=_eurobert_written,
            capture=("embed_tokens", ("self_attn", "mlp", ""), "norm"),
            renamed_capture=True,
        ),
        LayerKind(
            "decoder",
            "jaxtpu.models.eurobert",  # its layers, causal (`causal`) with the decoders' options
            ffn_matrices=3,  # SwiGLU
            embedding_modules=("embed_tokens",),
            pads_embedding=True,
            scan_layout=lambda types: (0, 1),  # every layer alike
            read_extra=_decoder_fields,
            write_extra=_decoder_written,
            capture=("embed_tokens", ("self_attn", "mlp", ""), "norm"),
            renamed_capture=True,
            causal=True,
            lora_targets=DECODER_PROJECTIONS,
        ),
    )
}


def get_kind(name: str) -> LayerKind:
    if name not in LAYER_KINDS:
        raise ConfigError(f"layer kind {name!r} is not known; known: {', '.join(LAYER_KINDS)}")
    return LAYER_KINDS[name]
