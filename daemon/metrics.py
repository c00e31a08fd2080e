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
        reloads = Counter(
            "recoveryd_rules_reloads",
            "Loads of the rules file (at start and on reload), by result.",
            ["result"],
            registry=registry,
        )
        self.rules_reloads = {result: reloads.labels(result) for result in ("success", "failure")}
        self.rules_last_reload_successful = Gauge(
            "recoveryd_rules_last_reload_successful",
            "1 when the last load of the rules file succeeded; 0 when it was refused.",
            registry=registry,
        )
        self.rules_last_reload_success = Gauge(
            "recoveryd_rules_last_reload_success_timestamp_seconds",
            "When the rules in force were loaded (Unix time).",
            registry=registry,
        )
        self.rules_info = Gauge(
            "recoveryd_rules_info",
            "The rules in force: the sha256 of the file's bytes, and how many rules it has.",
            ["sha256", "rules"],
            registry=registry,
        )
        self.decisions = Counter(
            "recoveryd_decisions",
            'Rules matched by DLQ messages, by rule and action (rule "" when none matched).',
            ["rule", "action"],
            registry=registry,
        )
