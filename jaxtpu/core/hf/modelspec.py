"""`ModelSpec`: what a model is built from, one record both sides build from
(framework-free): the encoder's architecture and the run's choices about the model around it
(head and its dropout, pooling, outputs, the text pairs' separator, the answer tokens of a
token head, LoRA and the adapter it continues, precision, and the JAX side's compile options).
`RunSpec.model_spec` resolves it once from a run's flags; `jaxtpu.models.create_module` and
`torchxla_ref.weights.load_model` take it, and so does `export` for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.lora import LoraSpec


@dataclass(frozen=True)
class ModelSpec:
    """A model to build.

    Attributes:
      encoder: the encoder's architecture (its config.json, dropout applied).
      head_dropout: dropout before jaxtpu's Dense head (the family's own head: its own).
      precision: 'fp32', 'bf16' or 'fp16': the compute dtype (storage is fp32).
      pooling: how a comment becomes one vector (`core.hf.families.POOLINGS`); None: the
        family's default.
      outputs: the head's outputs (the task's labels, then its auxiliary targets).
      head: 'jaxtpu' (pooling -> dropout -> Dense) or 'hf' (the family's own head).
      segment_sep: text pairs' separator id, after which tokens are type 1; -1: none.
      answers: --token-head's (yes, no) token ids, whose LM-head rows start the score; ().
      lora: the adapters on the frozen base (`core.lora`); None: every weight trains.
      adapter: a peft adapter directory the adapters continue (its `weights` are the base's).
      remat, scan, matmul_output: the JAX side's compile options (`--remat`,
        `--scan-layers`, `--matmul-output`); the torch side has none of them.
    """

    encoder: EncoderConfig
    head_dropout: float = 0.0
    precision: str = "fp32"
    pooling: str | None = None
    outputs: int = 1
    head: str = "jaxtpu"
    segment_sep: int = -1
    answers: tuple[int, ...] = ()
    lora: LoraSpec | None = None
    adapter: str | None = None
    remat: str = "none"
    scan: bool = False
    matmul_output: str = "fp32"
