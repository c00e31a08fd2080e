"""What the store keeps about each dlqId on its way through the pipeline, and its batches.

A dlqId moves through these states; each move is committed before the side effect that
follows it, so a crash at any point leaves a state the next start can act on:

    received -> decided -> batched -> done          (resume / restart)
             -> gone | skipped | dry-run | failed   (final)
    batched  -> decided (sent again, once its absence from the DLQ was ruled out) | failed
    done     -> failed  (notify: the notification its rule queued was given up)

`received` with a lease is being fetched; its lease expiring gives it to another worker.

Both stores (sqlite/pipeline.py, postgres/pipeline.py) build the values they answer from
their rows with the functions at the end of this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from daemon.foundation.words import counted

State = Literal["received", "decided", "batched", "done", "gone", "skipped", "failed", "dry-run"]
STATES: tuple[State, ...] = (
    "received", "decided", "batched", "done", "gone", "skipped", "failed", "dry-run"
)  # fmt: skip
FINAL: frozenset[State] = frozenset({"done", "gone", "skipped", "failed", "dry-run"})
# Not final: what status() reports the oldest of.
UNFINISHED: tuple[State, ...] = ("received", "decided", "batched")
# Counted against a rule's budget: recoveries decided, under way or made.
RECOVERING: tuple[State, ...] = ("decided", "batched", "done")


def dedup_key(dlq_id: str) -> int:
    """A pruned dlqId's key, the same in both stores (sqlite/retention.py says why a key):
    sha256's first 8 bytes as a signed 64-bit integer."""
    return int.from_bytes(hashlib.sha256(dlq_id.encode()).digest()[:8], "big", signed=True)


# How the reason of a dlqId `skipped` because its rule's budget was spent begins, so that
# a reader (the demo's summary) tells these from the ones a rule said to ignore.
OVER_BUDGET = "budget: "


@dataclass(frozen=True)
class EndpointFailure:
    """One failed delivery to an endpoint of a URL Group, as its DLQ message tells it, and
    the rule that counts it. `endpoint` is how it is known: its name, else its url."""

    url_group: str
    endpoint: str
    name: str | None
    url: str | None
    response_status: int | None
    failures: int  # the rule's threshold
    within: float  # seconds
    keep_last: bool


@dataclass(frozen=True)
class Claimed:
    """A received dlqId leased to one fetch worker."""

    dlq_id: str
    tries: int  # fetch attempts, this one included
    # The callback's bytes when its signature verified: what a decision may be made from
    # without a GET (RECOVERYD_FETCH=needed). None for one taken unsigned.
    signed_callback: bytes | None = field(default=None, repr=False)
    # The final answers (a 400...) its reads got before this try; transient failures
    # (an outage) are tries but not refusals. `failed` at the fetch_tries'th.
    refusals: int = 0


@dataclass(frozen=True)
class Budget:
    """At most `max_recoveries` of one workflow run decided since `since` (Unix time)."""

    max_recoveries: int
    since: float


@dataclass(frozen=True)
class Outcome:
    """What became of one claimed dlqId: a new state, or `received` to be tried again at
    `retry_at`, sooner if `waits_for_service` and the service is back first (`retry_now`).
    `calls` are the service calls made for it, as `CallRecord.to_json`."""

    dlq_id: str
    state: State
    reason: str | None = None
    rule: str | None = None
    action: str | None = None
    matched: tuple[str, ...] = ()
    overrides: str | None = None  # canonical JSON of the rule's overrides
    workflow_run_id: str | None = None
    fingerprint: str | None = None  # the message's url and body, hashed: see sqlite/lineage.py
    budget: Budget | None = None
    retry_at: float | None = None
    refused: bool = False  # the read got a final answer: one more of the dlqId's refusals
    # The retry waits for the service (down, refusing, its circuit open), not for anything
    # about this dlqId: the service's return ends the wait (Store.retry_now).
    waits_for_service: bool = False
    would: dict[str, Any] | None = None  # the call a dry run did not make
    calls: tuple[dict[str, Any], ...] = field(default=())
    # Queued in the same commit as the outcome (an outbox): the notify rules it matched.
    notifications: tuple[Notice, ...] = ()
    # remove-endpoint: the failure the store counts as it settles the outcome, and whose
    # count makes its state and reason (sqlite/endpoints.py, count_failure).
    endpoint_failure: EndpointFailure | None = None
    # The facts the decision read, as fields.kept keeps them (replay decides from them),
    # and the shadow rules' decision as rules/shadow.py writes it (None: no shadow).
    facts: str | None = field(default=None, repr=False)
    shadow: str | None = None


