"""What is the embedded SQLite store's own: locks, its schema's versions and migrations,
files, and the space pruning gives back. (What every store does is tested on both: see
conftest.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from daemon.store import Callback, StoreUnavailable
from daemon.store.sqlite import MIGRATIONS, SQLiteStore, _transaction
from tests.store.support import nonzero, old_database, received, retried, settled
from tests.support import eventually, write_locked


def _callback(dlq_id: str, body: bytes = b'{"dlqId": "x"}') -> Callback:
    return Callback(dlq_id, body, received_at=1_700_000_000.5)


async def test_a_database_locked_by_another_process_makes_the_store_unavailable(
    tmp_path: Path,
) -> None:
    """A commit that cannot get the lock within busy_timeout fails; the next one succeeds."""
    async with SQLiteStore.open(tmp_path / "s.db", busy_timeout=0.05) as store:
        with write_locked(tmp_path / "s.db"), pytest.raises(StoreUnavailable, match="locked"):
            await store.add_callback(_callback("d-1"))
        assert await store.add_callback(_callback("d-1")) == "accepted"


async def test_a_stalled_commit_is_reported_and_lands_later(tmp_path: Path) -> None:
    """Callers hear at commit_timeout, new callbacks are refused while the commit hangs,
    and the commit still lands: the retry is a duplicate, nothing is lost or doubled."""
    options = {"busy_timeout": 2.0, "commit_timeout": 0.1}
    async with SQLiteStore.open(tmp_path / "s.db", **options) as store:
        with write_locked(tmp_path / "s.db"):
            with pytest.raises(StoreUnavailable, match="in time"):
                await store.add_callback(_callback("d-1"))
            with pytest.raises(StoreUnavailable, match="not committing"):
                await store.add_callback(_callback("d-2"))
        assert await retried(store, _callback("d-1")) == "duplicate"


async def test_too_many_waiting_callbacks_are_refused_not_queued(tmp_path: Path) -> None:
    """Past max_pending the store says so at once (503 upstream) instead of growing."""
    options = {"busy_timeout": 2.0, "max_pending": 2}
    async with SQLiteStore.open(tmp_path / "s.db", **options) as store:
        with write_locked(tmp_path / "s.db"):
            committing = asyncio.ensure_future(store.add_callback(_callback("d-0")))
            await asyncio.sleep(0.05)  # the writer has taken d-0 and waits for the lock
            waiting = [
                asyncio.ensure_future(store.add_callback(_callback(f"d-{i}"))) for i in (1, 2)
            ]
            await asyncio.sleep(0)
            with pytest.raises(StoreUnavailable, match="behind"):
                await store.add_callback(_callback("d-3"))
        assert await asyncio.gather(committing, *waiting) == ["accepted"] * 3


async def test_a_commit_hung_at_shutdown_closes_the_file_once_it_ends(tmp_path: Path) -> None:
    """The store stops without waiting for a hung commit, and closes its connection once
    that commit ends: SQLite then checkpoints and removes the WAL, as after any close."""
    path, wal = tmp_path / "s.db", tmp_path / "s.db-wal"
    with contextlib.ExitStack() as lock:
        async with SQLiteStore.open(path, busy_timeout=10.0, commit_timeout=0.1) as store:
            lock.enter_context(write_locked(path))
            with pytest.raises(StoreUnavailable, match="in time"):
                await store.add_callback(_callback("d-1"))
        assert wal.exists()  # stopped, the commit still waits for the lock
    await eventually(lambda: not wal.exists(), what="the WAL to be removed")
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("SELECT dlq_id FROM callbacks").fetchall() == [("d-1",)]


async def test_a_new_database_gets_the_current_schema_version(tmp_path: Path) -> None:
    """user_version records the migrations applied; WAL mode is on."""
    async with SQLiteStore.open(tmp_path / "s.db"):
        pass
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_database_from_a_newer_recoveryd_is_not_touched(tmp_path: Path) -> None:
    """A schema newer than this code is refused at open, with the versions named."""
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as connection:
        connection.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreUnavailable, match="newer than this recoveryd"):
        async with SQLiteStore.open(tmp_path / "s.db"):
            pass


async def test_a_path_that_cannot_be_opened_is_reported(tmp_path: Path) -> None:
    """A missing folder: StoreUnavailable naming the path."""
    path = tmp_path / "missing" / "s.db"
    with pytest.raises(StoreUnavailable, match=str(path)):
        async with SQLiteStore.open(path):
            pass


def test_a_failed_commit_rolls_back_and_reports_its_own_error(tmp_path: Path) -> None:
    """When COMMIT itself fails the lock is released and the error is COMMIT's, so the
    next batch is not stuck 'within a transaction'."""
    with contextlib.closing(
        sqlite3.connect(tmp_path / "fk.db", isolation_level=None)
    ) as connection:
        connection.execute("PRAGMA foreign_keys = ON")
        connection.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        connection.execute(
            "CREATE TABLE child (parent INTEGER REFERENCES parent DEFERRABLE INITIALLY DEFERRED)"
        )
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"), _transaction(connection):
            connection.execute("INSERT INTO child VALUES (1)")  # fails only at COMMIT
        assert not connection.in_transaction
        with _transaction(connection):
            connection.execute("INSERT INTO parent VALUES (1)")


async def test_a_read_cancelled_as_it_completes_is_still_cancelled(tmp_path: Path) -> None:
    """A task cancelled in the instant its read finishes must end cancelled: swallowing
    the cancellation (as `asyncio.wait_for` does on Python 3.11) leaves a poll loop
    running after its `cancel()`, and the daemon's shutdown waiting for it for ever."""
    gate = threading.Event()

    def read(connection: sqlite3.Connection) -> int:
        gate.wait(5)
        return 1

    async with SQLiteStore.open(tmp_path / "s.db") as store:
        task = asyncio.create_task(store._run(read))
        await asyncio.sleep(0.05)  # the task now waits for the read
        gate.set()
        # Blocking on purpose: the loop must not run, so that the read's result is queued
        # for it and not yet delivered when the cancellation comes.
        time.sleep(0.1)  # noqa: ASYNC251
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_batch_left_unsettled_by_an_older_recoveryd_is_taken_as_possibly_sent(
    tmp_path: Path,
) -> None:
    """Before sent_at existed nothing said whether the call left: the migration assumes
    it may have, so the batch is checked with GETs rather than sent again blind."""
    with contextlib.closing(old_database(tmp_path / "s.db", version=3)) as connection:
        connection.execute(
            "INSERT INTO batches (action, overrides, state, dlq_ids, created_at) "
            "VALUES ('resume', '{}', 'pending', '[\"d-1\"]', 5.0)"
        )
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        [record] = await store.unsettled_batches()
    assert record.sent_at == 5.0


async def test_the_migration_counts_the_rows_already_there(tmp_path: Path) -> None:
    """A store from before the counts by state existed starts with them right."""
    with contextlib.closing(old_database(tmp_path / "s.db", version=5)) as connection:
        connection.executemany(
            "INSERT INTO callbacks (dlq_id, body, received_at, state) VALUES (?, x'', 1, ?)",
            [("a", "received"), ("b", "done"), ("c", "done"), ("d", "failed")],
        )
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        status = await store.status(2_000.0)
    assert nonzero(status) == {"received": 1, "done": 2, "failed": 1}


async def test_pruning_gives_the_space_back(tmp_path: Path) -> None:
    """After a pass the file is smaller (a file this recoveryd created)."""
    now = 100_000.0
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await settled(store, [f"d-{i}" for i in range(500)], "gone", now=now - 10,
                      body=b"x" * 2000)  # fmt: skip
        await received(store, "kept", at=now)
        before = await store.size_bytes()
        await store.prune(before=now, now=now, dedup_for=86_400.0)
        assert await store.size_bytes() < before / 4
