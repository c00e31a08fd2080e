"""Sweep runs over the SQLite store: each run, and each page of it, recorded before its
call goes out and settled after (see `sweep_records.py` for the states).

A unique index keeps one run of a sweep under way at a time. Only the latest
`KEEP_RUNS` runs of each sweep are kept: older ones go when a run finishes.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

from daemon.store.sweep_records import (
    KEEP_RUNS,
    LOST_ANSWER,
    PAGE_COLUMNS,
    RUN_COLUMNS,
    PageEnd,
    RunStart,
    SweepResult,
    SweepRun,
    interrupted_error,
    page_from,
    run_from,
)

# One migration (see sqlite.MIGRATIONS).
SCHEMA = """
    CREATE TABLE sweep_runs (
        id INTEGER PRIMARY KEY,
        sweep TEXT NOT NULL,
        action TEXT NOT NULL,
        dry_run INTEGER NOT NULL,
        filter TEXT NOT NULL,
        overrides TEXT,
        max_per_run INTEGER NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        result TEXT,
        error TEXT,
        pages INTEGER NOT NULL DEFAULT 0,
        workflows INTEGER NOT NULL DEFAULT 0,
        cursor TEXT
    );
    CREATE UNIQUE INDEX sweep_runs_under_way ON sweep_runs (sweep) WHERE result IS NULL;
    CREATE INDEX sweep_runs_by_sweep ON sweep_runs (sweep, id);
    CREATE TABLE sweep_pages (
        run_id INTEGER NOT NULL,
        page INTEGER NOT NULL,
        count INTEGER NOT NULL,
        cursor TEXT,
        sent_at REAL NOT NULL,
        answered_at REAL,
        outcome TEXT NOT NULL,
        next_cursor TEXT,
        items TEXT NOT NULL DEFAULT '[]',
        error TEXT,
        PRIMARY KEY (run_id, page)
    );
"""


def begin_run(connection: sqlite3.Connection, sweep: str, run: RunStart) -> int | None:
    """Record a run of `sweep` under way; None when one already is."""
    action, dry_run, filter, overrides = run.action, run.dry_run, run.filter, run.overrides
    max_per_run, now = run.max_per_run, run.now
    if connection.execute(
        "SELECT 1 FROM sweep_runs WHERE sweep = ? AND result IS NULL", (sweep,)
    ).fetchone():
        return None
    cursor = connection.execute(
        "INSERT INTO sweep_runs (sweep, action, dry_run, filter, overrides, max_per_run, "
        "started_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (sweep, action, int(dry_run), _dumps(filter),
         None if overrides is None else _dumps(overrides), max_per_run, now),
    )  # fmt: skip
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def begin_page(
    connection: sqlite3.Connection,
    run_id: int,
    page: int,
    *,
    count: int,
    cursor: str | None,
    now: float,
) -> None:
    """The page's call is about to go out."""
    connection.execute(
        "INSERT INTO sweep_pages (run_id, page, count, cursor, sent_at, outcome) "
        "VALUES (?, ?, ?, ?, ?, 'sending')",
        (run_id, page, count, cursor, now),
    )


def settle_page(connection: sqlite3.Connection, run_id: int, page: int, end: PageEnd) -> None:
    """What the page's call came to, and the run's totals with it (a no-op for a page
    already settled)."""
    outcome, items, now = end.outcome, end.items, end.now
    next_cursor, error = end.next_cursor, end.error
    changed = connection.execute(
        "UPDATE sweep_pages SET outcome = ?, items = ?, next_cursor = ?, error = ?, "
        "answered_at = ? WHERE run_id = ? AND page = ? AND outcome = 'sending'",
        (outcome, _dumps(list(items)), next_cursor, error, now, run_id, page),
    ).rowcount
    if not changed:
        return
    connection.execute(
        "UPDATE sweep_runs SET pages = pages + 1, workflows = workflows + ?, "
        "cursor = coalesce(?, cursor) WHERE id = ?",
        (len(items), next_cursor, run_id),
    )


def finish_run(
    connection: sqlite3.Connection,
    run_id: int,
    result: SweepResult,
    error: str | None,
    now: float,
) -> None:
    """Record how the run ended (a no-op when it has already ended); forget the runs of
    its sweep beyond the latest KEEP_RUNS."""
    row = connection.execute(
        "UPDATE sweep_runs SET result = ?, error = ?, finished_at = ? "
        "WHERE id = ? AND result IS NULL RETURNING sweep",
        (result, error, now, run_id),
    ).fetchone()
    if row is not None:
        _forget_old_runs(connection, row[0])


def close_interrupted(
    connection: sqlite3.Connection, now: float, sweep: str | None = None
) -> list[SweepRun]:
    """End as `interrupted` every run under way (of `sweep`, when given): its process is
    gone. A page still `sending` becomes `unknown`: its call may have been carried out.
    The runs closed, as they now are."""
    query = f"SELECT {RUN_COLUMNS} FROM sweep_runs WHERE result IS NULL"
    params: tuple[Any, ...] = ()
    if sweep is not None:
        query, params = query + " AND sweep = ?", (sweep,)
    closed = []
    for row in connection.execute(query, params).fetchall():
        run = run_from(row, json.loads)
        sending = connection.execute(
            "SELECT page, count FROM sweep_pages WHERE run_id = ? AND outcome = 'sending'",
            (run.id,),
        ).fetchone()
        error = interrupted_error(run, sending)
        if sending is not None:
            lost = PageEnd("unknown", now, error=LOST_ANSWER)
            settle_page(connection, run.id, sending[0], lost)
        finish_run(connection, run.id, "interrupted", error, now)
        closed.append(_with_pages(connection, _select_run(connection, run.id)))
    return closed


def runs(connection: sqlite3.Connection, sweep: str, limit: int) -> list[SweepRun]:
    """The latest `limit` runs of `sweep`, newest first, with their pages."""
    rows = connection.execute(
        f"SELECT {RUN_COLUMNS} FROM sweep_runs WHERE sweep = ? ORDER BY id DESC LIMIT ?",
        (sweep, limit),
    ).fetchall()
    return [_with_pages(connection, run_from(row, json.loads)) for row in rows]


def last_successes(connection: sqlite3.Connection) -> dict[str, float]:
    """When each sweep's last successful run finished (Unix time)."""
    rows = connection.execute(
        "SELECT sweep, max(finished_at) FROM sweep_runs WHERE result = 'success' GROUP BY sweep"
    ).fetchall()
    return {sweep: finished for sweep, finished in rows}


def _forget_old_runs(connection: sqlite3.Connection, sweep: str) -> None:
    old = "SELECT id FROM sweep_runs WHERE sweep = ? ORDER BY id DESC LIMIT -1 OFFSET ?"
    connection.execute(f"DELETE FROM sweep_pages WHERE run_id IN ({old})", (sweep, KEEP_RUNS))
    connection.execute(f"DELETE FROM sweep_runs WHERE id IN ({old})", (sweep, KEEP_RUNS))


def _select_run(connection: sqlite3.Connection, run_id: int) -> SweepRun:
    row = connection.execute(
        f"SELECT {RUN_COLUMNS} FROM sweep_runs WHERE id = ?", (run_id,)
    ).fetchone()
    return run_from(row, json.loads)


def _with_pages(connection: sqlite3.Connection, run: SweepRun) -> SweepRun:
    rows = connection.execute(
        f"SELECT {PAGE_COLUMNS} FROM sweep_pages WHERE run_id = ? ORDER BY page", (run.id,)
    ).fetchall()
    pages = tuple(page_from(row, json.loads) for row in rows)
    return dataclasses.replace(run, page_records=pages)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
