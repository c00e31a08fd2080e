"""The account's learned rate limit over the PostgreSQL store: one row, the latest learned,
read by every replica (see `daemon.store.sqlite.rate`)."""

from __future__ import annotations

from daemon.store.postgres.db import Connection
from daemon.store.records import LearnedRate


async def load(connection: Connection) -> LearnedRate | None:
    cursor = await connection.execute(
        "SELECT rate, source, learned_at, replica FROM learned_rate WHERE id = 1"
    )
    row = await cursor.fetchone()
    return None if row is None else LearnedRate(*row)


async def save(connection: Connection, learned: LearnedRate) -> None:
    await connection.execute(
        "INSERT INTO learned_rate (id, rate, source, learned_at, replica) "
        "VALUES (1, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET rate = excluded.rate, "
        "source = excluded.source, learned_at = excluded.learned_at, replica = excluded.replica",
        (learned.rate, learned.source, learned.learned_at, learned.replica),
    )
