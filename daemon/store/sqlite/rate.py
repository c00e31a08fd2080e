"""The account's learned rate limit over the SQLite store: one row, the latest learned.

Kept so that a restart, or an outage, does not cost another discovery of a limit the
service tells only on a 429 (daemon/account/rate.py).
"""

from __future__ import annotations

import sqlite3

from daemon.store.records import LearnedRate

# Migration 17 (see sqlite.MIGRATIONS).
SCHEMA = """
    CREATE TABLE learned_rate (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        rate REAL NOT NULL,
        source TEXT NOT NULL,
        learned_at REAL NOT NULL,
        replica TEXT
    );
"""


def load(connection: sqlite3.Connection) -> LearnedRate | None:
    row = connection.execute(
        "SELECT rate, source, learned_at, replica FROM learned_rate WHERE id = 1"
    ).fetchone()
    return None if row is None else LearnedRate(*row)


def save(connection: sqlite3.Connection, learned: LearnedRate) -> None:
    connection.execute(
        "INSERT INTO learned_rate (id, rate, source, learned_at, replica) "
        "VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET rate = excluded.rate, "
        "source = excluded.source, learned_at = excluded.learned_at, replica = excluded.replica",
        (learned.rate, learned.source, learned.learned_at, learned.replica),
    )
