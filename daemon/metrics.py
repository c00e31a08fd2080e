"""Every Prometheus metric recoveryd exports, created against an injected registry."""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

CallbackResult = Literal[
    "accepted",
    "duplicate",
    "invalid",
    "unauthorized",
    "too_large",
    "unsupported_media_type",
    "unavailable",
]

# Ingest answers in well under a millisecond unless the disk is slow; the upper buckets
# show a store that is struggling.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The daemon's metrics. Tests give each daemon a fresh registry and read values back
    with `registry.get_sample_value`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        callbacks = Counter(
            "recoveryd_callbacks",
            "Failure callbacks received, by how they were answered.",
            ["result"],
            registry=registry,
        )
        # Children bound once: the hot path then skips the label lookup.
        self.callbacks = {result: callbacks.labels(result) for result in get_args(CallbackResult)}
        self.callback_seconds = Histogram(
            "recoveryd_callback_request_duration_seconds",
            "Time from a callback request's arrival to its answer.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.inbox_depth = Gauge(
            "recoveryd_inbox_depth",
            "Callbacks in the store's inbox (read at scrape time).",
            registry=registry,
        )
        self.commit_size = Histogram(
            "recoveryd_store_commit_callbacks",
            "Callbacks written by one store commit (group commit shares a disk flush).",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
