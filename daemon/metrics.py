"""Every Prometheus metric recoveryd exports, created against an injected registry."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from itertools import product
from typing import Literal, NamedTuple, TypeVar, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.metrics import MetricWrapperBase

from daemon.http.listener import Refusal
from daemon.store.records import NotificationResult, RateSource, RotationResult
from daemon.store.removals import RemovalResult
from daemon.store.sweep_records import SweepResult
from daemon.upstream import OPERATIONS
from daemon.upstream.models import BulkAction

# Every counter and histogram would also export a `_created` timestamp series: twice the
# series for nothing a dashboard reads (the process start time says the same).
disable_created_metrics()  # type: ignore[no-untyped-call]

CallbackResult = Literal[
    "accepted",
    "duplicate",
    "invalid",
    "unauthorized",
    "too_large",
    "unsupported_media_type",
    "unavailable",
    "error",
]

# Why a dlqId ended `failed`, one value per path that ends it so (a fixed set: the
# reason's text, with the service's answer, is in the dlqId's record).
FailedReason = Literal[
    "fetch_refused",  # the DLQ message's reads got final answers (4xx) max-tries times
    "call_rejected",  # its bulk resume/restart call was rejected (a final 4xx)
    "check_refused",  # the call's outcome was unknown, and the reads to check it refused
    "notify_failed",  # its notify rule's webhook could not be delivered
]

# Which failures each action's dlqIds can end with; and a read refused before any rule
# decided, counted with rule "".
FAILED_BY_ACTION: Mapping[str, tuple[FailedReason, ...]] = {
    "resume": ("call_rejected", "check_refused"),
    "restart": ("call_rejected", "check_refused"),
    "notify": ("notify_failed",),
}
FAILED_UNDECIDED: tuple[str, FailedReason] = ("", "fetch_refused")

# What a dlqId was decided from: the signed callback (RECOVERYD_FETCH=needed) or the
# message read from the DLQ.
DecisionSource = Literal["callback", "message"]
# How an attempt at a notification ended, as recoveryd_notifications_total{result} says it.
NOTIFIED: Mapping[NotificationResult, str] = {
    "sent": "sent",
    "retry": "retried",
    "failed": "failed",
}
RestoreResult = Literal["restored", "failed"]
Listener = Literal["public", "admin"]


class RuleLabels(NamedTuple):
    """What the series a rule brings depend on."""

    name: str
    action: str
    budget: bool  # it has a budget, which can stop a recovery


# Ingest answers in well under a millisecond unless the disk is slow; the upper buckets
# show a store that is struggling.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_BULK_BUCKETS = (1, 2, 5, 10, 20, 30, 40, 50)
# A call to the service takes milliseconds when it is well; seconds mean retries or trouble.
_UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


LimitUnit = Literal["count", "bytes", "seconds"]

# The account record's limits (spec section 8) as we export them: wire field -> (our label
# value, the gauge family of its unit, what to divide the wire value by to get that
# unit). The wire names stay the service's own (misspelt `_milis` included) in the record
# and the credentials file; on a dashboard they would leak its spelling and mix units in
# one family. A field not listed here is not exported.
ACCOUNT_LIMITS: dict[str, tuple[str, LimitUnit, int]] = {
    "max_requests_per_second": ("requests_per_second", "count", 1),
    "max_requests_per_day": ("requests_per_day", "count", 1),
    "max_requests_per_day_hard": ("requests_per_day_hard", "count", 1),
    "max_endpoints_per_topic": ("endpoints_per_url_group", "count", 1),
    "max_dlq_size": ("dlq_messages", "count", 1),
    "max_retries": ("retries", "count", 1),
    "max_topics": ("url_groups", "count", 1),
    "max_schedules": ("schedules", "count", 1),
    "max_events_size": ("events_size", "count", 1),  # a count, says the spec
    "max_parallelism": ("parallelism", "count", 1),
    "max_global_parallelism": ("global_parallelism", "count", 1),
    "max_queues": ("queues", "count", 1),
    "max_message_size": ("message_size", "bytes", 1),
    "max_dlq_retention_time_milis": ("dlq_retention", "seconds", 1000),  # ms
    "max_delay": ("delay", "seconds", 1),
    "timeout": ("request_timeout", "seconds", 1),
}


C = TypeVar("C", bound=MetricWrapperBase)
V = TypeVar("V", bound=str)


def _each(family: C, values: Iterable[V]) -> dict[V, C]:
    """`family`'s child for each value of its one label, created now: exported at 0."""
    return {value: family.labels(value) for value in values}


