"""A set of models a server answers with, together (`ModelSet`): their attributes, their
batchers, their version and card, and the scores of a request's texts. A server has one for
every request (the base; with `--communities DIR`, a community's head answers its attribute
from the base's own pass), one per community (`--community ID=RUN`: the requests naming that
communityId) and one in shadow (`--shadow RUN`: scored after the answer, compared, never
answering)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from jaxtpu.core.serving.attributes import Attribute, merge
from jaxtpu.core.serving.card import model_version
from jaxtpu.core.serving.heads import Head
from jaxtpu.serve.backends import Served
from jaxtpu.serve.batcher import Batcher

log = logging.getLogger("jaxtpu.serve")


class ModelSet:
    """Models answering side by side, each its own attributes (an attribute two answer is
    refused), each with a batcher of its own."""

    def __init__(
        self, models: Sequence[Served], max_items: int, max_wait_ms: float, max_queue: int
    ) -> None:
        self.models = list(models)
        owner = merge([m.attributes for m in models], [m.source for m in models])
        self.owner = {name: self.models[i] for name, i in owner.items()}
        self.attribute = {a.name: a for m in models for a in m.attributes}
        self.available = list(owner)
        self.languages = sorted({x for m in models for x in m.languages})
        self.version = (
            models[0].version
            if len(models) == 1
            else model_version({f"model{i}": m.version for i, m in enumerate(models)})
        )
        self.batchers = {
            id(m): Batcher(
                m.probabilities,
                max_items,
                max_wait_ms,
                max_queue,
                bucket_of=m.buckets,  # used only where calls have fixed rows
                rows=m.call_rows,
            )
            for m in models
        }

    async def start(self) -> None:
        for b in self.batchers.values():
            await b.start()

    async def stop(self) -> None:
        for b in self.batchers.values():
            await b.stop()

    async def warm_up(self) -> None:
        """Compiles every model's programs (in its scoring thread)."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        for m in self.models:
            n = await loop.run_in_executor(self.batchers[id(m)].pool, m.warm_up)
            log.info("%s: %d program(s) compiled", m.source, n)
        log.info("%s ready in %.1f s", self.version, time.perf_counter() - t0)

    @property
    def waiting(self) -> int:
        return sum(b.waiting for b in self.batchers.values())

    def card(self) -> dict[str, Any]:
        if len(self.models) == 1:
            return self.models[0].card
        return {"version": self.version, "models": [m.card for m in self.models]}

    async def scores(
        self,
        texts: list[str],
        names: Sequence[str],
        head: Head | None = None,
        candidate: Head | None = None,
        compared: dict[str, float] | None = None,
    ) -> list[dict[str, float]]:
        """Each text's score of each attribute of `names`, through the model owning it (the
        texts of a request go to each such model's batcher as one job); `head`: a community's
        head answers its attribute, from the owning model's probabilities and vector of each
        text (that model scores with `pooled`), every other attribute as without it.
        `candidate`: a head in shadow, whose score of the comment (the first text) is put in
        `compared`, from the same call."""
        wanted: dict[int, list[Attribute]] = {}
        for name in names:
            wanted.setdefault(id(self.owner[name]), []).append(self.attribute[name])
        by_model = {id(m): m for m in self.models}
        jobs = []
        for key, attrs in wanted.items():
            model = by_model[key]
            jobs.append((model, attrs, self.batchers[key].submit(model.inputs(texts, attrs))))
        results = await asyncio.gather(*(j[2] for j in jobs))
        per_text: list[dict[str, float]] = [{} for _ in texts]
        for (model, attrs, _), out in zip(jobs, results, strict=True):
            for i, scores in enumerate(model.scores(texts, attrs, out)):
                per_text[i].update(scores)
            k = len(model.columns)
            if head is not None and any(a.name == head.record.attribute for a in attrs):
                removal = head.probability(out[:, k:], out[:, :k])
                for i, p in enumerate(removal):
                    per_text[i][head.record.attribute] = float(p)
            if candidate is not None and compared is not None:
                if any(a.name == candidate.record.attribute for a in attrs):
                    p = candidate.probability(out[:1, k:], out[:1, :k])
                    compared[candidate.record.attribute] = float(p[0])
        return per_text
