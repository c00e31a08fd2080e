"""What the store keeps about each dlqId on its way through the pipeline, and its batches.

A dlqId moves through these states; each move is committed before the side effect that
follows it, so a crash at any point leaves a state the next start can act on:

    received -> decided -> batched -> done          (resume / restart)
             -> gone | skipped | dry-run | failed   (final)
    batched  -> decided (sent again, once its absence from the DLQ was ruled out) | failed
    done     -> failed  (notify: the notification its rule queued was given up)

`received` with a lease is being fetched; its lease expiring gives it to another worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from daemon.store.removals import EndpointFailure

State = Literal["received", "decided", "batched", "done", "gone", "skipped", "failed", "dry-run"]
STATES: tuple[State, ...] = (
    "received", "decided", "batched", "done", "gone", "skipped", "failed", "dry-run"
)  # fmt: skip
FINAL: frozenset[State] = frozenset({"done", "gone", "skipped", "failed", "dry-run"})
# Counted against a rule's budget: recoveries decided, under way or made.
RECOVERING: tuple[State, ...] = ("decided", "batched", "done")
# How the reason of a dlqId `skipped` because its rule's budget was spent begins, so that
# a reader (the demo's summary) tells these from the ones a rule said to ignore.
OVER_BUDGET = "budget: "


@dataclass(frozen=True)
class Claimed:
    """A received dlqId leased to one fetch worker."""

    dlq_id: str
    tries: int  # fetch attempts, this one included


@dataclass(frozen=True)
class Budget:
    """At most `max_recoveries` of one workflow run decided since `since` (Unix time)."""

    max_recoveries: int
    since: float


@dataclass(frozen=True)
class Outcome:
    """What became of one claimed dlqId: a new state, or `received` to be tried again at
    `retry_at`. `calls` are the service calls made for it, as `CallRecord.to_json`."""

    dlq_id: str
    state: State
    reason: str | None = None
    rule: str | None = None
    action: str | None = None
    matched: tuple[str, ...] = ()
    overrides: str | None = None  # canonical JSON of the rule's overrides
    workflow_run_id: str | None = None
    fingerprint: str | None = None  # the message's url and body, hashed: see sqlite_lineage
    budget: Budget | None = None
    retry_at: float | None = None
    would: dict[str, Any] | None = None  # the call a dry run did not make
    calls: tuple[dict[str, Any], ...] = field(default=())
    # Queued in the same commit as the outcome (an outbox): the notify rules it matched.
    notifications: tuple[Notice, ...] = ()
    # remove-endpoint: the failure the store counts as it settles the outcome, and whose
    # count makes its state and reason (sqlite_endpoints.count_failure).
    endpoint_failure: EndpointFailure | None = None


@dataclass(frozen=True)
class Settled:
    """What settling a chunk of outcomes did: the dlqIds now `decided`, for the batcher,
    and the recoveries a rule's budget stopped (`skipped`), by rule."""

    decided: list[Pending]
    over_budget: list[tuple[str, str]]  # (dlqId, rule)


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
