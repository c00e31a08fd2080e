"""Where callbacks are kept until they are handled: the interface every store implements
(interface.py), and `open_store`, which opens the one a URL names.

SQLite (`sqlite/`) is the embedded default; PostgreSQL (`postgres/`) implements the
same interface so that several replicas can share one database. What both do the same
way is written once, in facade.py; the values both build are in records.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from daemon.store.interface import (
    POSTGRES_SCHEMES,
    Added,
    BadQuery,
    Callback,
    Page,
    RecordQuery,
    SingletonLock,
    Store,
    StoreMissing,
    StoreUnavailable,
    Unshared,
    is_postgres,
)

__all__ = [
    "POSTGRES_SCHEMES",
    "Added",
    "BadQuery",
    "Callback",
    "Page",
    "RecordQuery",
    "SingletonLock",
    "Store",
    "StoreMissing",
    "StoreUnavailable",
    "Unshared",
    "is_postgres",
    "open_store",
]


@contextlib.asynccontextmanager
async def open_store(
    url: str,
    *,
    observe_commit: Callable[[int], None] | None = None,
    create: bool = True,
    **options: Any,
) -> AsyncIterator[Store]:
    """The store that `url` (RECOVERYD_STORE) names, open for the duration of the block;
    `options` are the store's own (see SQLiteStore.open, PostgresStore.open). With
    `create` false (a command reading what the daemon recorded), a store not made yet is
    StoreMissing, and nothing is created: a mistyped URL must not read as a store with
    nothing in it."""
    if is_postgres(url):
        from daemon.store.postgres import PostgresStore

        # Replicas share the leases: none is released at start (a crashed one's expire).
        options.pop("release_leases", None)
        postgres = PostgresStore.open(url, observe_commit=observe_commit, create=create, **options)
        async with postgres as pg:
            yield pg
        return
    from daemon.store.sqlite import SQLiteStore

    if not url.startswith("sqlite:///"):
        raise ValueError(f"no store for {url!r}; use sqlite:///PATH or postgresql://...")
    path = Path(url.removeprefix("sqlite:///"))
    opened = SQLiteStore.open(path, observe_commit=observe_commit, create=create, **options)
    async with opened as store:
        yield store
