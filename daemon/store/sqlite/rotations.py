"""Token rotations over the SQLite store: each one recorded before its reset is called.

The record is what a restart reads to learn that a rotation was cut short, and it keeps
two rotations (two processes on one database) from running at once. It never holds a
credential.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from daemon.store.records import Rotation, RotationResult

# Migration 3 (see sqlite.MIGRATIONS).
SCHEMA = """
    CREATE TABLE rotations (
        id INTEGER PRIMARY KEY,
        started_at REAL NOT NULL,
        finished_at REAL,
        result TEXT,
        reason TEXT,
        resolved_at REAL
    );
"""

_COLUMNS = "id, started_at, finished_at, result, reason, resolved_at"


def begin(connection: sqlite3.Connection, now: float) -> int | None:
    """Record a rotation under way; None when one already is."""
    if connection.execute("SELECT 1 FROM rotations WHERE result IS NULL").fetchone():
        return None
    cursor = connection.execute("INSERT INTO rotations (started_at) VALUES (?)", (now,))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def finish(
    connection: sqlite3.Connection,
    rotation_id: int,
    result: RotationResult,
    reason: str | None,
    now: float,
) -> None:
    connection.execute(
        "UPDATE rotations SET result = ?, reason = ?, finished_at = ? "
        "WHERE id = ? AND result IS NULL",
        (result, reason, now, rotation_id),
    )


def resolve_lockout(connection: sqlite3.Connection, now: float) -> None:
    connection.execute(
        "UPDATE rotations SET resolved_at = ? WHERE result = 'lockout' AND resolved_at IS NULL",
        (now,),
    )


def latest(connection: sqlite3.Connection) -> Rotation | None:
    row = connection.execute(
        f"SELECT {_COLUMNS} FROM rotations ORDER BY id DESC LIMIT 1"
    ).fetchone()
    return Rotation(*row) if row else None


def last_success_at(connection: sqlite3.Connection) -> float | None:
    row = connection.execute(
        "SELECT max(finished_at) FROM rotations WHERE result = 'success'"
    ).fetchone()
    return row[0] if row else None


def unless_rotating(connection: sqlite3.Connection, write: Callable[[], None]) -> bool:
    """Within the caller's write transaction (which no rotation can begin beside): `write`
    when no rotation is under way, and whether it ran."""
    if connection.execute("SELECT 1 FROM rotations WHERE result IS NULL").fetchone():
        return False
    write()
    return True


def last_failure_at(connection: sqlite3.Connection) -> float | None:
    row = connection.execute(
        "SELECT max(finished_at) FROM rotations WHERE result = 'failure'"
    ).fetchone()
    return row[0] if row else None
