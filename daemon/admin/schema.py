"""The admin listener's answers, as its OpenAPI document publishes them (docs/api.md).

Documentation only: the routes build their JSON themselves, and these models say what
that JSON holds. Deeply nested parts (a record's calls, batches and history) stay open
objects here; docs/api.md describes them field by field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import SkipJsonSchema

from daemon.http.errors import Error
from daemon.store.records import RotationResult, State


class DlqRecord(BaseModel):
    """`GET /api/v1/dlq/{dlqId}`: everything known about one dlqId."""

    dlqId: str
    state: State
    reason: str | None
    rule: str | None
    action: str | None
    matchedRules: list[str]
    overrides: dict[str, Any] | None
    workflowRunId: str | None
    wouldCall: dict[str, Any] | None
    fetchAttempts: int
    fetchRefusals: int
    sends: int
    calls: list[dict[str, Any]]
    batches: list[dict[str, Any]]
    notifications: list[dict[str, Any]]
    history: list[dict[str, Any]]
    receivedAt: float
    decidedAt: float | None
    updatedAt: float


class Rotation(BaseModel):
    """One token rotation; `result` is null while it is under way."""

    id: int
    startedAt: float
    finishedAt: float | None
    result: RotationResult | None
    reason: str | None
    resolvedAt: float | None


class RulesVersion(BaseModel):
    sha256: str
    rules: int
    sweeps: int
    source: str


class ReplicaStatus(BaseModel):
    """A replica alive (on SQLite, this daemon alone)."""

    id: str
    startedAt: float
    seenAt: float  # its last heartbeat
    share: float  # its part of the account's rate limit, 0 to 1
    self: bool  # the daemon that answers


class DaemonStatus(BaseModel):
    """`GET /api/v1/status`."""

    model_config = ConfigDict(extra="allow")  # each status part adds its keys (`sweeps`)

    states: dict[State, int]
    pendingBatches: int
    oldestPendingSeconds: float
    notifications: dict[str, int]
    lastTokenRotation: Rotation | None
    token: dict[str, Any]
    upstream: dict[str, Any]
    rules: RulesVersion
    replicas: list[ReplicaStatus]
    singletonHolder: str | None  # the replica that runs the singleton jobs


class Redriven(BaseModel):
    status: Literal["redriven", "dry-run"]
    count: int
    dlqIds: list[str]  # the first 1,000; `count` is whole


class Reloaded(BaseModel):
    status: Literal["reloaded"]
    sha256: str
    rules: int


class ReloadRefused(Error):
    problems: list[str] | SkipJsonSchema[None] = None  # for a file read but invalid


class Rotated(BaseModel):
    status: Literal["rotated"]
    rotation: Rotation


class RotationFailed(Error):
    rotation: Rotation


class CredentialsReloaded(BaseModel):
    """`POST /-/reload-credentials`: whether the saved token was new and is now in use."""

    status: Literal["taken", "unchanged"]
    lockedOut: bool


class ListedRecord(BaseModel):
    """One record as `GET /api/v1/dlq` lists it (the whole record: `/api/v1/dlq/{dlqId}`)."""

    dlqId: str
    state: State
    reason: str | None
    rule: str | None
    action: str | None
    workflowRunId: str | None
    url: str | None  # from the callback, as the failed delivery's fields
    urlGroup: str | None  # the callback's topicName
    endpoint: str | None  # the callback's endpointName
    status: int | None  # the failed delivery's HTTP status
    receivedAt: float
    decidedAt: float | None
    updatedAt: float | None


class RecordList(BaseModel):
    """`GET /api/v1/dlq`: a page, newest received first; `next` is the next page's cursor."""

    items: list[ListedRecord]
    next: str | None


class ListedBatch(BaseModel):
    id: int
    action: str
    state: Literal["pending", "settled"]
    overrides: dict[str, Any] | None
    dlqIds: list[str]
    runs: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    reason: str | None
    createdAt: float
    sentAt: float | None
    settledAt: float | None


class BatchList(BaseModel):
    """`GET /api/v1/batches`: a page, newest first; `next` is the next page's cursor."""

    items: list[ListedBatch]
    next: str | None


class FailureGroup(BaseModel):
    """Records with the URL Group and endpoint (or the URL, without a group), status and
    rule in common, with how many are in each state."""

    urlGroup: str | None
    endpoint: str | None
    url: str | None  # null when urlGroup is set
    status: int | None
    rule: str | None
    count: int
    states: dict[State, int]
    firstSeen: float
    lastSeen: float


class FailureGroups(BaseModel):
    """`GET /api/v1/groups`: newest activity first."""

    groups: list[FailureGroup]


class ReplayCandidate(BaseModel):
    source: str  # the name it was given (the CLI's path)
    sha256: str


class ReplayDecision(BaseModel):
    """A decision as replay compares them: its rule and action (null: no rule matched)."""

    rule: str | None
    action: str | None


class ReplayRecovery(ReplayDecision):
    overrides: dict[str, Any]  # the rule's, as the store records them


class ReplayCount(BaseModel):
    count: int
    examples: list[str]  # dlqIds, the first few


class ReplayGroup(ReplayCount):
    before: ReplayDecision
    after: ReplayDecision


class ReplayOverrides(ReplayCount):
    before: ReplayRecovery
    after: ReplayRecovery


class ReplayBudget(BaseModel):
    stopped: ReplayCount  # recoveries the candidate's budgets would stop, the live ones did not
    recoveredAgain: ReplayCount  # stopped by the live budgets, recovered by the candidate
    liveStopped: int  # stopped by the live budgets


class NotReplayable(ReplayCount):
    fields: list[str]  # what the candidate reads and these records did not keep


class ReplayReport(BaseModel):
    """`POST /api/v1/replay`: what the candidate would change (docs/rules.md)."""

    candidate: ReplayCandidate
    since: float | None  # the records received since then (Unix time); null: all
    rule: str | None  # the rule reported on (--rule)
    examined: int
    changed: int
    groups: list[ReplayGroup]  # rule and action before -> after, most records first
    overrides: list[ReplayOverrides]
    budget: ReplayBudget
    notReplayable: NotReplayable


class ReplayRefused(Error):
    problems: list[str] | SkipJsonSchema[None] = None  # the candidate's, as `check` says them
