"""Replay's reads and the shadow's disagreements over the PostgreSQL store
(daemon/store/replay.py says what they share)."""

from __future__ import annotations

from typing import Any

from daemon.store import replay
from daemon.store.postgres.db import Connection
from daemon.store.postgres.listing import mark
from daemon.store.records import ReplayRow

SCHEMA = replay.SCHEMA  # migration 7


def _member(name: str) -> str:
    return f"(shadow::jsonb ->> '{name}')"


async def rows(
    connection: Connection, since: float | None, after: tuple[float, str] | None, limit: int
) -> list[ReplayRow]:
    sql, params = replay.rows_sql(since, after, limit, mark)
    cursor = await connection.execute(sql.encode(), params)
    return replay.replay_rows(await cursor.fetchall())


async def disagreements(connection: Connection, since: float | None) -> list[dict[str, Any]]:
    sql, params = replay.disagreements_sql(since, mark, _member)
    cursor = await connection.execute(sql.encode(), params)
    return replay.disagreements(await cursor.fetchall())
