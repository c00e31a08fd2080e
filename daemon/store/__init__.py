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
        """How many callbacks the inbox holds (until the pipeline lands, every one stored)."""
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
