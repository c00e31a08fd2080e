"""The SQLite store notices when its files go or its disk fills, refuses callbacks
meanwhile, and says so in the log once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.store import StoreUnavailable
from daemon.store.sqlite import SQLiteStore
from tests.store.support import callback, cleared_within, problems_within
from tests.support import write_locked


def files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


async def test_deleted_database_files_are_noticed_and_callbacks_refused(
    tmp_path: Path,
) -> None:
    """The files removed under an open store: a problem naming the restart, ping and
    add_callback raise (the receiver answers 503), and it does not clear by itself."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await store.add_callback(callback("d-1"))
        for path in files(tmp_path / "s.db"):
            path.unlink()
        problems = await problems_within(store)
        assert len(problems) == 2  # the database and its write-ahead log
        assert all("deleted" in problem and "restart recoveryd" in problem
                   for problem in problems)  # fmt: skip
        with pytest.raises(StoreUnavailable, match="deleted"):
            await store.add_callback(callback("d-2"))
        with pytest.raises(StoreUnavailable, match="deleted"):
            await store.ping()
        await asyncio.sleep(1.5)
        assert store.problems() == problems


async def test_a_database_file_replaced_by_another_is_noticed(tmp_path: Path) -> None:
    """Another file moved onto the path (a restore gone wrong): replaced, refused."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        shutil.copy(tmp_path / "s.db", tmp_path / "other.db")
        os.replace(tmp_path / "other.db", tmp_path / "s.db")
        problems = await problems_within(store)
        assert any("replaced" in problem for problem in problems)
        with pytest.raises(StoreUnavailable, match="replaced"):
            await store.add_callback(callback("d-1"))


async def test_a_full_store_refuses_callbacks_logs_once_and_recovers(tmp_path: Path) -> None:
    """Filled to max_page_count: SQLITE_FULL is a problem, callbacks are refused with
    StoreUnavailable, the log says so once however often commits fail, and once more
    when room is made."""
    # The pages of an empty store.
    with contextlib.closing(sqlite3.connect(tmp_path / "probe.db")) as probe:
        pages = probe.execute("PRAGMA page_size").fetchone()[0]
    with capture_logs() as logs:
        async with SQLiteStore.open(tmp_path / "s.db", max_page_count=60) as store:
            refusals = []
            for number in range(200):
                try:
                    await store.add_callback(callback(f"d-{number}", body=b"x" * pages))
                except StoreUnavailable as exc:
                    refusals.append(str(exc))
            assert len(refusals) > 100
            assert all("full" in refusal for refusal in refusals)
            assert any("full" in problem for problem in store.problems())
            with pytest.raises(StoreUnavailable, match="full"):
                await store.ping()

            await store._run(lambda c: c.execute("PRAGMA max_page_count = 100000").fetchone())
            assert await cleared_within(store)
            assert await store.add_callback(callback("after", body=b"x")) == "accepted"
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert [entry["event"] for entry in errors] == ["store problem"]
    assert errors[0]["problem"] == "full"
    assert [entry["problem"] for entry in logs if entry["event"] == "store problem cleared"] == [
        "full"
    ]


async def test_repeated_commit_failures_are_logged_once_a_minute(tmp_path: Path) -> None:
    """A failure that is no problem of the files (a lock held elsewhere) is logged the
    first time, and the next times only counted."""
    with capture_logs() as logs:
        async with SQLiteStore.open(tmp_path / "s.db", busy_timeout=0.01) as store:
            with write_locked(tmp_path / "s.db"):
                for number in range(5):
                    with pytest.raises(StoreUnavailable, match="locked"):
                        await store.add_callback(callback(f"d-{number}"))
            assert store.problems() == []
    assert [entry["event"] for entry in logs] == ["store commit failed"]


async def test_the_size_counts_the_database_and_its_log(tmp_path: Path) -> None:
    """size_bytes is the database file plus its WAL."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await store.add_callback(callback("d-1", body=b"x" * 10_000))
        wal = tmp_path / "s.db-wal"
        assert wal.stat().st_size > 0
        expected = (tmp_path / "s.db").stat().st_size + wal.stat().st_size
        assert await store.size_bytes() == expected


async def test_a_callback_committed_after_the_files_went_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """No window between the deletion and the timer's next look: the commit itself
    checks the files, so the callback is refused (503), not answered and lost."""
    async with SQLiteStore.open(tmp_path / "s.db", health_interval=3600) as store:
        await store.add_callback(callback("d-1"))
        for path in files(tmp_path / "s.db"):
            path.unlink()
        with pytest.raises(StoreUnavailable, match="deleted"):
            await store.add_callback(callback("d-2"))
        assert any("deleted" in problem for problem in store.problems())