class ReplayRow(NamedTuple):
    """A decided record as replay reads it (Store.replay_rows): its recorded (live)
    decision, what its budget counted it by, and the facts the decision was made from.
    A named tuple, not a frozen dataclass: replay makes a million of them, and a frozen
    dataclass takes eight times as long to make (bench/replay.py)."""

    dlq_id: str
    received_at: float
    state: str
    reason: str | None
    rule: str | None  # None: no rule matched
    action: str | None
    overrides: str | None  # canonical JSON as Rule.overrides_key; None when not a recovery
    workflow_key: str | None  # what budgets count by (store/sqlite/lineage.py)
    facts: str  # fields.kept's text


@dataclass(frozen=True)
class Settled:
    """What settling a chunk of outcomes (or a batch) did: the dlqIds now `decided`, for
    the batcher, the recoveries a rule's budget stopped (`skipped`), by rule, and the
    dlqIds this very commit made `failed`, by rule ("" when none had decided them), for
    recoveryd_dlq_ids_failed_total."""

    decided: list[Pending]
    over_budget: list[tuple[str, str]]  # (dlqId, rule)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (dlqId, rule or "")


@dataclass(frozen=True)
class BatchEnd:
    """What a batch's call came to, as `Store.settle_batch` takes it (see there)."""

    sent: bool
    now: float
    done: Sequence[str] = ()
    again: Sequence[str] = ()
    failed: Sequence[str] = ()
    gone: Sequence[str] = ()
    reason: str | None = None
    runs: Sequence[dict[str, Any]] = ()
    calls: Sequence[dict[str, Any]] = ()


@dataclass(frozen=True)
class Pending:
    """A decided dlqId waiting for its batch."""

    dlq_id: str
    action: str
    overrides: str
    rule: str
    decided_at: float


@dataclass(frozen=True)
class BatchRecord:
    """A persisted batch whose call has not been settled. `sent_at` is when its call was
    about to go out (`mark_sending`): None means the call surely never left."""

    id: int
    action: str
    overrides: str
    dlq_ids: tuple[str, ...]
    created_at: float
    sent_at: float | None = None


RotationResult = Literal["success", "failure", "lockout"]


@dataclass(frozen=True)
class Rotation:
    """One token rotation: under way while `result` is None. A lockout ends (`resolved_at`)
    when a token that works is in hand again. Never holds a credential."""

    id: int
    started_at: float
    finished_at: float | None
    result: RotationResult | None
    reason: str | None
    resolved_at: float | None

    @property
    def under_way(self) -> bool:
        return self.result is None

    @property
    def locked_out(self) -> bool:
        return self.result == "lockout" and self.resolved_at is None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "result": self.result,
            "reason": self.reason,
            "resolvedAt": self.resolved_at,
        }


NotificationState = Literal["pending", "sent", "failed"]
# What one attempt came to: delivered, to be made again, or given up.
NotificationResult = Literal["sent", "retry", "failed"]


@dataclass(frozen=True)
class AttemptEnd:
    """What a notification's attempt came to, as `Store.finish_notification_attempt`
    takes it: `result`, the receiver's `status` if it answered, and when to try again."""

    result: NotificationResult
    status: int | None
    reason: str
    next_at: float | None
    now: float


@dataclass(frozen=True)
class Notice:
    """A notification a notify rule asks for: `payload` (JSON text, built at decision
    time so that every attempt posts the same bytes) to `url`. `receiver` is the URL's
    origin, safe to show and to group by; `key` its Idempotency-Key."""

    rule: str
    url: str = field(repr=False)  # a webhook URL often holds its own secret
    receiver: str
    key: str
    payload: str


@dataclass(frozen=True)
class NotificationJob:
    """A pending notification that is due. `attempts` made so far (an attempt counts once
    it was about to go out, so a crash mid-send counts too); `queued_at` starts the time
    limit."""

    id: int
    dlq_id: str
    rule: str
    url: str = field(repr=False)
    receiver: str
    key: str
    payload: str
    attempts: int
    queued_at: float


def check_final(states: Sequence[str]) -> None:
    """ValueError unless `states` are final states (at least one)."""
    others = sorted(set(states) - FINAL)
    if others or not states:
        listed = ", ".join(others) or "none"
        raise ValueError(f"only final states ({', '.join(sorted(FINAL))}) can be redriven, "
                         f"not {listed}")  # fmt: skip


def event(state: str, at: float, **detail: Any) -> dict[str, Any]:
    """An entry of a record's history; empty details are left out."""
    return {"state": state, "at": at, **{k: v for k, v in detail.items() if v}}


def json_text(value: Any) -> str | None:
    """What a JSON text column (`matched`, `would`) holds: None for an empty value."""
    return json.dumps(value) if value else None


def over_budget_reason(key: str, run: str | None, made: int) -> str:
    """The reason of a recovery that its rule's budget stopped: the workflow `key` (of
    the run `run`) was recovered `made` times already."""
    return (
        f"{OVER_BUDGET}workflow {key} (this run: {run}) was "
        f"already recovered {counted(made, 'time')} in the rule's window, its maxRecoveries"
    )


