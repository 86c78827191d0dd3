"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Acknowledgement latency buckets, in seconds: a group commit is a few milliseconds on a local disk.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNKNOWN_STREAM = "_unknown"
"""The ``stream`` label of requests for a stream the server does not serve (names stay bounded)."""


class HttpMetrics:
    """Requests, events and bytes accepted and refused by reason, acknowledgement latency, and
    each stream's pending landing bytes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "lakehouse_http_requests",
            "Requests answered, by stream, status code and reason (accepted, replayed or a refusal's reason)",
            ["stream", "code", "reason"],
            registry=self.registry,
        )
        self.events = Counter("lakehouse_http_events_accepted", "Events landed", ["stream"], registry=self.registry)
        self.bytes = Counter(
            "lakehouse_http_body_bytes",
            "Request body bytes as sent, by stream and result (accepted or the refusal's reason)",
            ["stream", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "lakehouse_http_ack_latency_seconds",
            "From the request's arrival to its acknowledgement, for landed requests",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pending = Gauge(
            "lakehouse_http_pending_landing_bytes",
            "Landed bytes of the stream not committed yet (what backpressure compares to max_pending_bytes)",
            ["stream"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
