"""A trained model loaded to score with, from any of its three sources (a run directory's best
checkpoint, a PyTorch notebook's state dict, a fine-tuned Hugging Face classifier directory),
and the `Scorer` that runs it on the devices with its compiled programs kept. What predict,
evaluate, export, severity-weights and the Python API (`jaxtpu.load`) score with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import calibration, metrics, storage
from jaxtpu.core.calibration import Calibration
from jaxtpu.core.data import readers, tokenized
from jaxtpu.core.data.buckets import Batcher, edge_of, fixed_edges, real_lengths
from jaxtpu.core.data.filekinds import BY_NAME, kind_of
from jaxtpu.core.data.history.rows import TEXT_COLUMNS as HISTORY_TEXT_COLUMNS
from jaxtpu.core.data.perspective import FOLDER as PERSPECTIVE_FOLDER
from jaxtpu.core.data.perspective import TRAIN as PERSPECTIVE_TRAIN
from jaxtpu.core.data.tables import open_table
from jaxtpu.core.data.templates import normalize_text
from jaxtpu.core.data.tokens import encode_texts, load_tokenizer, tokenizer_fingerprint
from jaxtpu.core.errors import DataError, UserError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config, from_dict
from jaxtpu.core.hardware import SCORE_PRECISION_ENV, scoring_precision
from jaxtpu.core.hf.directory import HEAD_FILE
from jaxtpu.core.hf.encoder import (
    EncoderConfig,
    exported_head,
    read_classifier_dir,
    read_encoder,
    resolve_model_dir,
)
from jaxtpu.core.hf.statedict import read_notebook_checkpoint
from jaxtpu.core.run import loop
from jaxtpu.core.serving.attributes import attribute_map
from jaxtpu.core.serving.card import digest_arrays
from jaxtpu.core.serving.heads import POOLED
from jaxtpu.core.tasks import LABELS, get_task
from jaxtpu.engine import weights


@dataclass
class TrainedModel:
    cfg: Config
    spec: RunSpec
    module: Any
    params: Any
    meta: dict[str, Any]
    tokenizer_dir: Path
    # the run's (or export's) per-output Platt scaling; None: a ranker, or none recorded
    calibration: Calibration | None = None
    # why it is scored in another precision than it trained in (`for_scoring`); '' when not
    upcast: str = ""


def for_scoring(model: TrainedModel, devices: list[Any]) -> TrainedModel:
    """`model` as it is scored on `devices`: a bf16 (or fp16) run on a CPU that would emulate
    that type is scored in fp32 (its compute dtype fp32, its weights upcast), said once on
    stderr; anything else as it trained (`jaxtpu.core.hardware.scoring_precision`, and its
    environment variable). Every scoring command goes through here, so they agree."""
    import jax

    from jaxtpu.models import encoder as models

    if model.upcast:
        return model
    precision = model.cfg.train.precision
    platform = devices[0].platform if devices else "cpu"
    choice = os.environ.get(SCORE_PRECISION_ENV, "auto").strip().lower() or "auto"
    try:
        wanted, why = scoring_precision(precision, platform, choice)
    except ValueError as e:
        raise UserError(str(e)) from None
    if wanted == precision:
        return model
    cfg = model.cfg.replace(precision=wanted)
    floats = lambda x: x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x  # noqa: E731
    params = jax.tree.map(lambda x: floats(np.asarray(x)), model.params)
    print(
        f"scoring in fp32: the run trained in {precision}, and {why} (the weights upcast; "
        f"{SCORE_PRECISION_ENV}=run scores in {precision})",
        file=sys.stderr,
        flush=True,
    )
    return dataclasses.replace(
        model,
        cfg=cfg,
        module=models.for_run(cfg, model.spec, scan=False),
        params=params,
        upcast=f"fp32 ({why})",
    )


def load_trained(workdir: str | Path) -> TrainedModel:
    """The best checkpoint of a run directory (a path, or a bucket URL: its config.json and
    tokenizer are copied here, the checkpoint is read from the bucket), with its config,
    encoder shape and tokenizer."""
    from jaxtpu.engine import checkpoint
    from jaxtpu.models import encoder as models
    from jaxtpu.models import layers

    wd, tokenizer_dir = run_files(workdir)
    with storage.named(wd, str(workdir)):
        cfg, recorded = read_run_config(wd)
    ckpts = checkpoint.Checkpoints(workdir)
    try:
        meta = ckpts.best_meta()
        if meta is None:
            raise UserError(f"--workdir {wd}: no best checkpoint yet (the run has not evaluated)")
        enc = EncoderConfig.from_hf_dict(meta["encoder"])
        spec = RunSpec.of_checkpoint(cfg, enc, recorded.get("resolved"))
        module = models.for_run(cfg, spec, scan=False)
        stored = models.for_run(cfg, spec)  # a scanned run stored its layers stacked
        template = models.param_shapes(stored, spec.task.example_shape(8))
        params, meta = ckpts.restore_best(template, spec.model_key)
    finally:
        ckpts.close()
    if cfg.model.scan_layers:  # scored and exported as the unscanned model: same weights
        params = layers.unstack_layers(params)
    return TrainedModel(cfg, spec, module, params, meta, tokenizer_dir, run_calibration(workdir))


def run_calibration(workdir: str | Path) -> Calibration | None:
    """A run's `calibration.json` (in a bucket: a local copy of it), None when it has none."""
    path = storage.join(str(workdir), calibration.FILE)
    if storage.is_remote(path):
        if not storage.exists(path):
            return None
        path = str(storage.fetch(path, "--workdir"))
    return calibration.read(path)


