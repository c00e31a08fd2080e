"""The interface every store implements, and the values and errors it speaks in. The
engines (sqlite/, postgres/) import it from here, not from the package, which opens
them (`daemon.store.open_store`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from daemon.store.records import (
    BatchRecord,
    Claimed,
    LearnedRate,
    NotificationJob,
    NotificationResult,
    Outcome,
    Pending,
    ReplayRow,
    Replica,
    Rotation,
    RotationResult,
    Settled,
)
from daemon.store.removals import Removal, RemovalResult
from daemon.store.sweep_records import PageOutcome, SweepResult, SweepRun

Added = Literal["accepted", "duplicate"]
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(url: object) -> bool:
    """Whether `url` (a RECOVERYD_STORE value, or None when unset) names a PostgreSQL
    store."""
    return isinstance(url, str) and url.startswith(POSTGRES_SCHEMES)


@dataclass(frozen=True)
class RecordQuery:
    """Which records `Store.list_records` lists: each filter given narrows it."""

    state: str | None = None  # one State
    rule: str | None = None
    action: str | None = None
    since: float | None = None  # received at or after (epoch seconds)
    q: str | None = None  # exact match on a dlqId, workflow run id, URL or URL Group
    cursor: str | None = None  # opaque, from a Page's `next`
    limit: int = 50  # 1..500


@dataclass(frozen=True)
class Page:
    """One page of a listing, and the cursor of the next one (None on the last)."""

    items: list[dict[str, Any]]
    next: str | None


class BadQuery(ValueError):
    """A listing's parameter is not one the store can take: `field` names it (the admin
    API answers 400 with it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class StoreUnavailable(Exception):
    """The store cannot take or answer a request right now; the caller may try again."""