def tally(settled: Settled, outcome: Outcome, state: State, stopped: bool, now: float) -> None:
    """Add to `settled` an outcome recorded (its lease still held) as `state` at `now`;
    `stopped` when its rule's budget made it `skipped`."""
    if stopped:
        assert outcome.rule is not None
        settled.over_budget.append((outcome.dlq_id, outcome.rule))
    if state == "failed":
        settled.failed.append((outcome.dlq_id, outcome.rule or ""))
    if state == "decided":
        assert outcome.action is not None
        assert outcome.overrides is not None
        assert outcome.rule is not None
        settled.decided.append(
            Pending(outcome.dlq_id, outcome.action, outcome.overrides, outcome.rule, now)
        )


# The values the stores answer, built from their rows (each function names the columns it
# takes, in order). `load` decodes a JSON column as the store's driver returns it: SQLite's
# are text (`json.loads`), PostgreSQL's jsonb come back decoded (`decoded`). `matched`,
# `would` and `overrides` are JSON text on both.
Load = Callable[[Any], Any]


def decoded(value: Any) -> Any:
    """The `load` of a JSON column that the driver has decoded already."""
    return value


def pending_from(row: Sequence[Any]) -> Pending:
    """A decided dlqId from `dlq_id, action, overrides, rule, decided_at`."""
    dlq_id, action, overrides, rule, decided_at = row
    return Pending(dlq_id, action, overrides, rule, decided_at)


def batch_from(row: Sequence[Any], load: Load) -> BatchRecord:
    """A batch from `id, action, overrides, dlq_ids, created_at, sent_at`."""
    batch_id, action, overrides, ids, created_at, sent_at = row
    return BatchRecord(batch_id, action, overrides, tuple(load(ids)), created_at, sent_at)


def batch_json(row: Sequence[Any], load: Load) -> dict[str, Any]:
    """One of the batches of a record, from `id, action, state, created_at, sent_at,
    settled_at, reason, runs, calls` and the number of its dlqIds."""
    number, kind, state, created, sent_at, settled, why, runs, calls, size = row
    return {
        "id": number,
        "action": kind,
        "state": state,
        "size": size,
        "createdAt": created,
        "sentAt": sent_at,
        "settledAt": settled,
        "reason": why,
        "workflowRuns": load(runs),
        "calls": load(calls),
    }


class RecordRow(NamedTuple):
    """The columns of a dlqId's row that its record shows, in the order selected."""

    dlq_id: str
    state: str
    reason: str | None
    rule: str | None
    action: str | None
    matched: str | None
    overrides: str | None
    workflow_run_id: str | None
    would: str | None
    tries: int
    refusals: int
    sends: int
    batch_ids: Any  # a JSON column, as are calls and history
    calls: Any
    history: Any
    received_at: float
    decided_at: float | None
    updated_at: float | None


def record_json(row: RecordRow, batches: list[dict[str, Any]], load: Load) -> dict[str, Any]:
    """Everything known about one dlqId, as `/api/v1/dlq/{dlqId}` answers it: its row, and
    the batches it was in (`batch_json`), in the order it was in them."""
    return {
        "dlqId": row.dlq_id,
        "state": row.state,
        "reason": row.reason,
        "rule": row.rule,
        "action": row.action,
        "matchedRules": json.loads(row.matched) if row.matched else [],
        "overrides": json.loads(row.overrides) if row.overrides else None,
        "workflowRunId": row.workflow_run_id,
        "wouldCall": json.loads(row.would) if row.would else None,
        "fetchAttempts": row.tries,
        "fetchRefusals": row.refusals,
        "sends": row.sends,
        "calls": load(row.calls),
        "batches": batches,
        "history": load(row.history),
        "receivedAt": row.received_at,
        "decidedAt": row.decided_at,
        "updatedAt": row.updated_at,
    }


def status_json(
    counts: dict[str, int], batches: int, oldest: float | None, now: float
) -> dict[str, Any]:
    """The pipeline's part of the status: `counts` by state, the `batches` not yet
    settled, and the age of the `oldest` dlqId not in a final state (its received_at)."""
    return {
        "states": counts,
        "pendingBatches": batches,
        "oldestPendingSeconds": max(0.0, now - oldest) if oldest is not None else 0.0,
    }


@dataclass(frozen=True, slots=True)
class Replica:
    """A replica alive in a shared store, as its last heartbeat left it."""

    id: str
    started_at: float
    seen_at: float


# How the account's rate limit was learned: the `Burst-RateLimit-Limit` of an answer let
# through, the account record (`max_requests_per_second`), that header on a 429 (the
# service told it only once it was exceeded), or the operator's RECOVERYD_MAX_RPS.
RateSource = Literal["announced", "account", "discovered", "pinned"]


@dataclass(frozen=True)
class LearnedRate:
    """The account's limit in calls a second as a replica learned it, kept in the store so
    that every replica, and the next start, uses it without learning it again."""

    rate: float
    source: RateSource
    learned_at: float  # Unix time
    replica: str | None = None  # who learned it