def run_files(workdir: str | Path) -> tuple[Path, Path]:
    """The directory holding a run's config.json, and its tokenizer: a local run's own; for
    a run in a bucket, local copies of them (what scoring reads besides the checkpoint)."""
    if not storage.is_remote(workdir):
        return Path(workdir), Path(workdir) / "tokenizer"
    url = str(workdir)
    if not storage.exists(storage.join(url, "config.json")):
        raise UserError(f"--workdir {url}: no config.json; not a jaxtpu run directory")
    record = storage.fetch(storage.join(url, "config.json"), "--workdir")
    return record.parent, storage.fetch(storage.join(url, "tokenizer"), "--workdir")


def read_run_config(wd: Path) -> tuple[Config, dict[str, Any]]:
    """The config a run directory records (its config.json), or one line saying what `wd` is
    instead: missing, a Hugging Face model directory, or some other directory."""
    record = wd / "config.json"
    if not wd.is_dir():
        raise UserError(f"--workdir {wd}: no such run directory")
    if not record.exists():
        raise UserError(f"--workdir {wd}: no config.json; not a jaxtpu run directory")
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"--workdir {wd}: unreadable config.json ({e})") from None
    if (
        isinstance(recorded, dict)
        and "config" not in recorded
        and ("model_type" in recorded or "architectures" in recorded)
    ):
        raise UserError(
            f"--workdir {wd} is a Hugging Face model directory, not a jaxtpu run directory: "
            "train from it with --model-dir; predict scores a run (--workdir) or a notebook's "
            "state dict (--init-from FILE --model-dir DIR)"
        )
    if not isinstance(recorded, dict) or not isinstance(recorded.get("config"), dict):
        raise UserError(
            f"--workdir {wd}: its config.json is not a jaxtpu run's (no 'config' section)"
        )
    return from_dict(recorded["config"]), recorded


def run_attributes(wd: Path) -> tuple[tuple[Any, ...], Config]:
    """The attributes a run answers (its attribute map over its score columns, auxiliary
    targets included), and its config; the six Toxic Comment labels' when it names none."""
    cfg, _ = read_run_config(wd)
    columns = cfg.task.score_columns(True)
    return attribute_map(columns, bool(cfg.task.text_pairs), cfg.output.attributes), cfg


