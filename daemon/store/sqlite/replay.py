"""Replay's reads and the shadow's disagreements over the SQLite store (daemon/store/replay.py
says what they share)."""

from __future__ import annotations

import sqlite3
from typing import Any

from daemon.store import replay
from daemon.store.records import ReplayRow
from daemon.store.sqlite.listing import mark

SCHEMA = replay.SCHEMA  # migration 19


def _member(name: str) -> str:
    return f"json_extract(shadow, '$.{name}')"


def rows(
    connection: sqlite3.Connection,
    since: float | None,
    after: tuple[float, str] | None,
    limit: int,
) -> list[ReplayRow]:
    sql, params = replay.rows_sql(since, after, limit, mark)
    return replay.replay_rows(connection.execute(sql, params).fetchall())


def disagreements(connection: sqlite3.Connection, since: float | None) -> list[dict[str, Any]]:
    sql, params = replay.disagreements_sql(since, mark, _member)
    return replay.disagreements(connection.execute(sql, params).fetchall())
