"""The embedded store: one SQLite file in WAL mode, callbacks written with group commit
(group_commit.py). SQLite calls run on a single dedicated thread, which owns the
connection.

The store watches its own health (sqlite/health.py) and keeps itself small
(sqlite/retention.py); the statements of the pipeline are in sqlite/pipeline.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog

from daemon.store.facade import Facade
from daemon.store.interface import Added, Callback, StoreMissing, StoreUnavailable, Unshared
from daemon.store.listing import listed_fields
from daemon.store.records import Replica, dedup_key
from daemon.store.sqlite import endpoints as endpoints
from daemon.store.sqlite import health as health
from daemon.store.sqlite import lineage as lineage
from daemon.store.sqlite import listing as listing
from daemon.store.sqlite import notify as notify
from daemon.store.sqlite import pipeline as pipeline
from daemon.store.sqlite import rate as rate
from daemon.store.sqlite import replay as replay
from daemon.store.sqlite import retention as retention
from daemon.store.sqlite import rotations as rotations
from daemon.store.sqlite import sweeps as sweeps

T = TypeVar("T")
# At most 9 parameters a row: 990 stays under the 999 that SQLite before 3.32 allows.
ROWS_PER_STATEMENT = 110
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
CACHE_KIB = 64 * 1024  # the pages of the indexes that ingest and claims walk stay in memory
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
    pipeline.SENT_AT,
    pipeline.INDEXES,
    pipeline.COUNTS,
    retention.SCHEMA,
    health.SCHEMA,
    lineage.SCHEMA,
    notify.SCHEMA,
    sweeps.SCHEMA,
    endpoints.SCHEMA,
    lineage.RUN_INDEX_DROPPED,
    pipeline.VERIFIED,
    pipeline.REFUSALS,
    pipeline.WAITS_FOR_SERVICE,
    rate.SCHEMA,
    listing.SCHEMA,
    replay.SCHEMA,
)


class SQLiteStore(Facade):
    """The Store of daemon.store over one SQLite file. Open it with `SQLiteStore.open`."""

    shared = False
    _pipeline, _notify, _retention, _rotations = pipeline, notify, retention, rotations
    _rate, _sweeps, _endpoints, _listing = rate, sweeps, endpoints, listing
    _replay = replay

    def __init__(
        self,
        connection: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        path: Path,
        **options: Any,
    ) -> None:
        self._connection = connection
        self._executor = executor
        self._path = path
        self._health = health.Health(path)
        super().__init__(**options)

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
        health_interval: float = 1.0,
        max_page_count: int | None = None,
        create: bool = True,
    ) -> AsyncIterator[SQLiteStore]:
        """Open (creating and migrating if needed) the store at `path` for the block;
        with `create` false, a file that does not exist, or holds no recoveryd schema, is
        StoreMissing and left as it is.

        `busy_timeout` is how long a write waits for another process's lock;
        `commit_timeout` how long a commit may take before its callers get StoreUnavailable
        (a caller may also wait for the commit before its own, so up to twice that),
        `read_timeout` how long for a read (reads queue behind commits on the one thread);
        `max_pending` how many callbacks may wait for a commit before new ones are refused.
        The daemon releases the fetch leases at open (one daemon per file); a command
        that opens the store beside it passes `release_leases=False`.
        Every `health_interval` seconds the store checks that its files are still those
        it opened and, while a write problem holds, tries a small write (see `problems`).
        `max_page_count` caps the file (PRAGMA max_page_count): past it, writes fail as on
        a full disk.
        """
        executor = ThreadPoolExecutor(1, thread_name_prefix="recoveryd-sqlite")
        loop = asyncio.get_running_loop()
        try:
            connection = await loop.run_in_executor(
                executor, _connect, path, busy_timeout, release_leases, max_page_count, create
            )
        except sqlite3.Error as exc:
            executor.shutdown()
            raise StoreUnavailable(f"cannot open the SQLite store {path}: {exc}") from None
        except StoreMissing:
            executor.shutdown()
            raise
        store = cls(
            connection,
            executor,
            path,
            observe_commit=observe_commit,
            max_pending=max_pending,
            commit_timeout=commit_timeout,
            read_timeout=read_timeout,
        )
        store._health.remember_files()
        async with store._running(health_interval, "recoveryd-sqlite-health"):
            yield store

    async def _close(self, *, finished: bool) -> None:
        # Closed on its own thread, after any work still queued there: at once after the
        # last commit, or once a hung one ends (the shutdown does not wait for it). Never
        # left to the garbage collector, which Python 3.13 warns of.
        closed = self._executor.submit(self._connection.close)
        if finished:
            await asyncio.wrap_future(closed)
        self._executor.shutdown(wait=False)

    async def ping(self) -> None:
        if problems := self._health.problems():
            raise StoreUnavailable("; ".join(problems))
        await self._run(lambda c: c.execute("SELECT 1").fetchone())

    def problems(self) -> list[str]:
        """What is wrong with the store now (files deleted or replaced, full, unwritable),
        one sentence each; empty when nothing is. Cheap: no I/O."""
        return self._health.problems()

    async def size_bytes(self) -> int:
        """The database and its write-ahead log on disk, in bytes."""

        def size() -> int:
            total = 0
            for suffix in ("", "-wal"):
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(f"{self._path}{suffix}").st_size
            return total

        return await asyncio.to_thread(size)

    async def record(self, dlq_id: str) -> dict[str, Any] | None:
        def read(connection: sqlite3.Connection) -> dict[str, Any] | None:
            found = pipeline.record(connection, dlq_id)
            if found is not None:
                found["notifications"] = notify.of_dlq_id(connection, dlq_id)
            return found

        return await self._run(read)

    async def status(self, now: float) -> dict[str, Any]:
        def read(connection: sqlite3.Connection) -> dict[str, Any]:
            pending = notify.pending_count(connection)
            return {**pipeline.status(connection, now), "notifications": {"pending": pending}}

        return await self._run(read)

    # An SQLite store serves one daemon: no other replica to tell it from, or to share with.

    async def heartbeat(self, replica: str, lease: float, now: float) -> list[str]:
        return []

    async def leave(self, replica: str) -> None:
        return None

    async def replicas(self, now: float) -> list[Replica]:
        return []

    def singleton_lock(self, replica: str | None = None) -> Unshared:
        return Unshared()

    async def singleton_holder(self) -> str | None:
        return None

    async def _read(self, work: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await self._run(lambda c: work(c, *args, **kwargs))

    async def _write(self, work: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`work` in one transaction, on the store's thread, within commit_timeout.
        Refused while the files are deleted or replaced: the write would land in a file
        nothing opens again, and the pipeline must not act on what it cannot record."""
        if self._health.has("database", "wal"):
            raise StoreUnavailable("; ".join(self._health.problems()))

        def transaction(connection: sqlite3.Connection) -> T:
            with _transaction(connection):
                return work(connection, *args, **kwargs)

        return await self._run(transaction, seconds=self._commit_timeout)

    # One daemon has the store: there is no replica gone whose work to take over.
    _adopting = _read

    async def _pruned_chunk(self) -> None:
        # The pages freed go back to the file system, a chunk at a time.
        await self._run(retention.release_space, seconds=self._commit_timeout)

    async def _pruned(self) -> None:
        await self._run(retention.checkpoint, seconds=self._commit_timeout)

    async def _run(
        self, query: Callable[[sqlite3.Connection], T], *, seconds: float | None = None
    ) -> T:
        loop = asyncio.get_running_loop()
        try:
            job = loop.run_in_executor(self._executor, query, self._connection)
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes as
            # the read finishes, and a poll loop cancelled then would run on for ever.
            async with asyncio.timeout(seconds or self._read_timeout):
                return await job
        except sqlite3.Error as exc:
            self._health.failed(exc, what="store operation failed")
            raise StoreUnavailable(f"the store did not answer: {exc}") from None
        except TimeoutError:
            raise StoreUnavailable("the store did not answer in time") from None

    async def _watch(self, interval: float) -> None:
        """The health timer: are the files still ours; is a write problem over?"""
        while True:
            await asyncio.sleep(interval)
            try:
                found = await asyncio.to_thread(self._health.files_now)
                self._health.compare_files(found)
                if self._health.has(*health.WRITE_PROBLEMS):
                    await self._write(health.probe)
                    self._health.wrote()
            except StoreUnavailable:
                pass  # the problem holds; _run has seen to it
            except Exception as exc:  # the watch must go on, whatever one round hit
                self._health.failed(exc, what="store health check failed")

    async def _insert(self, callbacks: list[Callback]) -> list[Added]:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._insert_now, callbacks
        )

    def _commit_failed(self, exc: Exception) -> StoreUnavailable:
        if isinstance(exc, health.FilesMoved):
            self._health.compare_files(exc.found)  # the problem, said once
            return StoreUnavailable("; ".join(self._health.problems()))
        # Logged once a minute at most, or once as a problem: a full disk fails every
        # commit, and a line each flooded the log.
        self._health.failed(exc, what="store commit failed")
        return StoreUnavailable(f"the store could not commit: {exc}")

    def _committed(self, outcomes: list[Added]) -> None:
        if "accepted" in outcomes:
            self._health.wrote()

    def _insert_now(self, callbacks: list[Callback]) -> list[Added]:
        """Commit a batch (runs on the store's thread); for each callback, whether it
        was new. A dlqId pruned by retention is a duplicate too, and so is one repeated
        within the batch.

        As few SQLite calls as can be: each releases the GIL and must take it back from
        the busy event loop. So a batch is one INSERT, committed by SQLite within its one
        step (autocommit; synchronous=FULL): ON CONFLICT skips the dlqIds with a record,
        NOT EXISTS the pruned ones. Only a batch too large for one statement takes an
        explicit transaction around several.
        """
        first: dict[str, Callback] = {}
        for callback in callbacks:
            first.setdefault(callback.dlq_id, callback)
        rows = list(first.values())
        connection = self._connection
        self._health.ensure_files()  # the files are still those opened, or nothing is written
        chunks = [
            rows[at : at + ROWS_PER_STATEMENT] for at in range(0, len(rows), ROWS_PER_STATEMENT)
        ]
        inserted: set[str] = set()
        with _transaction(connection) if len(chunks) > 1 else contextlib.nullcontext():
            for chunk in chunks:
                inserted |= insert_new_callbacks(connection, chunk)
        outcomes: list[Added] = []
        for callback in callbacks:
            fresh = callback.dlq_id in inserted and first[callback.dlq_id] is callback
            outcomes.append("accepted" if fresh else "duplicate")
        return outcomes


