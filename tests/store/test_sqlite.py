"""The embedded SQLite store: durable, duplicate-free, group-committed, honest when stuck."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from daemon.store import Callback, StoreUnavailable
from daemon.store.sqlite import MIGRATIONS, SQLiteStore, _transaction


def _callback(dlq_id: str, body: bytes = b'{"dlqId": "x"}') -> Callback:
    return Callback(dlq_id, body, received_at=1_700_000_000.5)


async def test_a_callback_is_read_back_after_the_store_is_reopened(tmp_path: Path) -> None:
    """What add_callback reported stored is in the file, byte for byte."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        assert await store.add_callback(_callback("d-1", b"\x00raw\xff")) == "accepted"
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        assert await store.get_callback("d-1") == _callback("d-1", b"\x00raw\xff")
        assert await store.get_callback("d-2") is None


async def test_a_second_callback_for_a_dlq_id_is_a_duplicate(tmp_path: Path) -> None:
    """By dlqId, in separate commits: the first one stays."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await store.add_callback(_callback("d-1", b"first"))
        assert await store.add_callback(_callback("d-1", b"second")) == "duplicate"
        stored = await store.get_callback("d-1")
        assert stored is not None
        assert stored.body == b"first"


async def test_duplicates_within_one_commit_are_found_too(tmp_path: Path) -> None:
    """Two callbacks for one dlqId in the same batch: one accepted, one duplicate."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        outcomes = await asyncio.gather(*(store.add_callback(_callback("d-1")) for _ in range(2)))
        assert sorted(outcomes) == ["accepted", "duplicate"]
        assert await store.inbox_depth() == 1


async def test_concurrent_callbacks_share_commits(tmp_path: Path) -> None:
    """200 callbacks arriving together take far fewer than 200 commits (disk flushes)."""
    commits: list[int] = []
    async with SQLiteStore.open(tmp_path / "s.db", observe_commit=commits.append) as store:
        adds = (store.add_callback(_callback(f"d-{i}")) for i in range(200))
        assert set(await asyncio.gather(*adds)) == {"accepted"}
        assert await store.inbox_depth() == 200
    assert sum(commits) == 200
    assert len(commits) < 20


async def test_callbacks_waiting_at_close_are_committed(tmp_path: Path) -> None:
    """Shutting down does not drop callbacks whose commit has not run yet."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        waiting = [asyncio.create_task(store.add_callback(_callback(f"d-{i}"))) for i in range(5)]
        await asyncio.sleep(0)  # each task has queued its callback
    assert [await task for task in waiting] == ["accepted"] * 5
    with sqlite3.connect(tmp_path / "s.db") as connection:
        assert connection.execute("SELECT count(*) FROM callbacks").fetchone() == (5,)


async def test_a_closed_store_refuses_new_callbacks(tmp_path: Path) -> None:
    """After close, add_callback says unavailable rather than hanging."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        pass
    with pytest.raises(StoreUnavailable, match="shutting down"):
        await store.add_callback(_callback("d-late"))


async def test_a_database_locked_by_another_process_makes_the_store_unavailable(
    tmp_path: Path,
) -> None:
    """A commit that cannot get the lock within busy_timeout fails; the next one succeeds."""
    async with SQLiteStore.open(tmp_path / "s.db", busy_timeout=0.05) as store:
        blocker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.add_callback(_callback("d-1"))
        blocker.execute("ROLLBACK")
        blocker.close()
        assert await store.add_callback(_callback("d-1")) == "accepted"


async def test_a_stalled_commit_is_reported_and_lands_later(tmp_path: Path) -> None:
    """Callers hear at commit_timeout, new callbacks are refused while the commit hangs,
    and the commit still lands: the retry is a duplicate, nothing is lost or doubled."""
    options = {"busy_timeout": 2.0, "commit_timeout": 0.1}
    async with SQLiteStore.open(tmp_path / "s.db", **options) as store:
        blocker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="in time"):
            await store.add_callback(_callback("d-1"))
        with pytest.raises(StoreUnavailable, match="not committing"):
            await store.add_callback(_callback("d-2"))
        blocker.execute("ROLLBACK")
        blocker.close()
        assert await _retried(store, _callback("d-1")) == "duplicate"


async def _retried(store: SQLiteStore, callback: Callback) -> str:
    """add_callback as the service retries a 503: again, shortly, until it is taken."""
    for _ in range(100):
        try:
            return await store.add_callback(callback)
        except StoreUnavailable:
            await asyncio.sleep(0.02)
    raise AssertionError("the store never recovered")


async def test_too_many_waiting_callbacks_are_refused_not_queued(tmp_path: Path) -> None:
    """Past max_pending the store says so at once (503 upstream) instead of growing."""
    options = {"busy_timeout": 2.0, "max_pending": 2}
    async with SQLiteStore.open(tmp_path / "s.db", **options) as store:
        blocker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        committing = asyncio.create_task(store.add_callback(_callback("d-0")))
        await asyncio.sleep(0.05)  # the writer has taken d-0 and waits for the lock
        waiting = [asyncio.create_task(store.add_callback(_callback(f"d-{i}"))) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(StoreUnavailable, match="behind"):
            await store.add_callback(_callback("d-3"))
        blocker.execute("ROLLBACK")
        blocker.close()
        assert await asyncio.gather(committing, *waiting) == ["accepted"] * 3


async def test_a_new_database_gets_the_current_schema_version(tmp_path: Path) -> None:
    """user_version records the migrations applied; WAL mode is on."""
    async with SQLiteStore.open(tmp_path / "s.db"):
        pass
    with sqlite3.connect(tmp_path / "s.db") as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_database_from_a_newer_recoveryd_is_not_touched(tmp_path: Path) -> None:
    """A schema newer than this code is refused at open, with the versions named."""
    with sqlite3.connect(tmp_path / "s.db") as connection:
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


async def test_a_batch_larger_than_one_statement_finds_every_duplicate(tmp_path: Path) -> None:
    """700 callbacks at once (three statements' worth), with duplicates in other chunks and
    of stored ones: each dlqId accepted once, every other copy a duplicate."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await store.add_callback(_callback("d-5"))
        ids = [f"d-{i}" for i in range(600)] + [f"d-{i}" for i in range(0, 600, 6)]
        outcomes = await asyncio.gather(*(store.add_callback(_callback(i)) for i in ids))
        assert outcomes.count("accepted") == 599
        assert outcomes[5] == "duplicate"
        assert outcomes[600:] == ["duplicate"] * 100
        assert await store.inbox_depth() == 600


async def test_a_failing_metric_does_not_stop_the_writer(tmp_path: Path) -> None:
    """observe_commit raising is not the store's problem: later callbacks still commit."""

    def broken(size: int) -> None:
        raise RuntimeError("metric backend down")

    async with SQLiteStore.open(tmp_path / "s.db", observe_commit=broken) as store:
        assert await store.add_callback(_callback("d-1")) == "accepted"
        assert await store.add_callback(_callback("d-2")) == "accepted"


def test_a_failed_commit_rolls_back_and_reports_its_own_error(tmp_path: Path) -> None:
    """When COMMIT itself fails the lock is released and the error is COMMIT's, so the
    next batch is not stuck 'within a transaction'."""
    connection = sqlite3.connect(tmp_path / "fk.db", isolation_level=None)
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
    connection.close()


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