class _GaugeOnceKnown:
    """An unlabelled gauge that is absent from the registry until its first `set`: a
    default 0 would read as a value (a last success in 1970), not as "not known yet"."""

    def __init__(self, registry: CollectorRegistry, name: str, documentation: str) -> None:
        self._registry: CollectorRegistry | None = registry
        self._gauge = Gauge(name, documentation, registry=None)

    def set(self, value: float) -> None:
        self._gauge.set(value)
        if self._registry is not None:
            self._registry.register(self._gauge)
            self._registry = None


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
        self.callbacks: dict[CallbackResult, Counter] = _each(callbacks, get_args(CallbackResult))
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
        self.rules_reloads: dict[Literal["success", "failure"], Counter] = _each(
            reloads, ("success", "failure")
        )
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
        self.shadow_rules_loaded = Gauge(
            "recoveryd_shadow_rules_loaded",
            "1 when the shadow rules (RECOVERYD_SHADOW_RULES) are loaded and deciding, 0 "
            "when none are set or the file failed to load.",
            registry=registry,
        )
        self.shadow_disagreements = Counter(
            "recoveryd_shadow_disagreements",
            "dlqIds the shadow rules decided otherwise than the live rules (rule, action or "
            'overrides), by both deciding rules ("" when none matched).',
            ["live_rule", "shadow_rule"],
            registry=registry,
        )
        self.decisions = Counter(
            "recoveryd_decisions",
            'Rules matched by DLQ messages, by rule and action (rule "" when none matched).',
            ["rule", "action"],
            registry=registry,
        )
        decided_from = Counter(
            "recoveryd_decided_from",
            "DLQ messages decided, by what the decision was made from: the signed callback "
            "(RECOVERYD_FETCH=needed, no GET) or the message read from the DLQ.",
            ["source"],
            registry=registry,
        )
        self.decided_from: dict[DecisionSource, Counter] = _each(
            decided_from, get_args(DecisionSource)
        )
        self.batch_size = Histogram(
            "recoveryd_batch_dlq_ids",
            "dlqIds in one bulk resume or restart batch.",
            buckets=_BULK_BUCKETS,
            registry=registry,
        )
        self.upstream_calls = Counter(
            "recoveryd_upstream_calls",
            "Calls to the service (each attempt), by operation and status code "
            "(or the error's reason when no answer came).",
            ["operation", "status"],
            registry=registry,
        )
        self.upstream_seconds = Histogram(
            "recoveryd_upstream_call_duration_seconds",
            "Time one call to the service took, by operation.",
            ["operation"],
            buckets=_UPSTREAM_BUCKETS,
            registry=registry,
        )
        self.dlq_ids = Gauge(
            "recoveryd_dlq_ids",
            "dlqIds in the store by pipeline state (read at scrape time).",
            ["state"],
            registry=registry,
        )
        self.dlq_ids_failed = Counter(
            "recoveryd_dlq_ids_failed",
            'dlqIds that ended failed, by the rule that decided them ("" for a read '
            "refused before any rule did) and why: fetch_refused, call_rejected, "
            "check_refused, notify_failed. A redrive or pruning never lowers it.",
            ["rule", "reason"],
            registry=registry,
        )
        self.oldest_pending = Gauge(
            "recoveryd_oldest_pending_age_seconds",
            "Age of the oldest dlqId not yet in a final state (read at scrape time).",
            registry=registry,
        )
        self.pending_batches = Gauge(
            "recoveryd_pending_batches",
            "Batches persisted whose call has not been settled (read at scrape time).",
            registry=registry,
        )
        self.budget_exhausted = Counter(
            "recoveryd_budget_exhausted",
            "Recoveries a rule's budget stopped: the workflow was recovered maxRecoveries "
            "times within the window already (the dlqId ends skipped).",
            ["rule"],
            registry=registry,
        )
        self.notifications = Counter(
            "recoveryd_notifications",
            "Attempts to post a notify rule's summary, by rule and result: sent (answered "
            "2xx), retried (to be made again), failed (given up).",
            ["rule", "result"],
            registry=registry,
        )
        self.notifications_pending = Gauge(
            "recoveryd_notifications_pending",
            "Notifications queued and not yet sent or given up (read at scrape time).",
            registry=registry,
        )
        recovered = Counter(
            "recoveryd_recovered",
            "dlqIds whose bulk resume or restart the service accepted, by action.",
            ["action"],
            registry=registry,
        )
        self.recovered: dict[BulkAction, Counter] = _each(recovered, get_args(BulkAction))
        rotations = Counter(
            "recoveryd_token_rotations",
            "Token rotations by result: success; failure (the old token still works); "
            "lockout (the old token is refused and the new one was never received).",
            ["result"],
            registry=registry,
        )
        self.rotations: dict[RotationResult, Counter] = _each(rotations, get_args(RotationResult))
        self.last_rotation_success = _GaugeOnceKnown(
            registry,
            "recoveryd_token_last_rotation_success_timestamp_seconds",
            "When the token was last rotated successfully (Unix time; absent before the first).",
        )
        self.last_rotation_failure = _GaugeOnceKnown(
            registry,
            "recoveryd_token_rotation_last_failure_timestamp_seconds",
            "When a token rotation last failed, the old token still working (Unix time; "
            "absent before the first failure).",
        )
        self.token_lockout = Gauge(
            "recoveryd_token_lockout",
            "1 while the service refuses the token in hand and no other is known: no calls "
            "are made until a token that works is given (`recoveryd set-token`).",
            registry=registry,
        )
        # One family a unit (see ACCOUNT_LIMITS), so a sum or a comparison never mixes them.
        self.account_limits = {
            unit: Gauge(
                "recoveryd_account_limit" + ("" if unit == "count" else f"_{unit}"),
                "The account's limits "
                + ("that are counts" if unit == "count" else f"in {unit}")
                + ", as the service last reported them, by name.",
                ["limit"],
                registry=registry,
            )
            for unit in get_args(LimitUnit)
        }
        self.task_crashes = Counter(
            "recoveryd_task_crashes",
            "Background tasks that ended with an exception and were restarted, by task.",
            ["task"],
            registry=registry,
        )
        self.circuit_open = Gauge(
            "recoveryd_upstream_circuit_open",
            "1 while calls of this operation are held back because the service keeps "
            "failing them (the circuit breaker is open or probing); 0 when closed.",
            ["operation"],
            registry=registry,
        )
        self.rate_limit = Gauge(
            "recoveryd_upstream_rate_limit_requests_per_second",
            "The pace calls to the service keep to now (read at scrape time): the "
            "account's limit once known, pinned or learned (calls keep about 5% under "
            "it); the slow start's pace while it is being found; 0 when not paced.",
            registry=registry,
        )
        self.rate_limit_source = Gauge(
            "recoveryd_upstream_rate_limit_source",
            "1 for how the rate limit in force was learned (read at scrape time): "
            "announced (on answers), account (the account record), discovered (on a "
            "429), pinned (RECOVERYD_MAX_RPS); every source 0 while none is known.",
            ["source"],
            registry=registry,
        )
        self.ready = Gauge(
            "recoveryd_ready",
            "1 when /readyz answers 200, 0 when it does not (read at scrape time; the "
            "reasons are in /readyz's answer).",
            registry=registry,
        )
        self.replicas = Gauge(
            "recoveryd_replicas",
            "Replicas sharing the store, this one included, as of its last heartbeat "
            "(always 1 with SQLite).",
            registry=registry,
        )
        self.singleton_holder = Gauge(
            "recoveryd_singleton_jobs_running",
            "1 on the one replica that runs the singleton jobs (token rotation, sweeps, "
            "pruning, endpoint removals, notifications), 0 on the others.",
            registry=registry,
        )
        self.store_size = Gauge(
            "recoveryd_store_size_bytes",
            "Size of the store on disk (read at scrape time).",
            registry=registry,
        )
        self.pruned = Counter(
            "recoveryd_pruned_records",
            "Final dlqId records deleted by retention (RECOVERYD_RETENTION).",
            registry=registry,
        )
        self.redriven = Counter(
            "recoveryd_redriven",
            "Final dlqIds put back into the pipeline by a redrive.",
            registry=registry,
        )
        # By URL Group, never by endpoint: a group has few, an account may have thousands.
        self.endpoint_failures = Counter(
            "recoveryd_endpoint_failures",
            "Failures of URL Group endpoints counted by remove-endpoint rules, by URL Group.",
            ["url_group"],
            registry=registry,
        )
        removals = Counter(
            "recoveryd_endpoint_removals",
            "Thresholds of remove-endpoint rules reached, by what came of them: removed, "
            "gone (not in the group any more), kept_last (keepLastEndpoint), capped "
            "(RECOVERYD_MAX_REMOVALS_PER_HOUR), read_failed (the group could not be read), "
            "failed (the service refused the removal).",
            ["result"],
            registry=registry,
        )
        self.endpoint_removals: dict[RemovalResult, Counter] = _each(
            removals, get_args(RemovalResult)
        )
        restores = Counter(
            "recoveryd_endpoint_restores",
            "Removed endpoints put back into their URL Group, by result: restored, failed.",
            ["result"],
            registry=registry,
        )
        self.endpoint_restores: dict[RestoreResult, Counter] = _each(
            restores, get_args(RestoreResult)
        )
        self.sweep_runs = Counter(
            "recoveryd_sweep_runs",
            "Runs of a sweep by result: success, failure (the service refused a call), "
            "unknown (a page's answer was lost), interrupted (recoveryd stopped mid-run), "
            "dry-run.",
            ["sweep", "result"],
            registry=registry,
        )
        self.sweep_recovered = Counter(
            "recoveryd_sweep_recovered",
            "Workflow runs a sweep resumed or restarted, as the service reported them.",
            ["sweep", "action"],
            registry=registry,
        )
        self.sweep_last_success = Gauge(
            "recoveryd_sweep_last_success_timestamp_seconds",
            "When the sweep's last successful run finished (Unix time; absent before it).",
            ["sweep"],
            registry=registry,
        )
        self.listener_refusals = Counter(
            "recoveryd_listener_refusals",
            "Connections a listener refused or closed to stay within its limits, by reason: "
            "header_too_large (431), header_timeout and body_timeout (408), over_connections "
            "(503), evicted (closed to make room for a new one), idle_timeout (a new "
            "connection that sent no byte within the header deadline: closed without an answer).",
            ["listener", "reason"],
            registry=registry,
        )
        # process_open_fds against process_max_fds, resident memory, CPU: the standard
        # names, which dashboards and the alerts read.
        ProcessCollector(registry=registry)
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """The series whose label values the code fixes, exported at 0 from the start (the
        Prometheus instrumentation guide's "avoid missing metrics"): rate() and increase()
        then see the first event, and a dashboard shows 0, not "no data". The families of
        one label are bound once, in a dict by the Literal its callers count with. Not the
        call-time histogram: 15 series an operation for quantiles that are no more defined
        at 0 than absent."""
        for operation in OPERATIONS:
            self.circuit_open.labels(operation).set(0)
        for listener, reason in product(get_args(Listener), get_args(Refusal)):
            self.listener_refusals.labels(listener, reason)

    def follow_rules(self, rules: Sequence[RuleLabels], sweeps: Sequence[tuple[str, str]]) -> None:
        """Export at 0 each series the rules and sweeps (name, action) in force can count:
        only the combinations that can occur (a notify rule's results, a recovery rule's
        failures...), so a file of hundreds of rules costs a few series each. The series of
        rules and sweeps no longer in force are dropped if never counted, so renaming a rule
        now and then piles up nothing; a counted one stays until the restart, its count
        frozen (rate 0) and none of it lost."""
        self._keep(self.decisions, [("", "none"), *((rule.name, rule.action) for rule in rules)])
        self._keep(
            self.dlq_ids_failed,
            [FAILED_UNDECIDED]
            + [(rule.name, why) for rule in rules for why in FAILED_BY_ACTION.get(rule.action, ())],
        )
        self._keep(self.budget_exhausted, [(rule.name,) for rule in rules if rule.budget])
        self._keep(
            self.notifications,
            [(rule.name, result) for rule in rules if rule.action == "notify"
             for result in NOTIFIED.values()],
        )  # fmt: skip
        results = get_args(SweepResult)
        self._keep(self.sweep_runs, [(name, result) for name, _ in sweeps for result in results])
        self._keep(self.sweep_recovered, sweeps)

    def _keep(self, family: Counter, wanted: Iterable[tuple[str, ...]]) -> None:
        """`wanted` series of `family` exported (at 0 until counted); of the others, those
        still at 0 dropped and those counted kept, frozen: rate() reads 0 from them, and no
        increment since the last scrape is lost. What the family holds is read from its
        collect(), so a series a removed rule's work brought back after an earlier reload
        is seen too."""
        keep = dict.fromkeys(wanted)  # in the order given: the scrape shows them so
        for metric in family.collect():
            for sample in metric.samples:
                labels = tuple(sample.labels.values())
                if labels not in keep and sample.value == 0:
                    with contextlib.suppress(KeyError):
                        family.remove(*labels)
        for labels in keep:
            family.labels(*labels)

    def count_failed(self, reason: FailedReason, rules: Iterable[str]) -> None:
        """Count dlqIds that have just ended failed, one rule (or "") each."""
        for rule in rules:
            self.dlq_ids_failed.labels(rule, reason).inc()

    def set_rate_limit_source(self, source: RateSource | None) -> None:
        for each in get_args(RateSource):
            self.rate_limit_source.labels(each).set(1 if each == source else 0)

    def set_account_limits(self, limits: Mapping[str, float]) -> None:
        """Export the account record's limits (by wire name) that ACCOUNT_LIMITS knows."""
        for field, value in limits.items():
            if field in ACCOUNT_LIMITS:
                name, unit, divisor = ACCOUNT_LIMITS[field]
                self.account_limits[unit].labels(name).set(value / divisor)
