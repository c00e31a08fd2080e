"""State counts kept beside the table, so a scrape does not count 10 million rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from daemon.store.sqlite import SQLiteStore
from tests.store.support import batched, done, old_database, received, settled

NOW = 2_000.0


def counted(path: Path) -> dict[str, int]:
    """The counts by state as a full scan finds them, zeros left out."""
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT state, count(*) FROM callbacks GROUP BY state")
        return dict(rows.fetchall())


def nonzero(status: dict[str, Any]) -> dict[str, int]:
    return {state: n for state, n in status["states"].items() if n}


async def test_counts_follow_every_move_and_deletion(tmp_path: Path) -> None:
    """Inserts, state changes, redrives and prunes all keep the counts exact."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await settled(store, ["f-1", "f-2"], "failed", now=NOW)
        await done(store, ["d-1"], now=NOW)
        await batched(store, ["b-1"], now=NOW)
        await settled(store, ["g-1"], "gone", now=NOW - 100)
        await received(store, "r-1", "r-2")
        await store.redrive(now=NOW, apply=True)
        await store.prune(before=NOW - 50, now=NOW, dedup_for=1.0)
        status = await store.status(NOW)
        assert await store.inbox_depth() == 4
    assert nonzero(status) == counted(tmp_path / "s.db") == {
        "received": 4, "done": 1, "batched": 1
    }  # fmt: skip


async def test_every_state_is_reported_even_at_zero(tmp_path: Path) -> None:
    """An empty store reports each state with 0."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        status = await store.status(NOW)
    assert set(status["states"].values()) == {0}
    assert "dry-run" in status["states"]


async def test_the_migration_counts_the_rows_already_there(tmp_path: Path) -> None:
    """A store from before the counts existed starts with them right."""
    connection = old_database(tmp_path / "s.db", version=5)
    connection.executemany(
        "INSERT INTO callbacks (dlq_id, body, received_at, state) VALUES (?, x'', 1, ?)",
        [("a", "received"), ("b", "done"), ("c", "done"), ("d", "failed")],
    )
    connection.close()
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        status = await store.status(NOW)
    assert nonzero(status) == {"received": 1, "done": 2, "failed": 1}


async def test_the_oldest_pending_age_is_of_the_oldest_unfinished_dlq_id(
    tmp_path: Path,
) -> None:
    """Received, decided and batched count; final ones, however old, do not."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await settled(store, ["old-final"], "gone", now=NOW - 500)
        await batched(store, ["b-1"], now=NOW - 30)
        await received(store, "r-1", at=NOW - 10)
        status = await store.status(NOW)
    assert status["oldestPendingSeconds"] == 30
