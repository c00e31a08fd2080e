"""Putting dlqIds into a state through the store's own calls, as the pipeline would."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from daemon.store import Callback
from daemon.store.records import BatchRecord, Outcome, State
from daemon.store.sqlite import MIGRATIONS, SQLiteStore, _statements

OWNER = "test-worker"
ACTION = "resume"
OVERRIDES = "{}"


def callback(dlq_id: str, received_at: float = 1_000.0, body: bytes = b"{}") -> Callback:
    return Callback(dlq_id, body, received_at)


async def received(
    store: SQLiteStore, *dlq_ids: str, at: float = 1_000.0, body: bytes = b"{}"
) -> None:
    for dlq_id in dlq_ids:
        assert await store.add_callback(callback(dlq_id, at, body)) == "accepted"


async def settled(
    store: SQLiteStore,
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


async def batched(store: SQLiteStore, dlq_ids: list[str], *, now: float) -> BatchRecord:
    """Decided dlqIds in a batch that is persisted, not yet sent."""
    await settled(store, dlq_ids, "decided", now=now)
    record = await store.open_batch(ACTION, OVERRIDES, dlq_ids, now)
    assert record is not None
    return record


async def done(store: SQLiteStore, dlq_ids: list[str], *, now: float) -> BatchRecord:
    """dlqIds recovered by one batch call."""
    record = await batched(store, dlq_ids, now=now)
    await store.mark_sending(record.id, now)
    await store.settle_batch(record.id, done=dlq_ids, sent=True, now=now)
    return record


def old_database(path: Path, version: int) -> sqlite3.Connection:
    """A database as a recoveryd of schema `version` left it, open to add rows to."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    for number, script in enumerate(MIGRATIONS[:version], start=1):
        for statement in _statements(script):
            connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {number}")
    return connection
