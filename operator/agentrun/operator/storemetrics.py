"""The state store's Prometheus metrics: requests, latency and bytes by operation and outcome.

agentrun.statestore reports each request as a StoreRequest to an observer; `StoreMetrics.observe` is the
operator's observer. Both labels come from closed sets (statestore.observe), so none grows with Runs.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram

from agentrun.statestore.observe import OPERATIONS, OUTCOMES, StoreRequest

# A blob round trip on a nearby store: milliseconds; a large blob or a slow store: seconds.
STORE_LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
LABELS: Final = ("operation", "outcome")


class StoreMetrics:
    """Registered in `registry` (None: not registered, e.g. in tests that read the objects directly)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.requests = Counter(
            "agentrun_state_store_requests",
            "State store requests, by operation (put, get, verify) and outcome",
            LABELS,
            registry=registry,
        )
        self.latency = Histogram(
            "agentrun_state_store_request_duration_seconds",
            "State store request latency, by operation and outcome",
            LABELS,
            buckets=STORE_LATENCY_BUCKETS,
            registry=registry,
        )
        self.bytes = Counter(
            "agentrun_state_store_bytes",
            "Bytes moved by state store requests (sent by puts that created, received by reads)",
            LABELS,
            registry=registry,
        )
        # Every series exists from the start at 0, so a rate() sees the first request.
        for operation in OPERATIONS:
            for outcome in OUTCOMES:
                self.requests.labels(operation, outcome)
                self.bytes.labels(operation, outcome)

    def observe(self, request: StoreRequest) -> None:
        labels = (request.operation, request.outcome)
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(request.seconds)
        self.bytes.labels(*labels).inc(request.size)
