"""The families' own classification heads (`--head hf`), one table row each (framework-free).

`--head jaxtpu` (the default) is the notebooks' head: pooling -> dropout -> Dense(outputs).
`--head hf` is the head of the family's `*ForSequenceClassification` class in transformers
(5.23 and later), so that a run's export is a checkpoint `AutoModelForSequenceClassification`
and `pipeline("text-classification")` load, and such a checkpoint can be trained on:

| family | head (transformers' class) |
|---|---|
| bert | pooler -> dropout -> classifier |
| roberta, xlm-roberta | first token -> dropout -> dense -> tanh -> dropout -> out_proj |
| distilbert | first token -> pre_classifier -> ReLU -> dropout -> classifier |
| electra | first token -> dropout -> dense -> GELU -> dropout -> out_proj |
| deberta-v2 | first token -> ContextPooler (dense -> GELU) -> dropout -> classifier |
| modernbert | cls or mean -> head (dense -> GELU -> LayerNorm) -> dropout -> classifier |
| eurobert | bos or mean -> dense -> GELU -> classifier (no dropout) |
| qwen3, qwen2, llama | the last token that is not padding -> score (no bias, no dropout) |

A row lists the head's operations in blocks: a block's name is the module that holds its
layers in the Hugging Face checkpoint ('' = the model itself), so a layer's key there is
`block.layer.weight` (`classifier.out_proj.weight`) or `layer.weight` (`classifier.weight`).
The Flax side runs these operations (`jaxtpu.models.head`); the torch side is transformers'
own class (`torchxla_ref.models`), so the parity tests compare the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxtpu.core.errors import ConfigError

HEADS = ("jaxtpu", "hf")
SUFFIX = "ForSequenceClassification"


@dataclass(frozen=True)
class Op:
    """One operation of a head: 'dropout' (--head-dropout), 'dense' (`name`, to the hidden
    size or, `out`, to the task's outputs), 'act' (`name`: tanh, relu or gelu, exact) or
    'norm' (LayerNorm `name` with the encoder's eps)."""

    kind: str
    name: str = ""
    out: bool = False
    bias: bool = True


DROP = Op("dropout")


def _dense(name: str, out: bool = False, bias: bool = True) -> Op:
    return Op("dense", name, out, bias)


def _act(name: str) -> Op:
    return Op("act", name)


@dataclass(frozen=True)
class HfHead:
    """The `*ForSequenceClassification` head of one family (see the module docstring)."""

    prefix: str  # the attribute holding the encoder: `roberta` of `roberta.encoder...`
    poolings: tuple[str, ...]  # the --pooling values it implements, its default first
    blocks: tuple[tuple[str, tuple[Op, ...]], ...]
    dropout_key: str | None  # the config.json key of its dropout (None: it has none)
    # config.json's pooling key and its values for jaxtpu's poolings (ModernBERT, EuroBERT)
    pooling_key: str | None = None
    pooling_names: Mapping[str, str] = field(default_factory=dict)
    # config.json options the port implements one value of (absent = that value)
    required: Mapping[str, Any] = field(default_factory=dict)
    # config.json values written with a head, whatever the run (DeBERTa's pooler dropout)
    constants: Mapping[str, Any] = field(default_factory=dict)

    @property
    def modules(self) -> tuple[str, ...]:
        """The top-level modules of the head's tensors in the checkpoint."""
        names = [
            block or op.name
            for block, ops in self.blocks
            for op in ops
            if op.kind in ("dense", "norm")
        ]
        return tuple(dict.fromkeys(names))

    @property
    def output(self) -> str:
        """The module path of its last dense layer (the one with the task's outputs)."""
        block, ops = self.blocks[-1]
        name = [op.name for op in ops if op.kind == "dense"][-1]
        return f"{block}.{name}" if block else name


_ROBERTA = HfHead(
    "roberta",
    ("cls",),
    (("classifier", (DROP, _dense("dense"), _act("tanh"), DROP, _dense("out_proj", True))),),
    "classifier_dropout",
)

HF_HEADS: dict[str, HfHead] = {
    "bert": HfHead(
        "bert", ("pooler",), (("", (DROP, _dense("classifier", True))),), "classifier_dropout"
    ),
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "distilbert": HfHead(
        "distilbert",
        ("cls",),
        (("", (_dense("pre_classifier"), _act("relu"), DROP, _dense("classifier", True))),),
        "seq_classif_dropout",
    ),
    "electra": HfHead(
        "electra",
        ("cls",),
        (("classifier", (DROP, _dense("dense"), _act("gelu"), DROP, _dense("out_proj", True))),),
        "classifier_dropout",
    ),
    "deberta-v2": HfHead(
        "deberta",
        ("cls",),
        (
            ("pooler", (_dense("dense"), _act("gelu"))),
            ("", (DROP, _dense("classifier", True))),
        ),
        "cls_dropout",
        required={"pooler_hidden_act": "gelu"},
        constants={"pooler_dropout": 0.0},
    ),
    "modernbert": HfHead(
        "model",
        ("cls", "mean"),
        (
            ("head", (_dense("dense", bias=False), _act("gelu"), Op("norm", "norm", bias=False))),
            ("", (DROP, _dense("classifier", True))),
        ),
        "classifier_dropout",
        pooling_key="classifier_pooling",
        pooling_names={"cls": "cls", "mean": "mean"},
        required={"classifier_bias": False, "classifier_activation": "gelu"},
    ),
    "eurobert": HfHead(
        "model",
        ("mean", "cls"),
        (("", (_dense("dense"), _act("gelu"), _dense("classifier", True))),),
        None,
        pooling_key="classifier_pooling",
        pooling_names={"cls": "bos", "mean": "mean"},
    ),
}


# transformers' `GenericForSequenceClassification` of the decoders: `score` at the rightmost
# token whose id is not pad_token_id
_DECODER = HfHead("model", ("last",), (("", (_dense("score", True, bias=False),)),), None)
HF_HEADS.update(qwen3=_DECODER, qwen2=_DECODER, llama=_DECODER)


def hf_head(model_type: str) -> HfHead:
    return HF_HEADS[model_type]


@dataclass(frozen=True)
class HeadLayout:
    """Where a model's head sits among its checkpoint's tensors: its kind ('jaxtpu' or 'hf'),
    its top-level modules, and the module of its last dense layer (the task's outputs)."""

    kind: str = "jaxtpu"
    modules: tuple[str, ...] = ("classifier",)
    output: str = "classifier"
    # --token-head: the (yes, no) token ids whose LM-head rows start the output; () = none
    answers: tuple[int, ...] = ()

    def holds(self, key: str) -> bool:
        """Whether a (Hugging Face) key is one of the head's tensors."""
        return key.split(".", 1)[0] in self.modules


JAXTPU_HEAD = HeadLayout()


def head_layout(model_type: str, head: str = "jaxtpu", answers: tuple[int, ...] = ()) -> HeadLayout:
    if head != "hf":
        return JAXTPU_HEAD
    found = hf_head(model_type)
    return HeadLayout("hf", found.modules, found.output, tuple(answers))


def architecture(model_type: str, family_architecture: str) -> str:
    """'RobertaModel' -> 'RobertaForSequenceClassification'."""
    return family_architecture.removesuffix("Model") + SUFFIX


def hf_pooling(model_type: str, pooling: str, source: str = "--pooling") -> str:
    """The pooling of an `hf` head: `pooling` ('auto' = the head's default) if the family's
    head implements it, else a one-line error naming what it implements."""
    head = hf_head(model_type)
    if pooling == "auto":
        return head.poolings[0]
    if pooling not in head.poolings:
        raise ConfigError(
            f"{source} {pooling} with --head hf: {model_type}'s own classification head pools "
            f"with {' or '.join(head.poolings)}; use one of those, or --head jaxtpu"
        )
    return pooling


def problem_type(task: str) -> str:
    """transformers' `problem_type` of a task's head: sigmoid outputs trained with BCE
    (toxicity, each of the six labels) are multi-label classification; a ranker's score is a
    regression output."""
    return "regression" if task == "ranking" else "multi_label_classification"


def classifier_fields(
    model_type: str,
    labels: tuple[str, ...],
    task: str,
    head_dropout: float,
    pooling: str,
) -> dict[str, Any]:
    """The `config.json` keys a `*ForSequenceClassification` checkpoint adds to its encoder's:
    the labels (`id2label`, `label2id`), `problem_type`, the head's dropout and pooling."""
    head = hf_head(model_type)
    out: dict[str, Any] = {
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "problem_type": problem_type(task),
        **head.required,
        **head.constants,
    }
    if head.dropout_key:
        out[head.dropout_key] = head_dropout
    if head.pooling_key:
        out[head.pooling_key] = head.pooling_names[pooling]
    return out


@dataclass(frozen=True)
class ClassifierConfig:
    """What a `*ForSequenceClassification` config.json says of its head."""

    labels: tuple[str, ...]
    problem_type: str | None
    pooling: str | None  # jaxtpu's name of its pooling (ModernBERT, EuroBERT), else None


def is_classifier(d: Mapping[str, Any]) -> bool:
    """Whether a config.json is a `*ForSequenceClassification` checkpoint's."""
    return any(str(a).endswith(SUFFIX) for a in d.get("architectures") or ())


def read_classifier(model_type: str, d: Mapping[str, Any], source: str) -> ClassifierConfig:
    """The head a `*ForSequenceClassification` config.json describes, refusing in one line what
    the port does not implement (a pooling or an option of another value, softmax labels)."""
    head = hf_head(model_type)
    for key, wanted in head.required.items():
        if d.get(key, wanted) != wanted:
            raise ConfigError(
                f"{source}: {key}={d[key]!r} is not supported for {model_type}'s classification "
                f"head (jaxtpu implements {key}={wanted!r})"
            )
    if model_type == "deberta-v2" and d.get("pooler_hidden_size", d.get("hidden_size")) != d.get(
        "hidden_size"
    ):
        raise ConfigError(
            f"{source}: pooler_hidden_size={d['pooler_hidden_size']} is not supported "
            "(jaxtpu implements the hidden size)"
        )
    id2label = d.get("id2label") or {}
    labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int)) if id2label else ()
    if not labels:
        labels = tuple(f"LABEL_{i}" for i in range(int(d.get("num_labels", 2))))
    kind = d.get("problem_type")
    if kind == "single_label_classification" or (kind is None and len(labels) == 2):
        raise ConfigError(
            f"{source}: a {len(labels)}-label softmax classifier ({', '.join(labels)}); jaxtpu "
            "trains and scores sigmoid outputs (problem_type multi_label_classification: one "
            "score, or the six Jigsaw labels)"
        )
    pooling = None
    if head.pooling_key:
        found = d.get(head.pooling_key, head.pooling_names[head.poolings[0]])
        names = {v: k for k, v in head.pooling_names.items()}
        if found not in names:
            raise ConfigError(
                f"{source}: {head.pooling_key}={found!r} is not supported for {model_type}'s "
                f"classification head (jaxtpu implements {', '.join(names)})"
            )
        pooling = names[found]
    return ClassifierConfig(labels, kind, pooling)
