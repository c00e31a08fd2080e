"""The queries a busy store runs all the time read indexes, never the whole table.

Each query runs for real against a store with rows in every state, its statements are
traced, and `EXPLAIN QUERY PLAN` of each must show no SCAN of callbacks, batches or pruned (a
SCAN reads every row, or every entry of an index; a SEARCH reads a range of one).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.store import Callback
from daemon.store.records import Budget, Outcome
from daemon.store.sqlite import SQLiteStore, insert_new_callbacks
from daemon.store.sqlite import pipeline as pipeline
from daemon.store.sqlite import retention as retention
from tests.store.support import OWNER, batched, done, received, settled

NOW = 2_000.0
# state_counts has one row a state: reading it whole is the point.
FULL_SCAN = re.compile(r"\bSCAN (callbacks|batches|pruned)\b")

BUDGETED = Outcome(
    "r-1", "decided", rule="rule-a", action="resume", overrides="{}",
    workflow_run_id="run-1", budget=Budget(3, NOW - 60),
)  # fmt: skip

QUERIES: dict[str, Callable[[sqlite3.Connection], Any]] = {
    "claim": lambda c: pipeline.claim(c, OWNER, 10, 60.0, NOW),
    "pending": pipeline.pending,
    "unsettled_batches": pipeline.unsettled_batches,
    "budget": lambda c: pipeline.settle(c, OWNER, [BUDGETED], NOW),
    "prune": lambda c: retention.prune_chunk(c, before=NOW - 50, until=NOW + 99, chunk=10),
    "expire": lambda c: retention.expire_chunk(c, now=NOW, chunk=10),
    "status": lambda c: pipeline.status(c, NOW),
    "inbox_depth": pipeline.inbox_depth,
    "redrive": lambda c: pipeline.redrive(c, ("failed",), "rule-a", NOW - 10, None, NOW, False),
    "sends": lambda c: pipeline.sends(c, ["d-1", "d-2"]),
    "record": lambda c: pipeline.record(c, "d-1"),
    # Every batch of callbacks that comes in, one of them known: the rows it inserted
    # are read back.
    "insert_new_callbacks": lambda c: insert_new_callbacks(
        c, [Callback(dlq_id, b"{}", NOW) for dlq_id in ("d-1", "new-1", "new-2")]
    ),
}


@pytest.fixture
def database(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    async def fill() -> None:
        async with SQLiteStore.open(tmp_path / "s.db") as store:
            await done(store, ["d-1", "d-2"], now=NOW - 100)
            await settled(store, ["f-1"], "failed", now=NOW - 100)
            await batched(store, ["b-1"], now=NOW)
            await settled(store, ["c-1"], "decided", now=NOW)
            await received(store, "backoff", at=NOW - 1)
            await store.claim(OWNER, 1, 60.0, NOW)
            await store.settle(OWNER, [Outcome("backoff", "received", retry_at=NOW + 60)], NOW)
            await received(store, "r-1", "r-2", at=NOW)
            await store.claim(OWNER, 1, 60.0, NOW)  # r-1 leased

    asyncio.run(fill())
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db", isolation_level=None)) as connection:
        yield connection


@pytest.mark.parametrize("name", list(QUERIES))
def test_the_query_reads_an_index_not_the_table(database: sqlite3.Connection, name: str) -> None:
    """Every statement the query runs is planned without a full scan."""
    statements: list[str] = []
    database.set_trace_callback(statements.append)
    database.execute("BEGIN IMMEDIATE")
    QUERIES[name](database)
    database.execute("ROLLBACK")
    database.set_trace_callback(None)
    planned = [s for s in statements if re.match(r"\s*(SELECT|UPDATE|DELETE|INSERT)", s)]
    assert planned, "no statement traced"
    for statement in planned:
        plan = [row[3] for row in database.execute(f"EXPLAIN QUERY PLAN {statement}")]
        assert not [step for step in plan if FULL_SCAN.search(step)], (statement, plan)
