"""Token rotations over the PostgreSQL store: each one recorded before its reset is called.

The same records as the SQLite store's (see `daemon.store.sqlite.rotations`). What
keeps two rotations from running at once is the unique index `rotations_under_way`
(schema.py), not a read before the insert: two replicas could both read that none is
under way, and both begin one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from daemon.store.postgres.db import Connection
from daemon.store.records import Rotation, RotationResult

_COLUMNS = "id, started_at, finished_at, result, reason, resolved_at"


async def begin(connection: Connection, now: float) -> int | None:
    """Record a rotation under way; None when one already is.

    Looked for first, as SQLite does, so that the usual refusal takes no id (an insert
    that conflicts has drawn one from the identity already). The look is no guard:
    ON CONFLICT DO NOTHING is, taking the unique index's conflict as the answer "one is
    under way" without an error, so the caller's transaction goes on (no savepoint
    needed). A rotation another replica has begun and not committed makes the insert
    wait for its end: committed, nothing is inserted; rolled back, this one is."""
    cursor = await connection.execute("SELECT 1 FROM rotations WHERE result IS NULL")
    if await cursor.fetchone():
        return None
    cursor = await connection.execute(
        "INSERT INTO rotations (started_at) VALUES (%s) ON CONFLICT DO NOTHING RETURNING id",
        (now,),
    )
    row = await cursor.fetchone()
    return None if row is None else int(row[0])


async def finish(
    connection: Connection,
    rotation_id: int,
    result: RotationResult,
    reason: str | None,
    now: float,
) -> None:
    await connection.execute(
        "UPDATE rotations SET result = %s, reason = %s, finished_at = %s "
        "WHERE id = %s AND result IS NULL",
        (result, reason, now, rotation_id),
    )


async def resolve_lockout(connection: Connection, now: float) -> None:
    await connection.execute(
        "UPDATE rotations SET resolved_at = %s WHERE result = 'lockout' AND resolved_at IS NULL",
        (now,),
    )


async def latest(connection: Connection) -> Rotation | None:
    cursor = await connection.execute(f"SELECT {_COLUMNS} FROM rotations ORDER BY id DESC LIMIT 1")
    row = await cursor.fetchone()
    return Rotation(*row) if row else None


async def last_success_at(connection: Connection) -> float | None:
    cursor = await connection.execute(
        "SELECT max(finished_at) FROM rotations WHERE result = 'success'"
    )
    row = await cursor.fetchone()
    return row[0] if row else None


async def last_failure_at(connection: Connection) -> float | None:
    cursor = await connection.execute(
        "SELECT max(finished_at) FROM rotations WHERE result = 'failure'"
    )
    row = await cursor.fetchone()
    return row[0] if row else None


async def load_credentials(connection: Connection) -> bytes | None:
    cursor = await connection.execute("SELECT sealed FROM credentials WHERE id = 1")
    row = await cursor.fetchone()
    return bytes(row[0]) if row else None


async def save_credentials(
    connection: Connection, sealed: bytes, rotation: int | None, now: float
) -> None:
    await connection.execute(
        "INSERT INTO credentials (id, sealed, rotation, saved_at) VALUES (1, %s, %s, %s) "
        "ON CONFLICT (id) DO UPDATE SET sealed = excluded.sealed, rotation = excluded.rotation, "
        "saved_at = excluded.saved_at",
        (sealed, rotation, now),
    )


async def hold_rotations(connection: Connection) -> bool:
    """Within the caller's transaction: keep any rotation from beginning until it ends
    (a rotation's insert waits on the lock), and whether none is under way now."""
    await connection.execute("LOCK TABLE rotations IN SHARE ROW EXCLUSIVE MODE")
    cursor = await connection.execute("SELECT 1 FROM rotations WHERE result IS NULL")
    return await cursor.fetchone() is None


async def unless_rotating(connection: Connection, write: Callable[[], None]) -> bool:
    """Within the caller's transaction: `write` (a file's write and fsync, run off the
    event loop) when no rotation is under way, none beginning meanwhile; whether it ran."""
    if not await hold_rotations(connection):
        return False
    await asyncio.to_thread(write)
    return True


async def reseal_credentials(
    connection: Connection, rewrite: Callable[[bytes], bytes], now: float
) -> bool:
    """Within the caller's transaction: the saved row sealed again by `rewrite`, locked
    meanwhile so that a rotation's save waits (and then wins); False when there is none."""
    cursor = await connection.execute("SELECT sealed FROM credentials WHERE id = 1 FOR UPDATE")
    row = await cursor.fetchone()
    if row is None:
        return False
    await connection.execute(
        "UPDATE credentials SET sealed = %s, saved_at = %s WHERE id = 1",
        (rewrite(bytes(row[0])), now),
    )
    return True
