"""The models behind `jaxtpu serve`: each a `Served` model that turns the texts of a request
into the model's inputs, scores them and names its scores as attributes, with its version and
card.

A run directory (`--workdir`) and a jaxtpu or Hugging Face export (`--model-dir`) are both
scored by `jaxtpu.api.Model`, the Python API's own scorer, so the server, `jaxtpu predict` and
`jaxtpu.load()` read a comment the same way (whitespace collapsed, the run's prompt and rule
template) and give it the same score.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxtpu.api import Model
from jaxtpu.core.data import community, templates
from jaxtpu.core.data.demo import sample_comments
from jaxtpu.core.errors import UserError
from jaxtpu.core.hf.encoder import exported_head, resolve_model_dir
from jaxtpu.core.serving import card as cards
from jaxtpu.core.serving.attributes import Attribute, as_records, served_map
from jaxtpu.core.textformat import PROMPT
from jaxtpu.core.versions import installed, jax_needed
from jaxtpu.engine.scoring import load_model_dir, load_trained, params_digest
from jaxtpu.serve.onnxmodel import pick_graph

# the packaged real comments a smaller call's scores are checked on (`Served.warm_up`)
PROBE_COMMENTS = 64


@dataclass
class Served:
    """One model a server answers with.

    Attributes:
      source: how it was named on the command line (`--workdir runs/a`).
      model: its `jaxtpu.api.Model`.
      attributes: the attributes it answers.
      languages: the languages it was validated on.
      version: its content hash (`jaxtpu.core.serving.card.model_version`).
      card: what `GET /v1/model` says of it.
    """

    source: str
    model: Any
    attributes: tuple[Attribute, ...]
    languages: list[str]
    version: str = ""
    card: dict[str, Any] = field(default_factory=dict)

    @property
    def rules_model(self) -> bool:
        """Whether the model reads a rules file's rows (its `TextFormat`): each attribute is a
        rule, and a comment is scored once per rule asked for."""
        return self.model.text_format.rules

    @property
    def columns(self) -> tuple[str, ...]:
        return self.model.task.score_columns(True)

    def inputs(self, texts: list[str], wanted: list[Attribute]) -> list[Any]:
        """The model inputs for `texts` (a comment, then its sentences): the texts themselves,
        or for a rules model a (rule, text) pair for each wanted rule, rule by rule."""
        if not self.rules_model:
            return list(texts)
        return [(self._rule_text[a.name], t) for a in wanted for t in texts]

    def scores(
        self, texts: list[str], wanted: list[Attribute], out: np.ndarray
    ) -> list[dict[str, float]]:
        """Each text's scores of the `wanted` attributes, from `out`, the model's probabilities
        of `inputs(texts, wanted)`."""
        if not self.rules_model:
            index = {c: j for j, c in enumerate(self.columns)}
            return [
                {a.name: float(out[i, index[a.column]]) for a in wanted} for i in range(len(texts))
            ]
        n = len(texts)
        return [{a.name: float(out[k * n + i, 0]) for k, a in enumerate(wanted)} for i in range(n)]

    @property
    def call_rows(self) -> int:
        """Texts of one call when the model pads every call to that many of one length bucket
        (the JAX backend: the server then groups texts by bucket); 0 when it does not (ONNX)."""
        return (
            0
            if getattr(self.model, "backend", None) is None
            else int(self.model.scorer.global_batch)
        )

    def buckets(self, items: list[Any]) -> np.ndarray:
        """The length bucket of each of the model's inputs (`inputs`)."""
        return self.model.buckets(items)

    def probabilities(self, items: list[Any]) -> np.ndarray:
        """(N, columns) probabilities of the model's inputs (the batcher's scoring call); a
        model that serves communities' heads (`pooled`): (N, columns + hidden), each text's
        vector under the head after its probabilities, from the same pass."""
        if not self.pooled:
            return self.model.probabilities(items)
        probs, vectors = self.model.scored(items)
        return np.concatenate([probs, np.asarray(vectors, np.float64)], axis=1)

    @property
    def pooled(self) -> bool:
        """Whether its scoring calls give each text's vector too (`serve --communities`)."""
        return bool(getattr(getattr(self.model, "scorer", None), "pooled", False))

    def prepare(self) -> None:
        """The first text each rule attribute is scored with, as the run's rows were read."""
        self._rule_text: dict[str, str] = {}
        if not self.rules_model:
            return
        fmt = self.model.text_format
        if fmt.kind == PROMPT:  # the model renders the rule into its prompt itself
            self._rule_text = {a.name: a.rule for a in self.attributes}
            return
        template = templates.template_of(fmt)
        if set(template.fields) != {"rule"}:
            raise UserError(
                f"{self.source}: its {fmt.describe()} reads columns "
                f"{', '.join(template.fields)}, not the rule alone; a served rule is its text"
            )
        self._rule_text = {a.name: template.render({"rule": a.rule}) for a in self.attributes}

    def warm_up(self) -> int:
        """Compiles the model's program for every length bucket before the server is ready
        (from JAX's persistent compilation cache after the first start), and for a model that
        pads each call (the JAX backend), the smaller calls that give the full batch's scores
        bitwise (`Scorer.verify_sizes`: a lone request then computes fewer rows). Returns the
        programs compiled."""
        scorer = self.model.scorer
        edges = list(scorer.edges)
        texts = [" ".join(["a"] * max(1, e - 4)) for e in edges]
        rule = next(iter(self._rule_text.values()), "")
        pair = (lambda t: (rule, t)) if self.rules_model else (lambda t: t)
        self.probabilities([pair(t) for t in texts])
        if not hasattr(scorer, "verify_sizes"):
            return len(edges)
        # real comments of every length: a text of one word repeated hides rounding that
        # differs between programs (its positions are alike), real ones show it
        probe = [pair(t) for t in texts + sample_comments(PROBE_COMMENTS)]
        sizes = scorer.verify_sizes(self.model.prepared(probe))
        print(
            f"{self.source}: calls padded to {', '.join(map(str, sizes))} rows (the smallest "
            "that holds them; each gives the full batch's scores bitwise)",
            file=sys.stderr,
            flush=True,
        )
        return len(edges) * len(sizes)


