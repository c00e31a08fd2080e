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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self, TypeVar

import psycopg
import psycopg_pool
import structlog

from daemon.foundation.urls import without_credentials
from daemon.store.facade import Facade
from daemon.store.interface import Added, Callback, StoreMissing, StoreUnavailable
from daemon.store.listing import listed_fields
from daemon.store.postgres import (
    endpoints,
    listing,
    notify,
    pipeline,
    rate,
    replay,
    retention,
    rotations,
    singleton,
    sweeps,
)
from daemon.store.postgres import replicas as members
from daemon.store.postgres.db import Connection
from daemon.store.postgres.schema import MIGRATION_LOCK, MIGRATIONS
from daemon.store.postgres.singleton import AdvisoryLock
from daemon.store.records import Replica, dedup_key

T = TypeVar("T")
log = structlog.get_logger(__name__)


class PostgresStore(Facade):
    """The Store of daemon.store over PostgreSQL. Open it with `PostgresStore.open`."""

    shared = True
    _pipeline, _notify, _retention, _rotations = pipeline, notify, retention, rotations
    _rate, _sweeps, _endpoints, _listing = rate, sweeps, endpoints, listing
    _replay = replay

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Connection],
        url: str,
        shown_url: str,
        **options: Any,
    ) -> None:
        self._pool = pool
        self._url = url
        self._shown_url = shown_url
        self._problem: str | None = None
        super().__init__(**options)

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
        async with store._running(health_interval, "recoveryd-pg-health"):
            yield store

    async def _close(self, *, finished: bool) -> None:
        await self._pool.close()

    async def ping(self) -> None:
        await self._run(_select_one)

    def problems(self) -> list[str]:
        """What makes the store unfit now (the server unreachable), one sentence; empty
        when nothing does. Cheap: no I/O."""
        return [self._problem] if self._problem else []

    async def size_bytes(self) -> int:
        """The store's tables with their indexes and TOAST, in bytes."""
        return await self._run(_size)

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
            # A scrape folds the groups' deltas too, to keep them few while the console
            # is not looked at.
            await listing.fold(connection)
            return {**counts, "notifications": {"pending": pending}}

        return await self._run(read)

    # -- replicas (replicas.py, singleton.py) ------------------------------------

    def singleton_lock(self, replica: str | None = None) -> AdvisoryLock:
        return AdvisoryLock(self._url, name=replica)

    async def singleton_holder(self) -> str | None:
        return await self._run(singleton.holder)

    async def heartbeat(self, replica: str, lease: float, now: float) -> list[str]:
        return await self._write(members.heartbeat, replica, lease, now)

    async def leave(self, replica: str) -> None:
        await self._write(members.leave, replica)

    async def replicas(self, now: float) -> list[Replica]:
        return await self._read(members.alive, now)

    # -- the credentials, sealed (account/vault.py; rotations.py) --------------------

    async def load_credentials(self) -> bytes | None:
        """The sealed credentials (account/vault.py), None before the first save."""
        return await self._read(rotations.load_credentials)

    async def save_credentials(self, sealed: bytes, rotation: int | None, now: float) -> None:
        await self._write(rotations.save_credentials, sealed, rotation, now)

    async def replace_credentials(self, sealed: bytes, now: float) -> bool:
        """Save `sealed` (an operator's token) unless a rotation is under way."""

        async def replace(connection: Connection) -> bool:
            if not await rotations.hold_rotations(connection):
                return False
            await rotations.save_credentials(connection, sealed, None, now)
            return True

        return await self._write(replace)

    async def reseal_credentials(self, rewrite: Callable[[bytes], bytes], now: float) -> bool:
        return await self._write(rotations.reseal_credentials, rewrite, now)

    async def _read(self, work: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        return await self._run(lambda c: work(c, *args, **kwargs))

    async def _write(self, work: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """`work` in one transaction, within commit_timeout."""

        async def transaction(connection: Connection) -> T:
            async with connection.transaction():
                return await work(connection, *args, **kwargs)

        return await self._run(transaction, seconds=self._commit_timeout)

    # Reading what waits takes over the work of the replicas gone: a write.
    _adopting = _write

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
        listed = [row.listed or listed_fields(row.body) for row in rows]

        async def insert(connection: Connection) -> set[str]:
            cursor = await connection.execute(
                "INSERT INTO callbacks (dlq_id, body, received_at, verified, "
                "url, url_group, endpoint, status) "
                "SELECT dlq_id, body, received_at, verified, url, url_group, endpoint, status "
                "FROM unnest(%s::text[], %s::bytea[], %s::float8[], %s::boolean[], %s::bigint[], "
                "%s::text[], %s::text[], %s::text[], %s::integer[]) "
                "AS row (dlq_id, body, received_at, verified, key, "
                "url, url_group, endpoint, status) "
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
                    *([fields[at] for fields in listed] for at in range(4)),
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
