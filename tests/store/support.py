"""Putting dlqIds into a state through the store's own calls, as the pipeline would; and
the store under test, of either kind (`OpenStore`, the `open_store` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

import daemon.store
from daemon.store import Callback, Store, StoreUnavailable
from daemon.store.postgres import schema
from daemon.store.records import BatchRecord, Outcome, State
from daemon.store.sqlite import MIGRATIONS, _statements

OWNER = "test-worker"
ACTION = "resume"
OVERRIDES = "{}"
SQLITE = "sqlite:///"
# The counts by state as a full scan finds them (zeros left out, as by `nonzero`).
COUNTED = "SELECT state, count(*) FROM callbacks GROUP BY state"

# Problems must show within ~2 s at the default health interval of 1 s.
NOTICED_WITHIN = 2.5


@dataclass(frozen=True)
class OpenStore:
    """A store of either kind at `url` (RECOVERYD_STORE): `open_store(**options)` opens
    it for an `async with` block, as often as a test likes (closing and opening it again
    is a restart; two blocks at once are two replicas, for PostgreSQL)."""

    url: str

    @property
    def kind(self) -> str:
        return "sqlite" if self.url.startswith(SQLITE) else "postgres"

    def __call__(self, **options: Any) -> contextlib.AbstractAsyncContextManager[Store]:
        return daemon.store.open_store(self.url, **options)

    def migrated_up_to(self, sqlite_script: str, postgres_script: str) -> None:
        """Make the database as a recoveryd left it whose last migration came just before
        `sqlite_script` or `postgres_script` (this engine's, from its MIGRATIONS)."""
        if self.kind == "sqlite":
            path = Path(self.url.removeprefix(SQLITE))
            old_database(path, MIGRATIONS.index(sqlite_script)).close()
            return
        version = schema.MIGRATIONS.index(postgres_script)
        with psycopg.connect(self.url) as pg:
            for script in schema.MIGRATIONS[:version]:
                pg.execute(script.encode())
            pg.execute("CREATE TABLE recoveryd_schema (version integer NOT NULL)")
            pg.execute("INSERT INTO recoveryd_schema (version) VALUES (%s)", (version,))

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Run `sql` (that both databases take) beside the store, committed: its rows."""
        if self.kind == "sqlite":
            path = self.url.removeprefix(SQLITE)
            with contextlib.closing(sqlite3.connect(path)) as connection, connection:
                return connection.execute(sql).fetchall()
        with psycopg.connect(self.url) as pg:
            cursor = pg.execute(sql)
            return cursor.fetchall() if cursor.description else []


def callback(dlq_id: str, received_at: float = 1_000.0, body: bytes = b"{}") -> Callback:
    return Callback(dlq_id, body, received_at)


async def received(store: Store, *dlq_ids: str, at: float = 1_000.0, body: bytes = b"{}") -> None:
    """Callbacks for `dlq_ids` stored, all at once (in a commit or a few)."""
    adds = (store.add_callback(callback(dlq_id, at, body)) for dlq_id in dlq_ids)
    assert await asyncio.gather(*adds) == ["accepted"] * len(dlq_ids)


async def settled(
    store: Store,
    dlq_ids: list[str],
    state: State,
    *,
    now: float,
    rule: str | None = "rule-a",
    reason: str | None = None,
    body: bytes = b"{}",
) -> None:
    """Received dlqIds fetched and decided: `state` (decided, or a final one)."""
    await received(store, *dlq_ids, at=now, body=body)
    claimed = await store.claim(OWNER, len(dlq_ids), 60.0, now)
    assert sorted(item.dlq_id for item in claimed) == sorted(dlq_ids)
    outcomes = [
        Outcome(dlq_id, state, reason=reason, rule=rule, action=ACTION, overrides=OVERRIDES)
        for dlq_id in dlq_ids
    ]
    await store.settle(OWNER, outcomes, now)


async def batched(store: Store, dlq_ids: list[str], *, now: float) -> BatchRecord:
    """Decided dlqIds in a batch that is persisted, not yet sent."""
    await settled(store, dlq_ids, "decided", now=now)
    record = await store.open_batch(ACTION, OVERRIDES, dlq_ids, now)
    assert record is not None
    return record


async def done(store: Store, dlq_ids: list[str], *, now: float) -> BatchRecord:
    """dlqIds recovered by one batch call."""
    record = await batched(store, dlq_ids, now=now)
    await store.mark_sending(record.id, now)
    await store.settle_batch(record.id, done=dlq_ids, sent=True, now=now)
    return record


def nonzero(status: dict[str, Any]) -> dict[str, int]:
    """The counts by state of `status()`, zeros left out."""
    return {state: n for state, n in status["states"].items() if n}


async def problems_within(store: Store, seconds: float = NOTICED_WITHIN) -> list[str]:
    """The store's problems as soon as it names any, or none after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if (problems := store.problems()) or time.monotonic() >= deadline:
            return problems
        await asyncio.sleep(0.05)


async def cleared_within(store: Store, seconds: float = NOTICED_WITHIN) -> bool:
    """Whether the store's problems are gone within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if not store.problems() or time.monotonic() >= deadline:
            return not store.problems()
        await asyncio.sleep(0.05)


async def retried(store: Store, callback: Callback) -> str:
    """add_callback as the service retries a 503: again, shortly, until it is taken."""
    for _ in range(100):
        try:
            return await store.add_callback(callback)
        except StoreUnavailable:
            await asyncio.sleep(0.02)
    raise AssertionError("the store never recovered")


def old_database(path: Path, version: int) -> sqlite3.Connection:
    """A SQLite database as a recoveryd of schema `version` left it, open to add rows to."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    for number, script in enumerate(MIGRATIONS[:version], start=1):
        for statement in _statements(script):
            connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {number}")
    return connection
