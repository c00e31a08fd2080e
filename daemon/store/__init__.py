"""Where callbacks are kept until they are handled: the interface every store implements.

SQLite (`sqlite.py`) is the embedded default; a PostgreSQL store will implement the same
interface so that several replicas can share one database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from daemon.store.records import BatchRecord, Claimed, Outcome, Pending, Rotation, RotationResult

Added = Literal["accepted", "duplicate"]


class StoreUnavailable(Exception):
    """The store cannot take or answer a request right now; the caller may try again."""


@dataclass(frozen=True, slots=True)
class Callback:
    """A failure callback as received: its DLQ id and the exact bytes that were signed."""

    dlq_id: str
    body: bytes = field(repr=False)
    received_at: float


class Store(Protocol):
    async def add_callback(self, callback: Callback) -> Added:
        """Store `callback` durably, or say it is a duplicate by dlqId (a pruned one
        included); StoreUnavailable if it cannot, or while `problems()` names any.
        Returns only once the outcome is on disk."""
        ...

    async def get_callback(self, dlq_id: str) -> Callback | None:
        """The stored callback for `dlq_id`, if any."""
        ...

    async def inbox_depth(self) -> int:
        """How many callbacks wait to be fetched (state received)."""
        ...

    async def claim(self, owner: str, limit: int, lease: float, now: float) -> list[Claimed]:
        """Lease up to `limit` received dlqIds to `owner` for `lease` seconds."""
        ...

    async def settle(self, owner: str, outcomes: list[Outcome], now: float) -> list[Pending]:
        """Record what became of `owner`'s leased dlqIds; returns those now decided."""
        ...

    async def pending(self) -> list[Pending]:
        """The decided dlqIds that wait for a batch."""
        ...

    async def open_batch(
        self, action: str, overrides: str, dlq_ids: list[str], now: float
    ) -> BatchRecord | None:
        """Persist a batch of those of `dlq_ids` still decided; None when none is. Not
        counted as a send."""
        ...

    async def mark_sending(self, batch_id: int, now: float) -> None:
        """The batch's call is about to go out (committed before it does)."""
        ...

    async def settle_batch(
        self,
        batch_id: int,
        *,
        done: Sequence[str] = (),
        again: Sequence[str] = (),
        failed: Sequence[str] = (),
        reason: str | None = None,
        runs: Sequence[dict[str, Any]] = (),
        calls: Sequence[dict[str, Any]] = (),
        sent: bool,
        now: float,
    ) -> list[Pending]:
        """Close a pending batch: `done`, decided `again` (returned, with their rules, as
        the batcher queues them), or `failed` with `reason`; a batch already settled is
        left as it is. `sent`: the call may have reached the service, and counts as a
        send of each of its dlqIds; False when it was refused before the service acted
        (or never made)."""
        ...

    async def unsettled_batches(self) -> list[BatchRecord]:
        """Batches persisted whose call was never settled (a crash came in between);
        `sent_at` None: the call surely never went out."""
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
        now: float,
        apply: bool,
    ) -> list[str]:
        """The dlqIds in one of the final `states` (ValueError for another state), of
        `rule` when given, final since `since` (Unix time) when given, in order; with
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
        """Everything known about `dlq_id` (`/api/v1/dlq/{dlqId}`), None if unknown."""
        ...

    async def status(self, now: float) -> dict[str, Any]:
        """Counts by state, unsettled batches, the oldest unfinished dlqId's age."""
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

    async def latest_rotation(self) -> Rotation | None:
        """The last rotation begun, finished or not."""
        ...

    async def last_rotation_success(self) -> float | None:
        """When the last successful rotation finished (Unix time)."""
        ...

    async def ping(self) -> None:
        """Return if the store answers and has no problem; StoreUnavailable (with the
        reason) otherwise."""
        ...


@contextlib.asynccontextmanager
async def open_store(
    url: str, *, observe_commit: Callable[[int], None] | None = None, **options: Any
) -> AsyncIterator[Store]:
    """The store that `url` (RECOVERYD_STORE) names, open for the duration of the block;
    `options` are the store's own (see SQLiteStore.open)."""
    from daemon.store.sqlite import SQLiteStore

    if not url.startswith("sqlite:///"):
        raise ValueError(f"no store for {url!r}; use sqlite:///PATH")
    path = Path(url.removeprefix("sqlite:///"))
    async with SQLiteStore.open(path, observe_commit=observe_commit, **options) as store:
        yield store
