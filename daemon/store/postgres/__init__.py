"""The PostgreSQL store: the same interface as the SQLite one, over a connection pool, for
running several replicas on one database (`RECOVERYD_STORE=postgresql://...`).

Callbacks are written with group commit (group_commit.py), in one `INSERT ... ON CONFLICT
DO NOTHING` a batch, so two replicas given the same dlqId store it once. The schema is
migrated at start under an advisory lock (schema.py). The statements are in modules of
their own, one a part of the pipeline, as for SQLite: pipeline.py (leases, outcomes,
batches, records), notify.py, retention.py, rotations.py, sweeps.py, endpoints.py.

A connection that fails (the server down, restarting, unreachable) makes the store
unavailable, named in `problems()`, until a query goes through again; a health timer
tries one every `health_interval` while the problem holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Self, TypeVar

import psycopg
import psycopg_pool
import structlog

from daemon.foundation.urls import without_credentials
from daemon.store import Added, Callback, StoreMissing, StoreUnavailable
from daemon.store.group_commit import GroupCommit
from daemon.store.postgres import (
    endpoints,
    notify,
    pipeline,
    rate,
    retention,
    rotations,
    singleton,
    sweeps,
)
from daemon.store.postgres import replicas as members
from daemon.store.postgres.db import Connection
from daemon.store.postgres.schema import MIGRATION_LOCK, MIGRATIONS
from daemon.store.postgres.singleton import AdvisoryLock
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
from daemon.store.sqlite.retention import dedup_key
from daemon.store.sweep_records import PageOutcome, SweepResult, SweepRun

T = TypeVar("T")
log = structlog.get_logger(__name__)


class PostgresStore:
    """The Store of daemon.store over PostgreSQL. Open it with `PostgresStore.open`."""

    shared = True

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Connection],
        url: str,
        shown_url: str,
        *,
        observe_commit: Callable[[int], None] | None,
        max_pending: int,
        commit_timeout: float,
        read_timeout: float,
    ) -> None:
        self._pool = pool
        self._url = url
        self._shown_url = shown_url
        self._commit_timeout = commit_timeout
        self._read_timeout = read_timeout
        self._problem: str | None = None
        self._callbacks = GroupCommit(
            self._insert,
            failed=self._commit_failed,
            observe_commit=observe_commit,
            max_pending=max_pending,
            commit_timeout=commit_timeout,
        )

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        url: str,
        *,
        observe_commit: Callable[[int], None] | None = None,
        commit_timeout: float = 10.0,
        read_timeout: float = 5.0,
        connect_timeout: float = 10.0,
        max_pending: int = 10_000,
        pool_size: int = 10,
        health_interval: float = 1.0,
        create: bool = True,
    ) -> AsyncIterator[PostgresStore]:
        """Open the store at `url` for the block, creating or migrating its schema; with
        `create` false, a database without recoveryd's schema is StoreMissing, and left
        as it is.

        `commit_timeout` is how long a write (waiting for a connection included) may take
        before its callers get StoreUnavailable, `read_timeout` how long a read;
        `connect_timeout` how long the first connection may take; `pool_size` how many
        connections at most. Leases are not released at open, as the SQLite store does:
        other replicas may hold them; a crashed replica's expire.
        """
        shown = without_credentials(url)
        connection_class = _remembering()
        pool: psycopg_pool.AsyncConnectionPool[Connection] = psycopg_pool.AsyncConnectionPool(
            url,
            connection_class=connection_class,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=commit_timeout,
            name="recoveryd",
            # Transactions are explicit (`connection.transaction()`), never implicit.
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout))},
        )
        try:
            await pool.open(wait=True, timeout=connect_timeout)
            async with pool.connection() as connection:
                await _migrate(connection, create, shown)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await pool.close()
            if not isinstance(exc, psycopg_pool.PoolTimeout):
                said = _said(exc)
            elif connection_class.error is not None:
                said = _said(connection_class.error)
            else:  # no try of the pool's ended, even as it closed
                said = f"no answer within {connect_timeout:g} s"
            raise StoreUnavailable(f"cannot open the PostgreSQL store {shown}: {said}") from None
        except StoreMissing:
            await pool.close()
            raise
        store = cls(
            pool,
            url,
            shown,
            observe_commit=observe_commit,
            max_pending=max_pending,
            commit_timeout=commit_timeout,
            read_timeout=read_timeout,
        )
        store._callbacks.start()
        watcher = asyncio.create_task(store._watch(health_interval), name="recoveryd-pg-health")
        try:
            yield store
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await store._callbacks.close()
            await pool.close()

    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        if self._problem is not None and not self._callbacks.closing:
            # Refused at once while the server is away, not queued to time out: the
            # service retries; the health timer clears the problem once it is back.
            raise StoreUnavailable(self._problem)
        return self._callbacks.add(callback)

    async def get_callback(self, dlq_id: str) -> Callback | None:
        async def read(connection: Connection) -> tuple[Any, ...] | None:
            cursor = await connection.execute(
                "SELECT dlq_id, body, received_at, verified FROM callbacks WHERE dlq_id = %s",
                (dlq_id,),
            )
            return await cursor.fetchone()

        row = await self._run(read)
        return None if row is None else Callback(row[0], bytes(row[1]), row[2], row[3])

    async def inbox_depth(self) -> int:
        return await self._run(pipeline.inbox_depth)

    async def ping(self) -> None:
        await self._run(_select_one)

    def problems(self) -> list[str]:
        """What makes the store unfit now (the server unreachable), one sentence; empty
        when nothing does. Cheap: no I/O."""
        return [self._problem] if self._problem else []

    async def size_bytes(self) -> int:
        """The store's tables with their indexes and TOAST, in bytes."""
        return await self._run(_size)

    # -- the pipeline's states (pipeline.py has the statements) ---------------

    async def claim(
        self, owner: str, limit: int, lease: float, now: float, *, bodies: bool = False
    ) -> list[Claimed]:
        return await self._write(lambda c: pipeline.claim(c, owner, limit, lease, now, bodies))

    async def settle(self, owner: str, outcomes: list[Outcome], now: float) -> Settled:
        return await self._write(lambda c: pipeline.settle(c, owner, outcomes, now))

    async def retry_now(self, now: float, limit: int | None = None) -> int:
        return await self._write(lambda c: pipeline.retry_now(c, now, limit))

    async def pending(self, owner: str | None = None) -> list[Pending]:
        return await self._write(lambda c: pipeline.pending(c, owner))

    async def open_batch(
        self, action: str, overrides: str, dlq_ids: list[str], now: float, owner: str | None = None
    ) -> BatchRecord | None:
        return await self._write(
            lambda c: pipeline.open_batch(c, action, overrides, dlq_ids, now, owner)
        )

    async def mark_sending(self, batch_id: int, now: float, owner: str | None = None) -> bool:
        return await self._write(lambda c: pipeline.mark_sending(c, batch_id, now, owner))

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
        async def settle(connection: Connection) -> Settled:
            return await pipeline.settle_batch(
                connection, batch_id, done=done, again=again, failed=failed, gone=gone,
                reason=reason, runs=runs, calls=calls, sent=sent, now=now,
            )  # fmt: skip

        return await self._write(settle)

    async def unsettled_batches(self, owner: str | None = None) -> list[BatchRecord]:
        return await self._write(lambda c: pipeline.unsettled_batches(c, owner))

    # -- replicas (replicas.py, singleton.py) ------------------------------------

    def singleton_lock(self, replica: str | None = None) -> AdvisoryLock:
        return AdvisoryLock(self._url, name=replica)

    async def singleton_holder(self) -> str | None:
        return await self._run(singleton.holder)

    async def heartbeat(self, replica: str, lease: float, now: float) -> list[str]:
        return await self._write(lambda c: members.heartbeat(c, replica, lease, now))

    async def leave(self, replica: str) -> None:
        await self._write(lambda c: members.leave(c, replica))

    async def replicas(self, now: float) -> list[Replica]:
        return await self._run(lambda c: members.alive(c, now))

    async def sends(self, dlq_ids: list[str]) -> dict[str, int]:
        return await self._run(lambda c: pipeline.sends(c, dlq_ids))

    async def record(self, dlq_id: str) -> dict[str, Any] | None:
        async def read(connection: Connection) -> dict[str, Any] | None:
            found = await pipeline.record(connection, dlq_id)
            if found is not None:
                found["notifications"] = await notify.of_dlq_id(connection, dlq_id)
            return found

        return await self._run(read)

    async def status(self, now: float) -> dict[str, Any]:
        async def read(connection: Connection) -> dict[str, Any]:
            pending = await notify.pending_count(connection)
            counts = await pipeline.status(connection, now)
            return {**counts, "notifications": {"pending": pending}}

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
        check_final(states)  # ValueError now, before any query
        work = lambda c: pipeline.redrive(c, states, rule, since, now, apply)  # noqa: E731
        return await (self._write(work) if apply else self._run(work))

    # -- notifications (notify.py) --------------------------------------------

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
        async def finish(connection: Connection) -> bool:
            return await notify.finish_attempt(
                connection, notification_id, result, status=status, reason=reason,
                next_at=next_at, now=now,
            )  # fmt: skip

        return await self._write(finish)

    # -- retention (retention.py) ---------------------------------------------

    async def prune(self, *, before: float, now: float, dedup_for: float, chunk: int = 200) -> int:
        """Delete the records final since before `before` (and the batches of none but
        them), `chunk` to a transaction so that no transaction holds many rows' locks,
        keeping a key of each for `dedup_for` seconds; forget the keys kept long enough.
        How many records were deleted. (autovacuum reclaims the space.)"""
        until = now + dedup_for
        pruned = 0
        while True:
            deleted = await self._write(
                lambda c: retention.prune_chunk(c, before=before, until=until, chunk=chunk)
            )
            pruned += deleted
            if deleted < chunk:
                break
        while await self._write(lambda c: retention.expire_chunk(c, now=now, chunk=chunk)):
            pass
        return pruned

    # -- token rotations (rotations.py) ---------------------------------------

    async def begin_rotation(self, now: float) -> int | None:
        return await self._write(lambda c: rotations.begin(c, now))

    async def finish_rotation(
        self, rotation_id: int, result: RotationResult, reason: str | None, now: float
    ) -> None:
        await self._write(lambda c: rotations.finish(c, rotation_id, result, reason, now))

    async def resolve_lockout(self, now: float) -> None:
        await self._write(lambda c: rotations.resolve_lockout(c, now))

    async def load_credentials(self) -> bytes | None:
        """The sealed credentials (account/vault.py), None before the first save."""
        return await self._run(rotations.load_credentials)

    async def save_credentials(self, sealed: bytes, rotation: int | None, now: float) -> None:
        await self._write(lambda c: rotations.save_credentials(c, sealed, rotation, now))

    async def replace_credentials(self, sealed: bytes, now: float) -> bool:
        """Save `sealed` (an operator's token) unless a rotation is under way."""

        async def replace(connection: Connection) -> bool:
            if not await rotations.hold_rotations(connection):
                return False
            await rotations.save_credentials(connection, sealed, None, now)
            return True

        return await self._write(replace)

    async def reseal_credentials(self, rewrite: Callable[[bytes], bytes], now: float) -> bool:
        return await self._write(lambda c: rotations.reseal_credentials(c, rewrite, now))

    async def unless_rotating(self, write: Callable[[], None]) -> bool:
        async def hold(connection: Connection) -> bool:
            if not await rotations.hold_rotations(connection):
                return False
            await asyncio.to_thread(write)  # a file's write and fsync, off the event loop
            return True

        return await self._write(hold)

    async def latest_rotation(self) -> Rotation | None:
        return await self._run(rotations.latest)

    async def last_rotation_success(self) -> float | None:
        return await self._run(rotations.last_success_at)

    async def last_rotation_failure(self) -> float | None:
        return await self._run(rotations.last_failure_at)

    # -- the account's learned rate limit (rate.py) ------------------------------

    async def learned_rate(self) -> LearnedRate | None:
        return await self._run(rate.load)

    async def save_learned_rate(self, learned: LearnedRate) -> None:
        await self._write(lambda c: rate.save(c, learned))

    # -- sweep runs (sweeps.py) -------------------------------------------------

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
        async def begin(connection: Connection) -> int | None:
            return await sweeps.begin_run(
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
        async def settle(connection: Connection) -> None:
            await sweeps.settle_page(
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

    # -- endpoint removals (endpoints.py; failures are counted by settle) ------

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

    async def _write(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """`work` in one transaction, within commit_timeout."""

        async def transaction(connection: Connection) -> T:
            async with connection.transaction():
                return await work(connection)

        return await self._run(transaction, seconds=self._commit_timeout)

    async def _run(
        self, query: Callable[[Connection], Awaitable[T]], *, seconds: float | None = None
    ) -> T:
        try:
            # asyncio.timeout, not wait_for (see SQLiteStore._run).
            async with asyncio.timeout(seconds or self._read_timeout):
                async with self._pool.connection() as connection:
                    result = await query(connection)
        except psycopg.errors.TransactionRollback as exc:
            # A deadlock or serialization failure between replicas: this request lost, the
            # server is fine; the caller tries again.
            raise StoreUnavailable(f"the store refused the request: {_said(exc)}") from None
        except psycopg_pool.PoolTimeout:
            raise self._unavailable("no connection to the store in time") from None
        except psycopg.OperationalError as exc:
            raise self._unavailable(f"the store did not answer: {_said(exc)}") from None
        except psycopg.Error as exc:  # the statement failed; the server is there
            raise StoreUnavailable(f"the store refused the request: {_said(exc)}") from None
        except TimeoutError:
            raise self._unavailable("the store did not answer in time") from None
        self._recovered()
        return result

    def _unavailable(self, reason: str) -> StoreUnavailable:
        if self._problem is None:
            log.error("the PostgreSQL store is unavailable", store=self._shown_url, reason=reason)
        self._problem = f"the PostgreSQL store {self._shown_url} is unavailable: {reason}"
        return StoreUnavailable(reason)

    def _recovered(self) -> None:
        if self._problem is not None:
            log.info("the PostgreSQL store is available again", store=self._shown_url)
            self._problem = None

    async def _watch(self, interval: float) -> None:
        """While a problem holds, try a query every `interval` seconds, to clear it."""
        while True:
            await asyncio.sleep(interval)
            if self._problem is not None:
                with contextlib.suppress(StoreUnavailable):
                    await self._run(_select_one)

    async def _insert(self, callbacks: list[Callback]) -> list[Added]:
        """One statement, so one round trip and its own transaction, for the whole batch: a
        dlqId already stored, or pruned (its key kept in `pruned`), or twice in the batch,
        is a duplicate; `ON CONFLICT DO NOTHING` makes two replicas given the same dlqId at
        once store it once, and answer one of them `duplicate`."""
        fresh: dict[str, Callback] = {}
        for callback in callbacks:
            fresh.setdefault(callback.dlq_id, callback)
        rows = list(fresh.values())

        async def insert(connection: Connection) -> set[str]:
            cursor = await connection.execute(
                "INSERT INTO callbacks (dlq_id, body, received_at, verified) "
                "SELECT dlq_id, body, received_at, verified "
                "FROM unnest(%s::text[], %s::bytea[], %s::float8[], %s::boolean[], %s::bigint[]) "
                "AS row (dlq_id, body, received_at, verified, key) "
                "WHERE NOT EXISTS (SELECT 1 FROM pruned WHERE pruned.key = row.key) "
                # In dlqId order: two replicas inserting the same dlqIds in different
                # orders would each wait on a row the other inserted, a deadlock.
                "ORDER BY dlq_id "
                "ON CONFLICT (dlq_id) DO NOTHING RETURNING dlq_id",
                (
                    [row.dlq_id for row in rows],
                    [row.body for row in rows],
                    [row.received_at for row in rows],
                    [row.verified for row in rows],
                    [dedup_key(row.dlq_id) for row in rows],
                ),
            )
            return {dlq_id for (dlq_id,) in await cursor.fetchall()}

        stored = await self._run(insert, seconds=self._commit_timeout)
        outcomes: list[Added] = []
        for callback in callbacks:
            first = fresh.get(callback.dlq_id) is callback
            outcomes.append("accepted" if first and callback.dlq_id in stored else "duplicate")
        return outcomes

    def _commit_failed(self, exc: Exception) -> StoreUnavailable:
        if isinstance(exc, StoreUnavailable):
            return exc
        log.error("store commit failed", error=repr(exc))
        return StoreUnavailable(f"the store could not commit: {exc}")


async def _select_one(connection: Connection) -> None:
    await connection.execute("SELECT 1")


async def _size(connection: Connection) -> int:
    cursor = await connection.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'r' AND n.nspname = current_schema()"
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _migrate(connection: Connection, create: bool = True, shown: str = "") -> None:
    """Apply the migrations this database lacks, in one transaction, under an advisory
    lock: replicas that start together wait for the first, then find nothing to do.
    Without `create`, a database with no schema yet is StoreMissing (`shown`: its URL
    without the password), and nothing is created."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        if not create:
            cursor = await connection.execute("SELECT to_regclass('recoveryd_schema')")
            found = await cursor.fetchone()
            if found is None or found[0] is None:
                raise StoreMissing(f"no store in the PostgreSQL database {shown}")
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS recoveryd_schema (version integer NOT NULL)"
        )
        cursor = await connection.execute("SELECT version FROM recoveryd_schema")
        row = await cursor.fetchone()
        version = row[0] if row else 0
        if version > len(MIGRATIONS):
            raise psycopg.errors.FeatureNotSupported(
                f"schema version {version} is newer than this recoveryd ({len(MIGRATIONS)})"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await connection.execute(script.encode())  # no parameters: several statements
            log.info("store schema migrated", version=number)
        if row is None:
            await connection.execute(
                "INSERT INTO recoveryd_schema (version) VALUES (%s)", (len(MIGRATIONS),)
            )
        else:
            await connection.execute("UPDATE recoveryd_schema SET version = %s", (len(MIGRATIONS),))


class _Remembering(Connection):
    """A connection class that keeps the error of its last failed connect(): the pool's
    PoolTimeout says only that it waited, and the server's reason (refused, no such
    database, a password refused) is what a person can act on."""

    error: psycopg.Error | None = None

    @classmethod
    async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        try:
            return await super().connect(conninfo, **kwargs)
        except psycopg.Error as exc:
            cls.error = exc
            raise


def _remembering() -> type[_Remembering]:
    """A class of its own for one pool, so that what it remembers is that pool's."""
    return type("Remembering", (_Remembering,), {})


def _said(exc: BaseException) -> str:
    """The error's first line: psycopg's messages can go on with context lines."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
