"""The Prometheus metrics of one `jaxtpu serve` application, in a registry of its own (names
by Prometheus' conventions: `_total` counters, units in the names)."""

from __future__ import annotations

from typing import Any


class Metrics:
    """Prometheus metrics of one server, in a registry of its own."""

    def __init__(self, server: Any) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "jaxtpu_requests",
            "Requests answered, by route and status code.",
            ["route", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "jaxtpu_analyze_seconds",
            "Latency of comments:analyze, reading to answer.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.by_key = Counter(
            "jaxtpu_key_requests",
            "Requests that named a valid key, by the key's name and status code.",
            ["key", "code"],
            registry=self.registry,
        )
        self.feedback = Counter(
            "jaxtpu_feedback_stored",
            "Suggestions (comments:suggestscore) kept in the feedback store.",
            registry=self.registry,
        )
        waiting = Gauge(
            "jaxtpu_queue_requests", "Requests waiting to be scored.", registry=self.registry
        )
        waiting.set_function(lambda: sum(b.waiting for b in server.batchers.values()))
        peak = Gauge(
            "jaxtpu_queue_peak_requests",
            "The most requests that have waited at once (at most --max-queue).",
            registry=self.registry,
        )
        peak.set_function(lambda: max(b.stats.peak_waiting for b in server.batchers.values()))
        ready = Gauge("jaxtpu_ready", "1 once the programs are compiled.", registry=self.registry)
        ready.set_function(lambda: float(server.ready))
        self.registry.register(_BatcherCounters(server))

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _BatcherCounters:
    """The batchers' own counts, as counters read when scraped: model calls made, texts
    scored, calls that failed and requests refused for a full queue."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        shadow = self.server.shadow_stats
        if shadow is not None:
            compared = sum(a["compared"] for a in shadow.report()["attributes"].values())
            for name, text, value in (
                ("jaxtpu_shadow_compared_scores", "Scores the shadow model compared.", compared),
                ("jaxtpu_shadow_dropped_requests", "Requests the shadow skipped: behind.",
                 shadow.dropped),
                ("jaxtpu_shadow_failed_requests", "Requests the shadow failed to score.",
                 shadow.failed),
            ):  # fmt: skip
                yield CounterMetricFamily(name, text, value=value)
        stats = [b.stats for b in self.server.batchers.values()]
        for name, text, value in (
            ("jaxtpu_model_calls", "Model calls made (each a batch of texts).", "batches"),
            ("jaxtpu_scored_texts", "Texts scored (comments and sentences).", "items"),
            ("jaxtpu_failed_model_calls", "Model calls that failed.", "failed_batches"),
            ("jaxtpu_queue_refused_requests", "Requests refused: the queue was full.", "refused"),
        ):
            yield CounterMetricFamily(name, text, value=sum(getattr(s, value) for s in stats))