def training_texts(cfg: Config, wd: Path) -> tuple[set[str] | None, str]:
    """The comments (as jaxtpu reads them: whitespace collapsed) of a run's training rows (a
    --perspective run's WORKDIR/perspective/train.csv, else its recorded training file), and
    the file's name; None when it is not where its path points from here."""
    prepared = wd / PERSPECTIVE_FOLDER / PERSPECTIVE_TRAIN
    path = str(prepared) if prepared.is_file() else cfg.data.train_csv
    if not path or not Path(path).is_file():
        return None, str(path)
    table = open_table(path)
    column = next((c for c in HISTORY_TEXT_COLUMNS if c in table.header), None)
    if column is None:
        return set(), str(path)
    return {normalize_text(r.get(column) or "") for _, r in table.rows()}, str(path)


def load_notebook(init_from: str, model_dir: str, max_len: int) -> TrainedModel:
    """A training notebook's state-dict file (`--init-from`) with the config and tokenizer of
    `model_dir`, scored in fp32 as the notebook's module does in eval mode. Its task is what
    its head scores: one output is scored as toxicity (a ranker's score is the same number),
    six as the multi-label model (`export --format state-dict` of a multilabel run)."""

    task = "toxicity"
    if Path(init_from).is_file():
        head = read_notebook_checkpoint(init_from).head.get("classifier.weight")
        if head is not None and head.shape[0] == len(LABELS):
            task = "multilabel"
    cfg = Config().replace(  # validated, as every flag
        init_from=init_from, model_dir=model_dir, max_len=max_len, precision="fp32", task=task
    )
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    return TrainedModel(cfg, spec, model.module, model.params, {}, Path(spec.tokenizer_dir))


def load_model_dir(model_dir: str, max_len: int, pairs: bool = False) -> TrainedModel:
    """A fine-tuned Hugging Face directory, scored without a run: a
    `*ForSequenceClassification` checkpoint (transformers', or a `--head hf` export) with its
    own head, or a jaxtpu export (`head.safetensors`), in fp32. Its task is what its head
    scores: the six Jigsaw labels are the multi-label model, one output toxicity (a ranker
    when `pairs`: the same score of each comment of a pair; an export records its task).

    Raises:
      UserError: a directory without a classification head (a plain encoder), or a head of
        another number of outputs or of other labels than the six Jigsaw ones.
    """

    where = resolve_model_dir(model_dir) or ""
    enc = read_encoder(where)
    classifier = read_classifier_dir(where, enc.model_type)
    if classifier is not None:
        head, task = "hf", classifier_task(model_dir, classifier, pairs)
    elif (Path(where) / HEAD_FILE).exists():
        head = "jaxtpu"
        task = exported_head(where).get("task") or "toxicity"
        if task == "toxicity" and pairs:
            task = "ranking"
    else:
        raise UserError(
            f"--model-dir {model_dir}: no classification head (neither a "
            f"*ForSequenceClassification checkpoint nor a jaxtpu export with {HEAD_FILE}); it "
            "is an encoder to train on: jaxtpu train --model-dir DIR"
        )
    cfg = Config().replace(  # validated, as every flag
        model_dir=model_dir, max_len=max_len, precision="fp32", task=task, head=head
    )
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    return TrainedModel(
        cfg,
        spec,
        model.module,
        model.params,
        {},
        Path(spec.tokenizer_dir),
        calibration.of_export(where),
    )


def classifier_task(model_dir: str, classifier: Any, pairs: bool) -> str:
    """The task a `*ForSequenceClassification` head (`ClassifierConfig`) is scored as: the six
    Jigsaw labels the multi-label model, one output toxicity (a ranker when `pairs`), with a
    warning on stderr where its labels or outputs are not what the names say.

    Raises:
      UserError: a head of another number of outputs or of other labels."""
    labels = classifier.labels
    generic = labels == tuple(f"LABEL_{i}" for i in range(len(labels)))
    if len(labels) == len(LABELS) and (labels == LABELS or generic):
        task = "multilabel"
    elif len(labels) == 1:
        task = "ranking" if pairs else "toxicity"
        if classifier.problem_type != "multi_label_classification" and not pairs:
            print(regression_warning(model_dir, classifier.problem_type), file=sys.stderr)
    else:
        raise UserError(
            f"--model-dir {model_dir}: its head scores {len(labels)} labels "
            f"({', '.join(labels)}); jaxtpu scores one toxicity score or the six Jigsaw "
            f"labels ({', '.join(LABELS)})"
        )
    if generic and len(labels) > 1:
        print(
            f"warning: --model-dir {model_dir} names its labels {', '.join(labels)}; "
            f"scored as {', '.join(LABELS)} in that order",
            file=sys.stderr,
        )
    return task