class StoreMissing(Exception):
    """A command that works on what the daemon recorded found no store where
    RECOVERYD_STORE points (only `serve` creates one): `str()` is what to print."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"{problem}: is RECOVERYD_STORE set as for serve?")


@dataclass(frozen=True, slots=True)
class Callback:
    """A failure callback as received: its DLQ id and the exact bytes that were signed.
    `verified`: its signature held over those bytes (not taken unsigned), so the pipeline
    may decide from it without reading the DLQ message (RECOVERYD_FETCH=needed)."""

    dlq_id: str
    body: bytes = field(repr=False)
    received_at: float
    verified: bool = False
    # Its url, URL Group, endpoint and status as listed (listing.listed), when the
    # receiver has them from its parse; else the store reads them from `body`.
    listed: tuple[str | None, str | None, str | None, int | None] | None = None


class SingletonLock(Protocol):
    """The lock that makes one replica at a time run the singleton jobs (leadership.py)."""

    async def acquire(self) -> bool:
        """Take the lock if no other replica holds it; StoreUnavailable if the store
        cannot be reached."""
        ...

    async def held(self) -> bool:
        """Whether this replica still holds it (False once it may not)."""
        ...

    async def release(self) -> None:
        """Let it go."""
        ...


class Unshared:
    """The lock of a store that one daemon alone uses: always this daemon's."""

    async def acquire(self) -> bool:
        return True

    async def held(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class Store(Protocol):
    # Whether several replicas may share the store (PostgreSQL), or one daemon has it.
    shared: bool

    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        """Store `callback` durably, or say it is a duplicate by dlqId (a pruned one
        included): the future has the outcome once it is on disk. StoreUnavailable, at
        once or from the future, if it cannot, or while `problems()` names any. A future,
        not a coroutine: the receiver waits on it with a callback, without a task."""
        ...

    async def get_callback(self, dlq_id: str) -> Callback | None:
        """The stored callback for `dlq_id`, if any."""
        ...

    async def inbox_depth(self) -> int:
        """How many callbacks wait to be fetched (state received)."""
        ...

    async def claim(
        self, owner: str, limit: int, lease: float, now: float, *, bodies: bool = False
    ) -> list[Claimed]:
        """Lease up to `limit` received dlqIds to `owner` for `lease` seconds; with
        `bodies`, each with its callback's body when its signature verified
        (`Claimed.signed_callback`, for RECOVERYD_FETCH=needed)."""
        ...

    async def settle(self, owner: str, outcomes: list[Outcome], now: float) -> Settled:
        """Record what became of `owner`'s leased dlqIds: those now decided, and the
        recoveries a budget stopped."""
        ...

    async def retry_now(self, now: float, limit: int | None = None) -> int:
        """The service answers again: the received dlqIds whose next fetch waits for it
        (`Outcome.waits_for_service`) are due now, to be claimed in order of arrival;
        how many. Those waiting out a backoff of their own (a 400) wait on. With `limit`,
        only that many, the soonest due first (one, to probe the service with)."""
        ...

    async def pending(self, owner: str | None = None) -> list[Pending]:
        """The decided dlqIds that wait for a batch: those replica `owner` decided or
        took over, the ones of no live replica taken over first (all when None)."""
        ...

    async def open_batch(
        self, action: str, overrides: str, dlq_ids: list[str], now: float, owner: str | None = None
    ) -> BatchRecord | None:
        """Persist a batch of those of `dlq_ids` still decided, held by replica `owner`;
        None when none is. Not counted as a send."""
        ...

    async def mark_sending(self, batch_id: int, now: float, owner: str | None = None) -> bool:
        """The batch's call is about to go out (committed before it does); False when it
        must not: the batch is settled, or no longer `owner`'s."""
        ...

    async def settle_batch(
        self,
        batch_id: int,
        *,
        done: Sequence[str] = (),
        again: Sequence[str] = (),
        failed: Sequence[str] = (),
        gone: Sequence[str] = (),
        reason: str | None = None,
        runs: Sequence[dict[str, Any]] = (),
        calls: Sequence[dict[str, Any]] = (),
        sent: bool,
        now: float,
    ) -> Settled:
        """Close a pending batch: `done`, decided `again` (returned, with their rules, as
        the batcher queues them), or `failed` (returned: those this settle made failed,
        with their rules) or `gone` with `reason`; a batch already settled is left as it
        is. `sent`: the call may have reached the service, and counts as a send of each of
        its dlqIds; False when it was refused before the service acted (or never made)."""
        ...

    async def unsettled_batches(self, owner: str | None = None) -> list[BatchRecord]:
        """Batches persisted whose call was never settled (a crash came in between);
        `sent_at` None: the call surely never went out. With `owner`, those replica
        `owner` holds, the ones of no live replica adopted first."""
        ...

    async def heartbeat(self, replica: str, lease: float, now: float) -> list[str]:
        """`replica` is alive for `lease` seconds more; the replicas found gone since,
        whose work (leases, decided dlqIds, batches) is now anyone's. A store of one
        process (SQLite) has no others: nothing to do."""
        ...

    async def leave(self, replica: str) -> None:
        """`replica` stops: its work is anyone's from now on."""
        ...

    async def replicas(self, now: float) -> list[Replica]:
        """The replicas alive in a shared store, by id; none in a store of one daemon
        (SQLite)."""
        ...

    def singleton_lock(self, replica: str | None = None) -> SingletonLock:
        """A lock for the singleton jobs, not taken yet, for replica `replica`."""
        ...

    async def singleton_holder(self) -> str | None:
        """Which replica holds the singleton lock of a shared store (its id, cut to 63
        bytes from the end: store/postgres/singleton.py), None when none does; None in a
        store of one daemon, whose lock is always its own."""
        ...

    async def sends(self, dlq_ids: list[str]) -> dict[str, int]:
        """How many calls that may have reached the service carried each dlqId."""
        ...

    async def redrive(
        self,
        *,
        states: Sequence[str] = ("failed",),
        rule: str | None = None,
        since: float | None = None,
        dlq_ids: Sequence[str] | None = None,
        now: float,
        apply: bool,
    ) -> list[str]:
        """The dlqIds in one of the final `states` (ValueError for another state), of
        `rule` when given, final since `since` (Unix time) when given, among `dlq_ids`
        when given, in order; with
        `apply` they go back to `received` in one transaction, tries and reason cleared."""
        ...

    async def prune(self, *, before: float, now: float, dedup_for: float, chunk: int = 200) -> int:
        """Delete records final since before `before` in transactions of `chunk`, each
        pruned dlqId still a duplicate for `dedup_for` seconds; how many were deleted."""
        ...

    async def size_bytes(self) -> int:
        """The store's size on disk."""
        ...

    def problems(self) -> list[str]:
        """What makes the store unfit to take callbacks now (files deleted or replaced,
        full, unwritable), one sentence each. No I/O: cheap enough for every request."""
        ...

    async def record(self, dlq_id: str) -> dict[str, Any] | None:
        """Everything known about `dlq_id` (`/api/v1/dlq/{dlqId}`), its notifications
        included; None if unknown."""
        ...

    async def status(self, now: float) -> dict[str, Any]:
        """Counts by state, unsettled batches, the oldest unfinished dlqId's age, and the
        notifications pending (`{"notifications": {"pending": n}}`)."""
        ...

    async def due_notifications(
        self, now: float, limit: int, skip_receivers: Sequence[str] = ()
    ) -> list[NotificationJob]:
        """Up to `limit` pending notifications due by `now`, longest due first, none to
        a receiver in `skip_receivers`. (They are queued by `settle`, from the outcomes'
        `notifications`, in the same transaction as the decision.)"""
        ...

    async def begin_notification_attempt(
        self, notification_id: int, now: float, retry_at: float
    ) -> int | None:
        """Count an attempt about to go out (committed before it does) and make the
        notification due again at `retry_at` should its outcome never be recorded; the
        attempt's number, or None when it is no longer pending."""
        ...

    async def finish_notification_attempt(
        self,
        notification_id: int,
        result: NotificationResult,
        *,
        status: int | None,
        reason: str,
        next_at: float | None,
        now: float,
    ) -> bool:
        """Record an attempt's outcome: `sent`, `failed`, or `retry` at `next_at`; an
        ended notification is noted in its dlqId's record (see sqlite/notify.py). True when
        this made the dlqId its notify rule decided `failed`."""
        ...

    async def begin_rotation(self, now: float) -> int | None:
        """Record a token rotation under way; None when one already is."""
        ...

    async def finish_rotation(
        self, rotation_id: int, result: RotationResult, reason: str | None, now: float
    ) -> None:
        """Record how the rotation ended (a no-op when it has already ended)."""
        ...

    async def resolve_lockout(self, now: float) -> None:
        """A token that works is in hand again: the lockout recorded, if any, is over."""
        ...

    async def unless_rotating(self, write: Callable[[], None]) -> bool:
        """Run `write` (an operator's token saved: `recoveryd set-token`) unless a rotation
        is under way, while none can begin; whether it ran."""
        ...

    async def latest_rotation(self) -> Rotation | None:
        """The last rotation begun, finished or not."""
        ...

    async def last_rotation_success(self) -> float | None:
        """When the last successful rotation finished (Unix time)."""
        ...

    async def last_rotation_failure(self) -> float | None:
        """When the last rotation that ended in `failure` finished (Unix time)."""

    async def learned_rate(self) -> LearnedRate | None:
        """The account's rate limit as a replica last learned it, and how; None before
        any has been learned (daemon/account/rate.py)."""
        ...

    async def save_learned_rate(self, learned: LearnedRate) -> None:
        """Keep `learned` for every replica and the next start, in place of the last."""
        ...

    async def begin_sweep_run(
        self,
        sweep: str,
        *,
        action: str,
        dry_run: bool,
        filter: dict[str, Any],
        overrides: dict[str, Any] | None,
        max_per_run: int,
        now: float,
    ) -> int | None:
        """Record a run of `sweep` under way (its filter with dates resolved); None when
        one already is."""
        ...

    async def begin_sweep_page(
        self, run_id: int, page: int, *, count: int, cursor: str | None, now: float
    ) -> None:
        """The run's page `page` is about to be asked for (committed before it is)."""
        ...

    async def settle_sweep_page(
        self,
        run_id: int,
        page: int,
        *,
        outcome: PageOutcome,
        items: Sequence[dict[str, Any]] = (),
        next_cursor: str | None = None,
        error: str | None = None,
        now: float,
    ) -> None:
        """What the page came to, and the run's totals with it (a no-op when settled)."""
        ...

    async def finish_sweep_run(
        self, run_id: int, result: SweepResult, error: str | None, now: float
    ) -> None:
        """Record how the run ended (a no-op when it has already ended)."""
        ...

    async def close_interrupted_sweep_runs(
        self, now: float, sweep: str | None = None
    ) -> list[SweepRun]:
        """End every run under way (of `sweep` when given) as interrupted, a page still
        being sent as unknown; the runs so closed."""
        ...

    async def sweep_runs(self, sweep: str, limit: int) -> list[SweepRun]:
        """The latest `limit` runs of `sweep`, newest first, with their pages."""
        ...

    async def last_sweep_successes(self) -> dict[str, float]:
        """When each sweep's last successful run finished (Unix time)."""
        ...

    # Endpoint removals (remove-endpoint; states in removals.py). A failure is counted
    # by `settle`, with its dlqId's decision.

    async def removals_due(self, now: float) -> list[Removal]:
        """Removals not finished whose next step is due, oldest first."""
        ...

    async def defer_removal(
        self,
        removal_id: int,
        *,
        reason: str,
        retry_at: float,
        tried: bool = True,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> None:
        """The removal's step must wait until `retry_at`; one more try counted when
        `tried` (a call was made)."""
        ...

    async def intend_removal(
        self,
        removal_id: int,
        *,
        name: str | None,
        url: str | None,
        max_per_hour: int,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> Removal | None:
        """A pending removal becomes `removing` (committed before its DELETE) with the
        endpoint as read, or `capped` over `max_per_hour` removals in the last hour."""
        ...

    async def finish_removal(
        self,
        removal_id: int,
        result: RemovalResult,
        reason: str,
        *,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> bool:
        """End the removal, and with it its dlqId; False when it had ended already."""
        ...

    async def removals(self, group: str | None = None) -> list[dict[str, Any]]:
        """Every removal (of `group` when given) with its evidence, as
        `/api/v1/removals` lists them, oldest first."""
        ...

    async def begin_restore(self, group: str, name: str, now: float) -> Removal:
        """The last removal of endpoint `name` (name, or url) from `group`, marked as
        being restored; RestoreRefused when there is nothing to restore."""
        ...

    async def finish_restore(
        self,
        removal_id: int,
        *,
        restored: bool,
        reason: str,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> None:
        """How the restore went; one that did not go through can be run again."""
        ...

    # The console's listings (listing.py; docs/api.md#get-apiv1dlq): index walks and the
    # aggregate kept by triggers, never a scan of the callbacks.

    async def list_records(self, query: RecordQuery) -> Page:
        """The records `query` selects, newest received first, a page at a time
        (keyset on received_at and dlqId); BadQuery for a bad filter or cursor."""
        ...

    async def lineage(self, dlq_id: str) -> list[dict[str, Any]]:
        """The decided records of `dlq_id`'s workflow line (its earlier and later
        recoveries, itself included: what its budget counts), newest decision first, at
        most 50; empty for an unknown dlqId or one not of a workflow."""
        ...

    async def list_batches(
        self, state: str | None = None, cursor: str | None = None, limit: int = 50
    ) -> Page:
        """The batches (in `state` when given), newest first; BadQuery as above."""
        ...

    async def failure_groups(self, limit: int = 100) -> list[dict[str, Any]]:
        """The records grouped by URL Group and endpoint (or URL), the failed delivery's
        status and the rule, with counts by state, newest activity first."""
        ...

    async def rule_outcomes(self) -> dict[str, dict[str, int]]:
        """For each rule that decided records still kept, how many are in each state."""
        ...

    async def activity(self, now: float, minutes: int = 60) -> dict[str, list[int]]:
        """Decisions and recoveries (dlqIds become `done`) per minute over the last
        `minutes` before `now`, oldest minute first."""
        ...

    # Replay and the shadow rules (replay.py; docs/rules.md, "Changing rules safely").

    async def replay_rows(
        self, since: float | None, after: tuple[float, str] | None, limit: int
    ) -> list[ReplayRow]:
        """Records with kept facts, received at or after `since`, in (received_at, dlqId)
        order strictly after `after` (keyset), at most `limit`: replay streams them a page
        at a time and never holds them all. An index walk, not a sort."""
        ...

    async def shadow_disagreements(self, since: float | None = None) -> list[dict[str, Any]]:
        """Records the shadow decided differently from the live rules (rule, action or
        overrides), grouped: [{"liveRule", "liveAction", "shadowRule", "shadowAction",
        "count", "examples": [up to 5 dlqIds]}], most first."""
        ...

    async def ping(self) -> None:
        """Return if the store answers and has no problem; StoreUnavailable (with the
        reason) otherwise."""
        ...
