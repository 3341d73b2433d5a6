"""Prometheus metrics of one server (its own registry, so several apps in one process never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from selfrag.inference.answer import Answer
from selfrag.inference.trace import Retrieve

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)


class ServerMetrics:
    """Requests, latencies, the queue, batches, and what the runtime decided (retrieve, abstain, flag)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("selfrag_requests", "HTTP requests by route and status code", ["route", "status"],
                                registry=r)
        self.latency = Histogram("selfrag_request_seconds", "time from request to the last byte sent",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("selfrag_queue_wait_seconds",
                                    "time a request waited in the queue until the engine took it",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("selfrag_queue_depth", "requests waiting for the engine", registry=r)
        self.in_flight = Gauge("selfrag_in_flight", "requests in the engine, over every batch in flight",
                               registry=r)
        self.batch_size = Histogram("selfrag_batch_size", "requests per engine call",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.engine_seconds = Histogram("selfrag_engine_call_seconds", "time of one batch, all its phases",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.rejected = Counter("selfrag_rejected", "requests not answered, by reason (queue_full, timeout, "
                                "disconnected, shutdown)", ["reason"], registry=r)
        self.answers = Counter("selfrag_answers", "answers produced", registry=r)
        self.retrievals = Counter("selfrag_retrievals", "answers that retrieved passages", registry=r)
        self.re_retrievals = Counter("selfrag_re_retrievals", "retrieval rounds after the first one", registry=r)
        self.abstained = Counter("selfrag_abstained", "answers where the runtime abstained", registry=r)
        self.low_confidence = Counter("selfrag_low_confidence", "answers flagged low_confidence", registry=r)
        self.generated_tokens = Counter("selfrag_generated_tokens", "tokens decoded for answers", registry=r)

    def observe_answer(self, answer: Answer) -> None:
        self.answers.inc()
        rounds = sum(isinstance(entry, Retrieve) for entry in answer.trace)
        if answer.retrieved or rounds:
            self.retrievals.inc()
        if rounds > 1:
            self.re_retrievals.inc(rounds - 1)
        if answer.abstained:
            self.abstained.inc()
        if answer.low_confidence:
            self.low_confidence.inc()
        self.generated_tokens.inc(answer.generated_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