def regression_warning(model_dir: str, problem_type: str | None) -> str:
    """What the scores of a one-output head that is not a classifier's are (transformers
    trains a head of `problem_type` regression, or unset with one label, with a squared error:
    its output is a value, not a logit)."""
    why = f"problem_type {problem_type}" if problem_type else "one label and no problem_type"
    return (
        f"warning: --model-dir {model_dir}: its head is a regression output ({why}, which "
        "transformers trains with a squared error); its outputs are written through a sigmoid, "
        "which keeps their order but does not make them probabilities"
    )


def scoring_backend(
    model: TrainedModel, devices: list[Any], task: Any, pooled: bool = False
) -> Any:
    """A backend that evaluates `model` on `devices` (jit, data-parallel) as `task` lays its
    batches out; it keeps its compiled programs for every batch shape it meets. `pooled`: its
    evaluations also give each comment's vector (`steps.eval_step`)."""
    import optax

    from jaxtpu.engine import parallel, steps
    from jaxtpu.engine.backend import JaxBackend

    fns = steps.for_task(task, model.cfg.train.margin, pooled=pooled)
    strategy = parallel.make_strategy("jit", devices, fns)
    state = steps.create_state(model.module.apply, model.params, optax.identity())
    backend = JaxBackend(strategy, state, seed=0)
    backend.start()
    return backend


def one_comment_task(task: Any) -> Any:
    """How a model scores single comments: every task's model scores one comment per row, a
    ranker as toxicity does, a multi-label model as itself (its scores per comment)."""

    return task if task.comments_per_example == 1 else get_task("toxicity")


def params_digest(params: Any) -> str:
    """sha256 of a model's parameters (every array's path, dtype, shape and bytes): the
    weights part of its version (`jaxtpu.core.serving.card`)."""
    from flax.traverse_util import flatten_dict

    flat = flatten_dict(params)
    return digest_arrays(("/".join(map(str, k)), np.asarray(v)) for k, v in flat.items())


def text_buckets(
    texts: Sequence[Any], tokenizer: Any, max_len: int, edges: Sequence[int], form: str
) -> np.ndarray:
    """The length bucket (edge) of each of `texts` (in `form`, `jaxtpu.core.textformat`)
    under `tokenizer`, as scoring cuts them."""
    if not texts:
        return np.zeros(0, np.int64)
    _, mask = encode_texts(texts, tokenizer, max_len, form)
    return edge_of(real_lengths(mask), edges, max_len)


