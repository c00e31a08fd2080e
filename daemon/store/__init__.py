"""Where callbacks are kept until they are handled: the interface every store implements.

SQLite (`sqlite.py`) is the embedded default; a PostgreSQL store will implement the same
interface so that several replicas can share one database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
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
        """Store `callback` durably, or say it is a duplicate by dlqId; StoreUnavailable if
        it cannot. Returns only once the outcome is on disk."""
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
        """Persist a batch of those of `dlq_ids` still decided; None when none is."""
        ...

    async def settle_batch(self, batch_id: int, **outcome: Any) -> None:
        """Close a batch (see sqlite_pipeline.settle_batch for the outcome's keys)."""
        ...

    async def unsettled_batches(self) -> list[BatchRecord]:
        """Batches persisted whose call was never settled (a crash came in between)."""
        ...

    async def sends(self, dlq_ids: list[str]) -> dict[str, int]:
        """How many batches each dlqId has been in."""
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
        """Return if the store answers; StoreUnavailable otherwise."""
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
