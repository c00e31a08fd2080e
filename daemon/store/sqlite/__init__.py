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

from daemon.store import Added, Callback, StoreMissing, StoreUnavailable, Unshared
from daemon.store.group_commit import GroupCommit
from daemon.store.records import (
    BatchRecord,
    Claimed,
    LearnedRate,
    NotificationJob,
    NotificationResult,
    Outcome,
    Pending,
    Replica,
    Rotation,
    RotationResult,
    Settled,
    check_final,
)
from daemon.store.removals import Removal, RemovalResult
from daemon.store.sqlite import endpoints as endpoints
from daemon.store.sqlite import health as health
from daemon.store.sqlite import lineage as lineage
from daemon.store.sqlite import notify as notify
from daemon.store.sqlite import pipeline as pipeline
from daemon.store.sqlite import rate as rate
from daemon.store.sqlite import retention as retention
from daemon.store.sqlite import rotations as rotations
from daemon.store.sqlite import sweeps as sweeps
from daemon.store.sweep_records import PageOutcome, SweepResult, SweepRun

T = TypeVar("T")
# At most 5 parameters a row: 995 stays under the 999 that SQLite before 3.32 allows.
ROWS_PER_STATEMENT = 199
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
)


class SQLiteStore:
    """The Store of daemon.store over one SQLite file. Open it with `SQLiteStore.open`."""

    shared = False

    def __init__(
        self,
        connection: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        path: Path,
        *,
        observe_commit: Callable[[int], None] | None,
        max_pending: int,
        commit_timeout: float,
        read_timeout: float,
    ) -> None:
        self._connection = connection
        self._executor = executor
        self._path = path
        self._commit_timeout = commit_timeout
        self._read_timeout = read_timeout
        self._health = health.Health(path)
        self._callbacks = GroupCommit(
            self._insert_on_thread,
            failed=self._commit_failed,
            committed=self._committed,
            observe_commit=observe_commit,
            max_pending=max_pending,
            commit_timeout=commit_timeout,
        )

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
        store._callbacks.start()
        watcher = asyncio.create_task(store._watch(health_interval), name="recoveryd-sqlite-health")
        try:
            yield store
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            finished = await store._callbacks.close()
            # Closed on its own thread, after any work still queued there: at once after
            # the last commit, or once a hung one ends (the shutdown does not wait for it).
            # Never left to the garbage collector, which Python 3.13 warns of.
            closed = executor.submit(connection.close)
            if finished:
                await asyncio.wrap_future(closed)
            executor.shutdown(wait=False)

    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        if not self._callbacks.closing and (problems := self._health.problems()):
            # Refused, not queued: the commit would fail or land in a file that is gone.
            raise StoreUnavailable("; ".join(problems))
        return self._callbacks.add(callback)

    async def get_callback(self, dlq_id: str) -> Callback | None:
        row = await self._run(
            lambda c: c.execute(
                "SELECT dlq_id, body, received_at, verified FROM callbacks WHERE dlq_id = ?",
                (dlq_id,),
            ).fetchone()
        )
        return None if row is None else Callback(row[0], bytes(row[1]), row[2], bool(row[3]))

    async def inbox_depth(self) -> int:
        return await self._run(pipeline.inbox_depth)

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

    # -- the pipeline's states (sqlite/pipeline.py has the statements) ---------------

    async def claim(
        self, owner: str, limit: int, lease: float, now: float, *, bodies: bool = False
    ) -> list[Claimed]:
        return await self._write(lambda c: pipeline.claim(c, owner, limit, lease, now, bodies))

    async def settle(self, owner: str, outcomes: list[Outcome], now: float) -> Settled:
        return await self._write(lambda c: pipeline.settle(c, owner, outcomes, now))

    async def retry_now(self, now: float, limit: int | None = None) -> int:
        return await self._write(lambda c: pipeline.retry_now(c, now, limit))

    # An SQLite store serves one daemon: `owner` has no other replica to be told from.

    async def pending(self, owner: str | None = None) -> list[Pending]:
        return await self._run(pipeline.pending)

    async def open_batch(
        self, action: str, overrides: str, dlq_ids: list[str], now: float, owner: str | None = None
    ) -> BatchRecord | None:
        return await self._write(lambda c: pipeline.open_batch(c, action, overrides, dlq_ids, now))

    async def mark_sending(self, batch_id: int, now: float, owner: str | None = None) -> bool:
        return await self._write(lambda c: pipeline.mark_sending(c, batch_id, now))

    async def settle_batch(
        self,
        batch_id: int,
        *,
        done: Sequence[str] = (),
        again: Sequence[str] = (),
        failed: Sequence[str] = (),
        gone: Sequence[str] = (),
        reason: str | None = None,
        runs: Sequence[dict[str, Any]] = (),
        calls: Sequence[dict[str, Any]] = (),
        sent: bool,
        now: float,
    ) -> Settled:
        def settle(connection: sqlite3.Connection) -> Settled:
            return pipeline.settle_batch(
                connection, batch_id, done=done, again=again, failed=failed, gone=gone,
                reason=reason, runs=runs, calls=calls, sent=sent, now=now,
            )  # fmt: skip

        return await self._write(settle)

    async def unsettled_batches(self, owner: str | None = None) -> list[BatchRecord]:
        return await self._run(pipeline.unsettled_batches)

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

    async def sends(self, dlq_ids: list[str]) -> dict[str, int]:
        return await self._run(lambda c: pipeline.sends(c, dlq_ids))

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

    async def redrive(
        self,
        *,
        states: Sequence[str] = ("failed",),
        rule: str | None = None,
        since: float | None = None,
        now: float,
        apply: bool,
    ) -> list[str]:
        check_final(states)  # ValueError now, not from the store's thread
        work = lambda c: pipeline.redrive(c, states, rule, since, now, apply)  # noqa: E731
        return await (self._write(work) if apply else self._run(work))

    # -- notifications (sqlite/notify.py) --------------------------------------------

    async def due_notifications(
        self, now: float, limit: int, skip_receivers: Sequence[str] = ()
    ) -> list[NotificationJob]:
        return await self._run(lambda c: notify.due(c, now, limit, skip_receivers))

    async def begin_notification_attempt(
        self, notification_id: int, now: float, retry_at: float
    ) -> int | None:
        return await self._write(lambda c: notify.begin_attempt(c, notification_id, now, retry_at))

    async def finish_notification_attempt(
        self,
        notification_id: int,
        result: NotificationResult,
        *,
        status: int | None,
        reason: str,
        next_at: float | None,
        now: float,
    ) -> bool:
        def finish(connection: sqlite3.Connection) -> bool:
            return notify.finish_attempt(
                connection, notification_id, result, status=status, reason=reason,
                next_at=next_at, now=now,
            )  # fmt: skip

        return await self._write(finish)

    # -- retention (sqlite/retention.py) ---------------------------------------------

    async def prune(self, *, before: float, now: float, dedup_for: float, chunk: int = 200) -> int:
        """Delete the records final since before `before` (and the batches of none but
        them), `chunk` to a transaction so that a commit of callbacks waits for one chunk
        at most, keeping a key of each for `dedup_for` seconds; forget the keys kept long
        enough. How many records were deleted."""
        until = now + dedup_for
        pruned = 0
        while True:
            # Each chunk is one job for the thread: what queued meanwhile (a commit of
            # callbacks) runs before the next one.
            deleted = await self._write(
                lambda c: retention.prune_chunk(c, before=before, until=until, chunk=chunk)
            )
            pruned += deleted
            await self._run(retention.release_space, seconds=self._commit_timeout)
            if deleted < chunk:
                break
        while await self._write(lambda c: retention.expire_chunk(c, now=now, chunk=chunk)):
            pass
        await self._run(retention.checkpoint, seconds=self._commit_timeout)
        return pruned

    # -- token rotations (sqlite/rotations.py) ---------------------------------------

    async def begin_rotation(self, now: float) -> int | None:
        return await self._write(lambda c: rotations.begin(c, now))

    async def finish_rotation(
        self, rotation_id: int, result: RotationResult, reason: str | None, now: float
    ) -> None:
        await self._write(lambda c: rotations.finish(c, rotation_id, result, reason, now))

    async def resolve_lockout(self, now: float) -> None:
        await self._write(lambda c: rotations.resolve_lockout(c, now))

    async def unless_rotating(self, write: Callable[[], None]) -> bool:
        # On the store's thread, inside its write lock: another process's rotation waits.
        return await self._write(lambda c: rotations.unless_rotating(c, write))

    async def latest_rotation(self) -> Rotation | None:
        return await self._run(rotations.latest)

    async def last_rotation_success(self) -> float | None:
        return await self._run(rotations.last_success_at)

    async def last_rotation_failure(self) -> float | None:
        return await self._run(rotations.last_failure_at)

    # -- the account's learned rate limit (sqlite/rate.py) ---------------------------

    async def learned_rate(self) -> LearnedRate | None:
        return await self._run(rate.load)

    async def save_learned_rate(self, learned: LearnedRate) -> None:
        await self._write(lambda c: rate.save(c, learned))

    # -- sweep runs (sqlite/sweeps.py) -------------------------------------------------

    async def begin_sweep_run(
        self,
        sweep: str,
        *,
        action: str,
        dry_run: bool,
        filter: dict[str, Any],
        overrides: dict[str, Any] | None,
        max_per_run: int,
        now: float,
    ) -> int | None:
        def begin(connection: sqlite3.Connection) -> int | None:
            return sweeps.begin_run(
                connection, sweep, action=action, dry_run=dry_run, filter=filter,
                overrides=overrides, max_per_run=max_per_run, now=now,
            )  # fmt: skip

        return await self._write(begin)

    async def begin_sweep_page(
        self, run_id: int, page: int, *, count: int, cursor: str | None, now: float
    ) -> None:
        await self._write(
            lambda c: sweeps.begin_page(c, run_id, page, count=count, cursor=cursor, now=now)
        )

    async def settle_sweep_page(
        self,
        run_id: int,
        page: int,
        *,
        outcome: PageOutcome,
        items: Sequence[dict[str, Any]] = (),
        next_cursor: str | None = None,
        error: str | None = None,
        now: float,
    ) -> None:
        def settle(connection: sqlite3.Connection) -> None:
            sweeps.settle_page(
                connection, run_id, page, outcome=outcome, items=items,
                next_cursor=next_cursor, error=error, now=now,
            )  # fmt: skip

        await self._write(settle)

    async def finish_sweep_run(
        self, run_id: int, result: SweepResult, error: str | None, now: float
    ) -> None:
        await self._write(lambda c: sweeps.finish_run(c, run_id, result, error, now))

    async def close_interrupted_sweep_runs(
        self, now: float, sweep: str | None = None
    ) -> list[SweepRun]:
        return await self._write(lambda c: sweeps.close_interrupted(c, now, sweep))

    async def sweep_runs(self, sweep: str, limit: int) -> list[SweepRun]:
        return await self._run(lambda c: sweeps.runs(c, sweep, limit))

    async def last_sweep_successes(self) -> dict[str, float]:
        return await self._run(sweeps.last_successes)

    # -- endpoint removals (sqlite/endpoints.py; failures are counted by settle) ------

    async def removals_due(self, now: float) -> list[Removal]:
        return await self._run(lambda c: endpoints.due(c, now))

    async def defer_removal(
        self,
        removal_id: int,
        *,
        reason: str,
        retry_at: float,
        tried: bool = True,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> None:
        await self._write(lambda c: endpoints.defer(
            c, removal_id, reason=reason, retry_at=retry_at, tried=tried, calls=calls,
            now=now))  # fmt: skip

    async def intend_removal(
        self,
        removal_id: int,
        *,
        name: str | None,
        url: str | None,
        max_per_hour: int,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> Removal | None:
        return await self._write(lambda c: endpoints.intend(
            c, removal_id, name=name, url=url, max_per_hour=max_per_hour, calls=calls,
            now=now))  # fmt: skip

    async def finish_removal(
        self,
        removal_id: int,
        result: RemovalResult,
        reason: str,
        *,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> bool:
        return await self._write(
            lambda c: endpoints.finish(c, removal_id, result, reason, calls=calls, now=now)
        )

    async def removals(self, group: str | None = None) -> list[dict[str, Any]]:
        return await self._run(lambda c: endpoints.listed(c, group))

    async def begin_restore(self, group: str, name: str, now: float) -> Removal:
        return await self._write(lambda c: endpoints.begin_restore(c, group, name, now))

    async def finish_restore(
        self,
        removal_id: int,
        *,
        restored: bool,
        reason: str,
        calls: Sequence[dict[str, Any]],
        now: float,
    ) -> None:
        await self._write(lambda c: endpoints.finish_restore(
            c, removal_id, restored=restored, reason=reason, calls=calls, now=now))  # fmt: skip

    async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` in one transaction, on the store's thread, within commit_timeout.
        Refused while the files are deleted or replaced: the write would land in a file
        nothing opens again, and the pipeline must not act on what it cannot record."""
        if self._health.has("database", "wal"):
            raise StoreUnavailable("; ".join(self._health.problems()))

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

    async def _insert_on_thread(self, callbacks: list[Callback]) -> list[Added]:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._insert, callbacks
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

    def _insert(self, callbacks: list[Callback]) -> list[Added]:
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
    values = ", ".join(["(?, ?, ?, ?, ?)"] * len(rows))
    cursor = connection.execute(
        "INSERT INTO callbacks (dlq_id, body, received_at, verified) "
        f"SELECT column1, column2, column3, column4 FROM (VALUES {values}) AS new "
        "WHERE NOT EXISTS (SELECT 1 FROM pruned WHERE key = new.column5) "
        "ON CONFLICT (dlq_id) DO NOTHING",
        [
            field
            for row in rows
            for field in (
                row.dlq_id, row.body, row.received_at, row.verified, retention.dedup_key(row.dlq_id)
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
        # can then be given back to the file system (sqlite_retention.release_space).
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