class Scorer:
    """A model ready to score comments on `devices`: its tokenizer, a backend that keeps its
    compiled programs, and fixed length buckets (powers of two up to the run's --max-len), so
    each length compiles once whatever it is given (`predict`'s chunks, the Python API's
    calls)."""

    def __init__(
        self,
        model: TrainedModel,
        devices: list[Any],
        batch_size: int,
        calibrated: bool = True,
        pooled: bool = False,
    ) -> None:
        self.model = model = for_scoring(model, devices)
        # the scaling `calibrate` applies: the model's, unless scoring uncalibrated
        self.calibration = model.calibration if calibrated else None
        # `features` gives each comment's vector beside its outputs: asked for (a server of
        # communities' heads), or read by the calibration (a column read out of the vector)
        self.pooled = pooled or bool(self.calibration and self.calibration.needs_pooled)
        self.task = one_comment_task(model.spec.task)
        self.tokenizer = load_tokenizer(model.tokenizer_dir, model.spec.pad_id)
        self.max_len = model.cfg.data.max_len
        self.form = model.spec.text_format.kind  # what `logits` is given: texts, pairs, prompts
        self.global_batch = batch_size * len(devices)
        self.backend = scoring_backend(model, devices, self.task, self.pooled)
        self.edges = fixed_edges(self.max_len)
        self.devices = len(devices)
        # the rows a call is padded to: the smallest of these that holds it. Only the full
        # batch, unless `verify_sizes` found smaller calls that give its scores bitwise
        self.sizes: tuple[int, ...] = (self.global_batch,)

    def call_size(self, n: int) -> int:
        """The rows a call of `n` texts is padded to (each bucket's batch)."""
        return next((size for size in self.sizes if size >= n), self.global_batch)

    def verify_sizes(self, probe: Sequence[Any]) -> tuple[int, ...]:
        """Lets calls be padded to fewer rows than the full batch (halvings of it, down to
        one row a device) where a call of that size gives `probe`'s texts (one a length
        bucket) the full batch's scores bitwise, so a text's score still does not depend on
        the call it is in; compiles those programs now. Returns the sizes kept, the full
        batch last. A bf16 program of another shape rounds differently (about 1e-3): it keeps
        the full batch alone; an fp32 one on XLA:CPU kept 4 and 8 of 16 rows here."""
        full = self.logits(probe)
        kept = []
        size = self.devices
        while size < self.global_batch:
            self.sizes = (size, self.global_batch)
            calls = [self.logits(probe[i : i + size]) for i in range(0, len(probe), size)]
            if np.array_equal(np.concatenate(calls), full):
                kept.append(size)
            size *= 2
        self.sizes = (*kept, self.global_batch)
        return self.sizes

    def logits(self, texts: Sequence[Any]) -> np.ndarray:
        """The raw outputs for (normalized) `texts`, or the text pairs or prompts of the
        model's text format (`form`): (N,) or (N, labels); tokenized in memory, without the
        disk cache (each is scored once)."""

        return self._scored(texts)[0]

    def features(self, texts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """(`logits`, each text's vector under the head: (N, hidden) fp32) from one pass of
        the model, for a scorer made with `pooled` (what a community's head reads)."""
        if not self.pooled:
            raise ValueError("features needs a Scorer made with pooled=True")
        return self._scored(texts)

    def _scored(self, texts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros((0, *self.task.label_shape), np.float32), np.zeros((0, 0), np.float32)
        ids, mask = encode_texts(texts, self.tokenizer, self.max_len, self.form)
        label = self.task.zeros((len(texts),), self.max_len)["label"]  # Task.batch_layout's
        batcher = Batcher(real_lengths(mask), self.call_size(len(texts)), self.max_len, self.edges)
        layout = self.task.batch_layout(self.max_len)
        examples = tokenized.Examples(ids, mask, label, layout=layout)
        extra = (POOLED,) if self.pooled else ()
        _, scores, *vectors = loop.score_examples(
            self.backend, examples, batcher, self.task, False, extra
        )
        return scores, (vectors[0] if vectors else np.zeros((len(texts), 0), np.float32))

    def buckets(self, texts: Sequence[Any]) -> np.ndarray:
        """The length bucket (edge) each of `texts` is scored in by `logits`."""
        return text_buckets(texts, self.tokenizer, self.max_len, self.edges, self.form)

    def calibrate(
        self,
        logits: np.ndarray,
        pooled: np.ndarray | None = None,
        texts: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """`logits` (of `logits`) as calibrated logits, whose sigmoid is the probability
        predict, the API and the server give (`jaxtpu.core.calibration`); as they are when the
        model has no calibration or scores without it. `pooled`: the texts' vectors (of
        `features`), which a calibration with readouts reads; `texts`: the texts scored, which
        a readout of their n-grams reads."""
        return calibrated_logits(self.calibration, logits, pooled, texts)

    def scores(self, texts: Sequence[Any]) -> np.ndarray:
        """`texts`' calibrated logits (`calibrate` of `logits`), from one pass of the model
        that gives their vectors too where the calibration reads them."""
        return scores_of(self, texts)


def calibrated_logits(
    cal: Any, logits: np.ndarray, pooled: np.ndarray | None, texts: Sequence[Any] | None = None
) -> np.ndarray:
    """A scorer's `calibrate` (this one's and the ONNX scorer's): `logits` through `cal`
    (a `jaxtpu.core.calibration.Calibration`, None: as they are), `pooled` and `texts` for its
    readouts."""
    return logits if cal is None else cal.apply(logits, pooled, texts)


def scores_of(scorer: Any, texts: Sequence[Any]) -> np.ndarray:
    """A scorer's `scores` (this one's and the ONNX scorer's): calibrated logits of `texts`,
    from `features` where the calibration reads the vectors, else from `logits`."""
    if scorer.calibration is not None and scorer.calibration.needs_pooled:
        return scorer.calibrate(*scorer.features(texts), texts)
    return scorer.calibrate(scorer.logits(texts))


def check_ensemble(
    models: list[TrainedModel], workdirs: Sequence[str], ranks: bool = False
) -> None:
    """Models averaged together must score the same thing from the same tokens; models whose
    `ranks` are averaged (--rank-by-rule: each ranks the same rows of one file, each read its
    own way) need only the same task, so a decoder's prompts blend with an encoder's pairs."""

    first = models[0]
    for model, wd in zip(models[1:], workdirs[1:], strict=True):
        if model.spec.task.name != first.spec.task.name:
            raise UserError(
                f"--workdir {wd} is a {model.spec.task.name} run, {workdirs[0]} a "
                f"{first.spec.task.name} run; an ensemble averages runs of one task"
            )
    if ranks:
        return
    fingerprint = tokenizer_fingerprint(load_tokenizer(first.tokenizer_dir, first.spec.pad_id))
    for model, wd in zip(models[1:], workdirs[1:], strict=True):
        if (
            tokenizer_fingerprint(load_tokenizer(model.tokenizer_dir, model.spec.pad_id))
            != fingerprint
        ):
            raise UserError(
                f"--workdir {wd} has another tokenizer than {workdirs[0]}; an ensemble averages "
                "runs of one model family and tokenizer"
            )
        mine, theirs = model.spec.text_format, first.spec.text_format
        if mine != theirs:
            raise UserError(
                f"--workdir {wd} reads each row as {mine.describe()}, {workdirs[0]} as "
                f"{theirs.describe()}; an ensemble scores one text per row"
            )


def load_multilabel(workdirs: Sequence[str]) -> list[Any]:
    """The runs, each a multi-label one (six probabilities to weigh)."""

    models = [load_trained(w) for w in workdirs]
    check_ensemble(models, list(workdirs))
    task = models[0].spec.task
    if task.label_columns != LABELS:
        raise UserError(
            f"--label-weights weighs the six labels of a multilabel run; {workdirs[0]} is a "
            f"{task.name} run ({', '.join(task.label_columns)})"
        )
    return models


def pair_probabilities(
    models: list[Any], path: str, devices: list[Any], batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The (ensemble-mean) six label probabilities of each pair's less and more toxic comment
    of pairs file `path`: (P, 6) each; every distinct comment is scored once."""

    pairs = BY_NAME["pairs"]
    if kind_of(readers.columns(path)) is not pairs:
        raise DataError(f"--input {path}: expected {pairs.what}")
    pairs = readers.read_pairs(path)
    texts = sorted(set(pairs.less) | set(pairs.more))
    where = {t: i for i, t in enumerate(texts)}
    probs = np.mean(
        [
            metrics.probability(s.task.main(s.scores(texts)))
            for s in (Scorer(m, devices, batch_size) for m in models)
        ],
        0,
    )
    less = probs[[where[t] for t in pairs.less]]
    more = probs[[where[t] for t in pairs.more]]
    return less, more
