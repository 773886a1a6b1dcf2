"""What a run will do, decided before it starts (framework-free): the `Job` (config, data, run
directory), its `Plan` (steps, global batch, batcher) and the pure `schedule` of device calls,
with one input of each program the schedule uses (`program_inputs`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxtpu.core.data import taskdata, tokenized
from jaxtpu.core.data.buckets import Batcher, Rows
from jaxtpu.core.data.tokens import load_tokenizer, save_tokenizer
from jaxtpu.core.errors import ConfigError, DataError, UserError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config, checkpoint_interval
from jaxtpu.core.run.store import RunStore
from jaxtpu.core.schedules import Horizon

log = logging.getLogger("jaxtpu")


@dataclass
class Plan:
    """How many steps a run takes, derived once from the config and the data size."""

    n_train: int
    global_batch: int
    steps_per_epoch: int
    total: int
    total_updates: int
    batcher: Batcher  # every train and eval batch (padded, or in length buckets)
    accumulate: int = 1

    @property
    def horizon(self) -> Horizon:
        """The schedule's length: the run's optimizer updates, and per epoch."""
        return Horizon(self.total_updates, self.steps_per_epoch / self.accumulate)

    @classmethod
    def make(cls, cfg: Config, train: tokenized.Examples, num_devices: int) -> Plan:
        n_train = len(train)
        global_batch = cfg.train.batch_size * num_devices
        if n_train < global_batch:
            raise UserError(
                f"--batch-size {cfg.train.batch_size} x {num_devices} devices = global batch "
                f"{global_batch} is larger than the {n_train} training {cfg.task.unit}; use a "
                "smaller --batch-size or --num-devices"
            )
        batcher = Batcher.for_data(
            cfg.data.buckets,
            train.real_lengths(),
            global_batch,
            cfg.data.max_len,
            cfg.placement.steps_per_call,
            (cfg.train.valid_batch_size or cfg.train.batch_size) * num_devices,
        )
        spe = batcher.steps_per_epoch()
        total = (
            spe * cfg.train.epochs
            if not cfg.train.max_steps
            else min(spe * cfg.train.epochs, cfg.train.max_steps)
        )
        updates = max(total // cfg.optim.accumulate, 1)
        return cls(n_train, global_batch, spe, total, updates, batcher, cfg.optim.accumulate)

    def describe(self, cfg: Config, num_devices: int) -> str:
        cap = f", capped by --max-steps {cfg.train.max_steps}" if cfg.train.max_steps else ""
        return (
            f"steps: {self.total} ({self.steps_per_epoch} per epoch x {cfg.train.epochs} epochs"
            f"{cap}), global batch {self.global_batch} = {cfg.train.batch_size} per device x "
            f"{num_devices}"
        )


@dataclass
class Job:
    """Everything a run needs besides the framework: config and its resolved spec, data, plan
    and run directory."""

    cfg: Config
    spec: RunSpec
    data: taskdata.TaskData
    plan: Plan
    workdir: Path  # what the run writes (a bucket run's working copy)
    started: float
    monitor: str = ""  # the metric that picks the best checkpoint (`Task.choose_monitor`)
    store: RunStore | None = None  # where the run directory lives (None: `workdir`, here)

    def __post_init__(self) -> None:
        if not self.monitor:
            valid = self.data.valid
            task = self.cfg.task
            self.monitor = task.choose_monitor(self.cfg.train.monitor, valid.groups)
            why = task.undefined_monitor(self.monitor, valid.label, valid.groups)
            if why:
                split = self.data.info.get("split", "validation")
                others = [m for m in (task.monitor, *task.others) if m != self.monitor]
                instead = f"pass --monitor {others[0]}, or " if others else ""
                raise DataError(
                    f"validation set ({split}): {why}, so {self.monitor} is "
                    f"undefined at every evaluation and no best model could be chosen; "
                    f"{instead}give a validation set where some subgroup holds both classes "
                    "(a larger --valid-fraction, --valid-csv"
                    + (", or --holdout-rules N" if task.text_pairs else "")
                    + ")"
                )

    @property
    def rundir(self) -> str:
        """The run directory as the user named it (a bucket run's URL: its checkpoints go
        there, not through the working copy `workdir`)."""
        return self.store.where if self.store else str(self.workdir)

    def publish(self) -> None:
        """Uploads what the run wrote since the last time (a bucket run; else nothing)."""
        if self.store is not None:
            self.store.publish()

    def check(self) -> None:
        """Raises when another run took the run directory over (a bucket run's lease)."""
        if self.store is not None:
            self.store.check()

    @classmethod
    def load(
        cls,
        cfg: Config,
        spec: RunSpec,
        workdir: Path,
        num_devices: int,
        primary: bool,
        started: float,
        store: RunStore | None = None,
    ) -> Job:
        """Loads the tokenizer (process 0 keeps a copy in the run directory for predict and
        export) and the data, and plans the steps. Every process of a multi-process run loads
        the same examples (deterministic) and feeds only its rows of each global batch."""
        tokenizer = load_tokenizer(spec.tokenizer_dir, spec.pad_id)
        rows = spec.encoder.vocab_size
        if len(tokenizer) > rows:
            raise ConfigError(
                f"tokenizer {spec.tokenizer_dir} has {len(tokenizer)} tokens but the encoder's "
                f"embedding table has {rows} rows: its ids would index past the table; give "
                "the tokenizer of this checkpoint (--tokenizer-dir) or a larger --vocab-size"
            )
        if primary:  # always this run's tokenizer: never one left by an earlier run
            save_tokenizer(tokenizer, workdir / "tokenizer")
        data = taskdata.load_task_data(cfg, tokenizer)
        info = data.info
        log.info(
            "data: %s%s | %d train %s, %d validation (%s)%s",
            info["source"],
            " [DEMO DATA]" if info["demo"] else "",
            info["train_examples"],
            info["unit"],
            info["valid_examples"],
            info["split"],
            " | tokens from cache" if info["token_cache_hit"] else "",
        )
        plan = Plan.make(cfg, data.train, num_devices)
        job = cls(cfg, spec, data, plan, workdir, started, store=store)
        if data.valid.groups:
            log.info("validation by %s; monitoring %s", data.valid.groups.describe(), job.monitor)
        log.info(job.plan.describe(cfg, num_devices))
        log.info(job.plan.batcher.describe())
        return job


@dataclass(frozen=True)
class Call:
    """One device call of a run: its training steps and what follows them."""

    epoch: int
    end: int  # steps done after this call
    batches: tuple[Rows, ...]  # one batch of the training examples per step
    log: bool  # fetch the losses, check them, write a metrics line
    evaluate: bool  # evaluate (and save best/latest): eval interval, epoch end, last step
    checkpoint: bool  # save the latest state (--checkpoint-every)


def schedule(plan: Plan, cfg: Config, start: int) -> Iterator[Call]:
    """The device calls from step `start` to `plan.total`: a pure function of the plan, the
    run settings and the start step.

    A call holds up to --steps-per-call K steps of one sequence length and ends early on a
    logging, evaluation, checkpoint or epoch boundary (the intervals are multiples of K, so
    only epoch ends, the last step and a change of bucket cut a call short). Every run
    evaluates at each epoch end and at its last step; a finished run that is resumed gets one
    call that only evaluates.
    """
    spe, total, batcher = plan.steps_per_epoch, plan.total, plan.batcher
    if start >= total:
        yield Call(max(total - 1, 0) // spe, start, (), log=False, evaluate=True, checkpoint=False)
        return
    step, every = start, checkpoint_interval(cfg.output.checkpoint_every)[0]
    for epoch in range(start // spe, cfg.train.epochs):
        chunk: list[Rows] = []
        for batch in batcher.epoch(epoch, cfg.train.seed, step % spe):
            if chunk and batch.length != chunk[-1].length:  # one shape per device call
                yield Call(epoch, step, tuple(chunk), False, False, False)
                chunk = []
            chunk.append(batch)
            step += 1
            checkpoint = bool(every and step % every == 0)
            evaluate = bool(cfg.output.eval_every and step % cfg.output.eval_every == 0)
            evaluate = evaluate or step % spe == 0 or step == total
            # a checkpoint step is also a logging step: its losses are checked before saving
            log_now = step % cfg.output.log_every == 0 or step == total or checkpoint
            if len(chunk) == cfg.placement.steps_per_call or log_now or evaluate:
                yield Call(
                    epoch, step, tuple(chunk), log_now, evaluate, checkpoint and step < total
                )
                chunk = []
            if step == total:
                return


def program_inputs(
    job: Job, local_rows: Callable[[int], slice], start: int = 0
) -> tuple[list[list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]:
    """One input of each program a run from step `start` uses: a train call (of one batch) of
    each sequence length the schedule uses (one program each, whatever the number of batches
    in a call), and an evaluation batch of each length of the validation set; this process's
    `local_rows` of each. What the train loop precompiles and `preflight --save-programs`
    saves."""
    gb = job.plan.global_batch
    rows = local_rows(gb)
    idx, weight = np.arange(gb)[rows] % len(job.data.train), np.ones(gb, np.float32)[rows]
    batcher, valid = job.plan.batcher, job.data.valid
    every, used = set(batcher.batch_lengths()), []
    for call in schedule(job.plan, job.cfg, start):
        if call.batches and call.batches[0].length not in used:
            used.append(call.batches[0].length)
            if len(used) == len(every):
                break
    calls = [[job.data.train.take(idx, weight, n)] for n in used]
    lengths = batcher.eval_batch_lengths(valid.real_lengths())
    egb = batcher.eval_global_batch
    rows = local_rows(egb)
    idx, weight = np.arange(egb)[rows] % len(valid), np.ones(egb, np.float32)[rows]
    return calls, [valid.take(idx, weight, n) for n in lengths]
