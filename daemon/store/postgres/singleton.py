"""The singleton jobs' lock: a session advisory lock, on a connection of its own.

The lock lives as long as the session that took it, so it is held on a dedicated
connection, never one of the pool's (a pooled connection goes back to others with the
lock still on it). When the holder dies its connection closes and the server frees the
lock at once; when the network between them fails, the server notices through TCP
keepalives (set short here: 5 s idle, then 3 probes 2 s apart, about 11 s) and the
holder through its next check, which fails within `check_timeout`: the holder stops
its jobs before the lock is freed.
"""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
from psycopg import conninfo

from daemon.store.interface import StoreUnavailable
from daemon.store.postgres.db import Connection

# "rcvdjobs" in ASCII.
SINGLETON_LOCK = 0x726376646A6F6273


class AdvisoryLock:
    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        connect_timeout: float = 5.0,
        check_timeout: float = 3.0,
    ):
        """`name`, the replica's id, is its session's application_name: `holder` finds
        it there."""
        self._url = url
        self._name = name
        self._connect_timeout = connect_timeout
        self._check_timeout = check_timeout
        self._connection: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def acquire(self) -> bool:
        """Take the lock if no other session holds it; StoreUnavailable when the server
        cannot be reached."""
        try:
            async with asyncio.timeout(self._connect_timeout + self._check_timeout):
                if self._connection is None or self._connection.closed:
                    named = {} if self._name is None else {"application_name": _shown(self._name)}
                    self._connection = await psycopg.AsyncConnection.connect(
                        conninfo.make_conninfo(self._url, keepalives=1, keepalives_idle=5,
                                               keepalives_interval=2, keepalives_count=3, **named),
                        autocommit=True, connect_timeout=max(1, int(self._connect_timeout)),
                    )  # fmt: skip
                    # The server's side of the keepalives: it frees the lock of a holder
                    # it cannot reach within about 11 s.
                    await self._connection.execute(
                        b"SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; "
                        b"SET tcp_keepalives_count = 3"
                    )
                cursor = await self._connection.execute(
                    "SELECT pg_try_advisory_lock(%s)", (SINGLETON_LOCK,)
                )
                row = await cursor.fetchone()
        except (psycopg.Error, TimeoutError, OSError) as exc:
            await self.release()
            raise StoreUnavailable(
                f"cannot take the singleton lock: {type(exc).__name__}"
            ) from None
        return bool(row and row[0])

    async def held(self) -> bool:
        """Whether the lock is still this process's: its session answers in time."""
        connection = self._connection
        if connection is None or connection.closed:
            return False
        try:
            async with asyncio.timeout(self._check_timeout):
                await connection.execute("SELECT 1")
        except (psycopg.Error, TimeoutError, OSError):
            await self.release()
            return False
        return True

    async def release(self) -> None:
        """Let the lock go, unlocked first so that another replica can take it at once
        (a closed session's lock is freed only once the server has seen it close); the
        session ends, and the lock with it if the unlock did not go through."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                async with asyncio.timeout(self._check_timeout):
                    await connection.execute("SELECT pg_advisory_unlock_all()")
            with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                async with asyncio.timeout(self._check_timeout):
                    await connection.close()


async def holder(connection: Connection) -> str | None:
    """The application_name of the session holding the lock in this database (a
    replica's id, as `_shown` cut it), or None when no session holds it."""
    cursor = await connection.execute(
        "SELECT a.application_name FROM pg_locks AS l "
        "JOIN pg_stat_activity AS a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid::bigint = %s AND l.objid::bigint = %s",
        (SINGLETON_LOCK >> 32, SINGLETON_LOCK & 0xFFFFFFFF),
    )
    row = await cursor.fetchone()
    return None if row is None else str(row[0])


def _shown(name: str) -> str:
    # PostgreSQL keeps 63 bytes of an application_name: the end of an id (its pid and
    # nonce) tells replicas apart, a long host name's start does not.
    return name.encode()[-63:].decode(errors="ignore")