def insert_new_callbacks(connection: sqlite3.Connection, rows: Sequence[Callback]) -> set[str]:
    """Insert those of `rows` (distinct dlqIds) that have no record and were not pruned;
    their dlqIds."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(rows))
    cursor = connection.execute(
        "INSERT INTO callbacks "
        "(dlq_id, body, received_at, verified, url, url_group, endpoint, status) "
        "SELECT column1, column2, column3, column4, column6, column7, column8, column9 "
        f"FROM (VALUES {values}) AS new "
        "WHERE NOT EXISTS (SELECT 1 FROM pruned WHERE key = new.column5) "
        "ON CONFLICT (dlq_id) DO NOTHING",
        [
            field
            for row in rows
            for field in (
                row.dlq_id, row.body, row.received_at, row.verified, dedup_key(row.dlq_id),
                *(row.listed or listed_fields(row.body)),
            )
        ],
    )  # fmt: skip
    if cursor.rowcount == len(rows):  # the usual case: all were new
        return {row.dlq_id for row in rows}
    if cursor.rowcount == 0:
        return set()
    # Some were not: the statement's rows are the last it inserted. A rowid table without
    # AUTOINCREMENT gives each new row the largest rowid plus one, so they are consecutive.
    last: int = cursor.lastrowid  # type: ignore[assignment]  # set: rows went in
    return {
        dlq_id
        for (dlq_id,) in connection.execute(
            "SELECT dlq_id FROM callbacks WHERE rowid > ? AND rowid <= ?",
            (last - cursor.rowcount, last),
        )
    }


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


def _connect(
    path: Path,
    busy_timeout: float,
    release_leases: bool,
    max_page_count: int | None,
    create: bool = True,
) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN/COMMIT above), never implicit.
    if create:
        connection = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout)
    else:
        connection = _existing(path, busy_timeout)
    try:
        # Only a new file takes it (before its first table): pages that retention frees
        # can then be given back to the file system (retention.py, release_space).
        connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
        connection.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit in WAL mode is flushed to disk before it returns; NORMAL would
        # survive a process crash but could lose the last commits on power loss.
        connection.execute("PRAGMA synchronous = FULL")
        # The WAL keeps the size of its largest burst (a pruning pass) unless told to
        # shrink back after a checkpoint.
        connection.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        connection.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        if max_page_count is not None:
            connection.execute(f"PRAGMA max_page_count = {int(max_page_count)}").fetchone()
        _migrate(connection)
        if release_leases:
            with _transaction(connection):
                pipeline.release_leases(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _existing(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A connection to the store at `path`, which must be one already: opened read-write
    without create (`mode=rw`), and let go untouched (no pragma written, no migration)
    unless a migration has made it a store."""
    shown = str(path) if path.is_absolute() else os.path.join(".", path)
    uri = f"{path.absolute().as_uri()}?mode=rw"
    try:
        connection = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_timeout)
    except sqlite3.OperationalError:
        if not path.exists():
            raise StoreMissing(f"no store at {shown}") from None
        raise
    try:
        version: int = connection.execute("PRAGMA user_version").fetchone()[0]
    except BaseException:
        connection.close()
        raise
    if version == 0:
        connection.close()
        raise StoreMissing(f"{shown} is not a recoveryd store")
    return connection


def _migrate(connection: sqlite3.Connection) -> None:
    with _transaction(connection):
        version: int = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise sqlite3.DatabaseError(
                f"schema version {version} is newer than this recoveryd ({len(MIGRATIONS)})"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in _statements(script):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {number}")


def _statements(script: str) -> list[str]:
    """The statements of `script`, split at the `;` that end one (a trigger's body holds
    some that do not)."""
    statements, current = [], ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            statements.append(current)
            current = ""
    if current.strip(" \n;"):
        raise ValueError(f"an incomplete statement ends a migration: {current!r}")
    return statements
