"""The embedded store: one SQLite file in WAL mode, written with group commit.

Every callback must be on disk before its 2xx leaves, but a disk flush per request
would cap ingest at the disk's flush rate. So one writer task takes every callback that
arrived while the previous commit was being flushed and commits them together: under
load a flush serves many requests, and when idle a request waits for one flush only.
SQLite calls run on a single dedicated thread, which owns the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog

from daemon.store import Added, Callback, StoreUnavailable
from daemon.store import sqlite_pipeline as pipeline
from daemon.store import sqlite_rotations as rotations
from daemon.store.records import (
    BatchRecord,
    Claimed,
    Outcome,
    Pending,
    Rotation,
    RotationResult,
)

T = TypeVar("T")
# At most 3 parameters a row: 900 stays under the 999 that SQLite before 3.32 allows.
ROWS_PER_STATEMENT = 300
log = structlog.get_logger(__name__)

# Each entry moves the schema one version up (PRAGMA user_version); never edit one.
MIGRATIONS = (
    """
    CREATE TABLE callbacks (
        dlq_id TEXT PRIMARY KEY,
        body BLOB NOT NULL,
        received_at REAL NOT NULL
    );
    """,
    pipeline.SCHEMA,
    rotations.SCHEMA,
)


class SQLiteStore:
    """The Store of daemon.store over one SQLite file. Open it with `SQLiteStore.open`."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        *,
        observe_commit: Callable[[int], None] | None,
        max_pending: int,
        commit_timeout: float,
        read_timeout: float,
    ) -> None:
        self._connection = connection
        self._executor = executor
        self._observe_commit = observe_commit
        self._max_pending = max_pending
        self._commit_timeout = commit_timeout
        self._read_timeout = read_timeout
        self._pending: list[tuple[Callback, asyncio.Future[Added]]] = []
        self._wakeup = asyncio.Event()
        self._closing = False
        self._stalled = False  # a commit has run past commit_timeout and not returned yet

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        path: Path,
        *,
        observe_commit: Callable[[int], None] | None = None,
        busy_timeout: float = 5.0,
        commit_timeout: float = 10.0,
        read_timeout: float = 5.0,
        max_pending: int = 10_000,
        release_leases: bool = True,
    ) -> AsyncIterator[SQLiteStore]:
        """Open (creating and migrating if needed) the store at `path` for the block.

        `busy_timeout` is how long a write waits for another process's lock;
        `commit_timeout` how long a commit may take before its callers get StoreUnavailable
        (a caller may also wait for the commit before its own, so up to twice that),
        `read_timeout` how long for a read (reads queue behind commits on the one thread);
        `max_pending` how many callbacks may wait for a commit before new ones are refused.
        The daemon releases the fetch leases at open (one daemon per file); a command
        that opens the store beside it passes `release_leases=False`.
        """
        executor = ThreadPoolExecutor(1, thread_name_prefix="recoveryd-sqlite")
        loop = asyncio.get_running_loop()
        try:
            connection = await loop.run_in_executor(
                executor, _connect, path, busy_timeout, release_leases
            )
        except sqlite3.Error as exc:
            executor.shutdown()
            raise StoreUnavailable(f"cannot open the SQLite store {path}: {exc}") from None
        store = cls(
            connection,
            executor,
            observe_commit=observe_commit,
            max_pending=max_pending,
            commit_timeout=commit_timeout,
            read_timeout=read_timeout,
        )
        writer = asyncio.create_task(store._write_loop(), name="recoveryd-sqlite-writer")
        try:
            yield store
        finally:
            store._closing = True
            store._wakeup.set()
            # Commit whatever is still pending, within a deadline: a hung disk must not
            # hold up the shutdown for ever.
            done, _ = await asyncio.wait([writer], timeout=2 * commit_timeout)
            if done:
                await loop.run_in_executor(executor, connection.close)
            else:
                log.error("the store's last commit did not finish; stopping without it")
            executor.shutdown(wait=False)

    async def add_callback(self, callback: Callback) -> Added:
        if self._closing:  # also set when the writer has ended, however it ended
            raise StoreUnavailable("the store is shutting down")
        if len(self._pending) >= self._max_pending:
            raise StoreUnavailable("the store is behind; try again")
        if self._stalled:
            raise StoreUnavailable("the store is not committing; try again")
        outcome: asyncio.Future[Added] = asyncio.get_running_loop().create_future()
        self._pending.append((callback, outcome))
        self._wakeup.set()
        return await outcome

    async def get_callback(self, dlq_id: str) -> Callback | None:
        row = await self._run(
            lambda c: c.execute(
                "SELECT dlq_id, body, received_at FROM callbacks WHERE dlq_id = ?", (dlq_id,)
            ).fetchone()
        )
        return None if row is None else Callback(row[0], bytes(row[1]), row[2])

    async def inbox_depth(self) -> int:
        count: int = await self._run(
            lambda c: c.execute(
                "SELECT count(*) FROM callbacks WHERE state = 'received'"
            ).fetchone()[0]
        )
        return count

    async def ping(self) -> None:
        await self._run(lambda c: c.execute("SELECT 1").fetchone())

    # -- the pipeline's states (sqlite_pipeline.py has the statements) ---------------

    async def claim(self, owner: str, limit: int, lease: float, now: float) -> list[Claimed]:
        return await self._write(lambda c: pipeline.claim(c, owner, limit, lease, now))

    async def settle(self, owner: str, outcomes: list[Outcome], now: float) -> list[Pending]:
        return await self._write(lambda c: pipeline.settle(c, owner, outcomes, now))

    async def pending(self) -> list[Pending]:
        return await self._run(pipeline.pending)

    async def open_batch(
        self, action: str, overrides: str, dlq_ids: list[str], now: float
    ) -> BatchRecord | None:
        return await self._write(lambda c: pipeline.open_batch(c, action, overrides, dlq_ids, now))

    async def settle_batch(self, batch_id: int, **outcome: Any) -> None:
        await self._write(lambda c: pipeline.settle_batch(c, batch_id, **outcome))

    async def unsettled_batches(self) -> list[BatchRecord]:
        return await self._run(pipeline.unsettled_batches)

    async def sends(self, dlq_ids: list[str]) -> dict[str, int]:
        return await self._run(lambda c: pipeline.sends(c, dlq_ids))

    async def record(self, dlq_id: str) -> dict[str, Any] | None:
        return await self._run(lambda c: pipeline.record(c, dlq_id))

    async def status(self, now: float) -> dict[str, Any]:
        return await self._run(lambda c: pipeline.status(c, now))

    # -- token rotations (sqlite_rotations.py) ---------------------------------------

    async def begin_rotation(self, now: float) -> int | None:
        return await self._write(lambda c: rotations.begin(c, now))

    async def finish_rotation(
        self, rotation_id: int, result: RotationResult, reason: str | None, now: float
    ) -> None:
        await self._write(lambda c: rotations.finish(c, rotation_id, result, reason, now))

    async def resolve_lockout(self, now: float) -> None:
        await self._write(lambda c: rotations.resolve_lockout(c, now))

    async def latest_rotation(self) -> Rotation | None:
        return await self._run(rotations.latest)

    async def last_rotation_success(self) -> float | None:
        return await self._run(rotations.last_success_at)

    async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` in one transaction, on the store's thread, within commit_timeout."""

        def transaction(connection: sqlite3.Connection) -> T:
            with _transaction(connection):
                return work(connection)

        return await self._run(transaction, seconds=self._commit_timeout)

    async def _run(
        self, query: Callable[[sqlite3.Connection], T], *, seconds: float | None = None
    ) -> T:
        loop = asyncio.get_running_loop()
        try:
            job = loop.run_in_executor(self._executor, query, self._connection)
            return await asyncio.wait_for(job, seconds or self._read_timeout)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the store did not answer: {exc}") from None
        except TimeoutError:
            raise StoreUnavailable("the store did not answer in time") from None

    async def _write_loop(self) -> None:
        # Whatever arrived while a commit was being flushed is the next batch.
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    continue
                batch, self._pending = self._pending, []
                await self._commit(batch)
        finally:  # however the writer ends, nobody may be left waiting on it
            self._closing = True
            self._fail(self._pending, StoreUnavailable("the store is shutting down"))

    async def _commit(self, batch: list[tuple[Callback, asyncio.Future[Added]]]) -> None:
        loop = asyncio.get_running_loop()
        # One timer per commit, not one per request (that was a tenth of the hot path).
        timer = loop.call_later(self._commit_timeout, self._stall, batch)
        try:
            outcomes = await loop.run_in_executor(
                self._executor, self._insert, [callback for callback, _ in batch]
            )
        except Exception as exc:  # every waiter must hear, whatever went wrong
            log.error("store commit failed", error=str(exc), callbacks=len(batch))
            self._fail(batch, StoreUnavailable(f"the store could not commit: {exc}"))
            return
        finally:
            timer.cancel()
            self._stalled = False
        for (_, waiter), outcome in zip(batch, outcomes, strict=True):
            if not waiter.done():
                waiter.set_result(outcome)
        if self._observe_commit is not None:
            with contextlib.suppress(Exception):  # a metric must not stop the writer
                self._observe_commit(len(batch))

    @staticmethod
    def _fail(waiting: list[tuple[Callback, asyncio.Future[Added]]], error: Exception) -> None:
        for _, waiter in waiting:
            if not waiter.done():  # done: its caller already heard (see _stall)
                waiter.set_exception(error)

    def _stall(self, batch: list[tuple[Callback, asyncio.Future[Added]]]) -> None:
        """The commit is past commit_timeout (a lock held elsewhere, a stalled disk): tell
        its callers and those queued behind it, and refuse new callbacks until it returns.
        Their callbacks are still written if the store recovers, and the service's retry
        of one then finds a duplicate; if not, the retry stores it. Either way nothing is
        lost or stored twice."""
        self._stalled = True
        self._fail([*batch, *self._pending], StoreUnavailable("the store did not commit in time"))

    def _insert(self, callbacks: list[Callback]) -> list[Added]:
        """One transaction for the whole batch (runs on the store's thread).

        A few statements per batch, not one per row: each SQLite step releases and
        retakes the GIL, and every retake waits on the busy event loop. Duplicates are
        found with one SELECT inside the write transaction, so no other writer can slip
        in between it and the INSERT.
        """
        outcomes: list[Added] = []
        new: dict[str, Callback] = {}
        with _transaction(self._connection) as connection:
            for start in range(0, len(callbacks), ROWS_PER_STATEMENT):
                chunk = callbacks[start : start + ROWS_PER_STATEMENT]
                marks = ", ".join("?" * len(chunk))
                known = {
                    dlq_id
                    for (dlq_id,) in connection.execute(
                        f"SELECT dlq_id FROM callbacks WHERE dlq_id IN ({marks})",
                        [callback.dlq_id for callback in chunk],
                    )
                }
                for callback in chunk:
                    fresh = callback.dlq_id not in known and callback.dlq_id not in new
                    if fresh:
                        new[callback.dlq_id] = callback
                    outcomes.append("accepted" if fresh else "duplicate")
            rows = list(new.values())
            for start in range(0, len(rows), ROWS_PER_STATEMENT):
                chunk = rows[start : start + ROWS_PER_STATEMENT]
                values = ", ".join(["(?, ?, ?)"] * len(chunk))
                connection.execute(
                    f"INSERT INTO callbacks (dlq_id, body, received_at) VALUES {values}",
                    [field for row in chunk for field in (row.dlq_id, row.body, row.received_at)],
                )
        return outcomes


@contextlib.contextmanager
def _transaction(connection: sqlite3.Connection) -> Any:
    # IMMEDIATE takes the write lock up front, so a busy database fails here, not mid-way.
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
        connection.execute("COMMIT")
    except BaseException:
        # SQLite has already rolled back after some errors (disk full, I/O): a second
        # ROLLBACK would fail and hide the real error; none at all would leave the lock held.
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _connect(path: Path, busy_timeout: float, release_leases: bool) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN/COMMIT above), never implicit.
    connection = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit in WAL mode is flushed to disk before it returns; NORMAL would
        # survive a process crash but could lose the last commits on power loss.
        connection.execute("PRAGMA synchronous = FULL")
        _migrate(connection)
        if release_leases:
            with _transaction(connection):
                pipeline.release_leases(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _migrate(connection: sqlite3.Connection) -> None:
    with _transaction(connection):
        version: int = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise sqlite3.DatabaseError(
                f"schema version {version} is newer than this recoveryd ({len(MIGRATIONS)})"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in filter(str.strip, script.split(";")):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {number}")