def load_served(
    source: str,
    kind: str,
    attributes: str,
    languages: str,
    num_devices: int,
    batch_size: int,
    max_len: int | None,
    calibrated: bool = True,
    threads: int = 0,
    graph: dict[str, Any] | None = None,
    pooled: bool = False,
) -> Served:
    """A model to serve: a run directory (`kind` 'workdir'), an export ('model_dir') or an
    ONNX export ('onnx', on onnxruntime with `threads` threads, 0 = its default), with its
    attribute map (`--attributes`; '' for what the run or export recorded, else the columns'
    Perspective names), languages (`--languages`, '' for those it was validated on),
    calibration (the model's, unless `calibrated` is False: --no-calibration), version and
    card; an ONNX export's directory serves the graph `onnxmodel.pick_graph` times faster here
    (`graph`: that choice's record, made by --workers' supervisor for all its workers).
    `pooled`: each scoring call gives each text's vector too, from the same pass (a server of
    communities' heads, `jaxtpu head`); not an ONNX export's, whose graph gives the scores
    alone."""
    flag = f"--{kind.replace('_', '-')} {source}"
    if kind == "onnx":
        model: Any
        model, timed = pick_graph(source, batch_size, calibrated, threads)
        if pooled and not model.scorer.gives_pooled:
            raise UserError(
                f"{flag}: its graph gives the scores alone, not the vector a community's head "
                "reads (an export of a --head hf run, or one made before heads): export the "
                "run again, or serve --communities with the run (--workdir)"
            )
        model.scorer.pooled = pooled
        graph = graph or timed  # chosen here, or by --workers' supervisor (`graph`)
        trained: Any = model.trained
        stored = trained.meta.get("attributes")
        metrics = dict(trained.meta.get("metrics") or {})
    else:
        problem = jax_needed(flag)
        if problem:
            raise UserError(problem)
        from jaxtpu.engine import hosts

        hosts.use_compilation_cache()
        devices = hosts.scoring_devices(num_devices)
        if kind == "workdir":
            trained = load_trained(source)
            stored = trained.cfg.output.attributes
        else:
            trained = load_model_dir(source, max_len or 512)
            stored = exported_head(resolve_model_dir(source)).get("attributes")
        model = Model.of(trained, devices, batch_size, calibrated, pooled)
        metrics = cards.numeric(trained.meta)
    task = model.task
    if task.comments_per_example != 1 or trained.spec.task.comments_per_example != 1:
        raise UserError(
            f"{flag} is a ranking model: its scores order "
            "comments but are not probabilities; serve a toxicity, multilabel or rules model"
        )
    attrs = served_map(task.score_columns(True), bool(task.text_pairs), attributes, stored, flag)
    langs = [x.strip() for x in languages.split(",") if x.strip()] or cards.languages_of(metrics)
    served = Served(flag, model, attrs, langs)
    served.prepare()
    served.version, served.card = _version_and_card(served, trained, metrics)
    feedback = community.record(source) if kind == "workdir" else None
    if feedback:  # the decisions it learnt from: counts, dates, communities; never a text
        served.card["feedback"] = feedback
    if graph is not None:
        served.card["graph"] = graph
    return served


def _calibration_record(served: Served) -> dict[str, Any] | None:
    """What the server applies: the model's calibration record, None when it scores without
    one (none recorded, or --no-calibration)."""
    cal = served.model.scorer.calibration
    return None if cal is None else cal.to_dict()


def _version_and_card(
    served: Served, trained: Any, metrics: dict[str, float]
) -> tuple[str, dict[str, Any]]:
    if trained.params is None:  # an ONNX export: its graph file
        weights = trained.weights_digest()
    else:
        weights = params_digest(trained.params)
    return cards.build(
        served.source,
        served.model.task.name,
        served.columns,
        as_records(served.attributes),
        served.languages,
        trained.cfg,
        metrics,
        trained.meta.get("config") or {},
        weights,
        trained.tokenizer_dir,
        _calibration_record(served),
        installed("jaxtpu", "unknown"),
        getattr(served.model.scorer.model, "upcast", ""),
    )
