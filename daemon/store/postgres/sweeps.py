"""Sweep runs over the PostgreSQL store: each run, and each page of it, recorded before its
call goes out and settled after (see `sweep_records.py` for the states).

The same records as the SQLite store's (`daemon.store.sqlite.sweeps`). The unique index
`sweep_runs_under_way` (schema.py) keeps one run of a sweep under way at a time, whichever
replica begins it; a run's pages go with it (ON DELETE CASCADE). Only the latest
`KEEP_RUNS` runs of each sweep are kept: older ones go when a run finishes.

The filter, overrides and items are `jsonb`, which keeps an object's keys in an order of
its own: they are read back with their keys sorted, as SQLite keeps them (`_canonical`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from daemon.store.postgres.db import Connection, jsonb
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


async def begin_run(connection: Connection, sweep: str, run: RunStart) -> int | None:
    """Record a run of `sweep` under way; None when one already is.

    Looked for first, as SQLite does, so that the usual refusal takes no id. The guard
    is ON CONFLICT DO NOTHING: a conflict with the unique index of runs under way is the
    answer "one is under way", without an error that would end the caller's
    transaction. A run of the sweep that another replica has begun and not committed
    makes this insert wait for its end: committed, nothing is inserted."""
    action, dry_run, filter, overrides = run.action, run.dry_run, run.filter, run.overrides
    max_per_run, now = run.max_per_run, run.now
    cursor = await connection.execute(
        "SELECT 1 FROM sweep_runs WHERE sweep = %s AND result IS NULL", (sweep,)
    )
    if await cursor.fetchone():
        return None
    cursor = await connection.execute(
        "INSERT INTO sweep_runs (sweep, action, dry_run, filter, overrides, max_per_run, "
        "started_at) VALUES (%s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING id",
        (sweep, action, dry_run, jsonb(filter),
         None if overrides is None else jsonb(overrides), max_per_run, now),
    )  # fmt: skip
    row = await cursor.fetchone()
    return None if row is None else int(row[0])


async def begin_page(
    connection: Connection,
    run_id: int,
    page: int,
    *,
    count: int,
    cursor: str | None,
    now: float,
) -> None:
    """The page's call is about to go out."""
    await connection.execute(
        "INSERT INTO sweep_pages (run_id, page, count, cursor, sent_at, outcome) "
        "VALUES (%s, %s, %s, %s, %s, 'sending')",
        (run_id, page, count, cursor, now),
    )


async def settle_page(connection: Connection, run_id: int, page: int, end: PageEnd) -> None:
    """What the page's call came to, and the run's totals with it (a no-op for a page
    already settled: the page's row lock makes a second settle wait, then find it so)."""
    outcome, items, now = end.outcome, end.items, end.now
    next_cursor, error = end.next_cursor, end.error
    cursor = await connection.execute(
        "UPDATE sweep_pages SET outcome = %s, items = %s, next_cursor = %s, error = %s, "
        "answered_at = %s WHERE run_id = %s AND page = %s AND outcome = 'sending'",
        (outcome, jsonb(list(items)), next_cursor, error, now, run_id, page),
    )
    if not cursor.rowcount:
        return
    await connection.execute(
        "UPDATE sweep_runs SET pages = pages + 1, workflows = workflows + %s, "
        "cursor = coalesce(%s, cursor) WHERE id = %s",
        (len(items), next_cursor, run_id),
    )


async def finish_run(
    connection: Connection,
    run_id: int,
    result: SweepResult,
    error: str | None,
    now: float,
) -> None:
    """Record how the run ended (a no-op when it has already ended); forget the runs of
    its sweep beyond the latest KEEP_RUNS."""
    cursor = await connection.execute(
        "UPDATE sweep_runs SET result = %s, error = %s, finished_at = %s "
        "WHERE id = %s AND result IS NULL RETURNING sweep",
        (result, error, now, run_id),
    )
    row = await cursor.fetchone()
    if row is not None:
        await _forget_old_runs(connection, row[0])


async def close_interrupted(
    connection: Connection, now: float, sweep: str | None = None
) -> list[SweepRun]:
    """End as `interrupted` every run under way (of `sweep`, when given): its process is
    gone. A page still `sending` becomes `unknown`: its call may have been carried out.
    The runs closed, as they now are.

    The runs are locked as they are read (FOR UPDATE): a run another transaction is
    ending is waited for, then read again as it now is, and left out if it has ended;
    so a run is closed once, and never after it ended otherwise."""
    query = f"SELECT {RUN_COLUMNS} FROM sweep_runs WHERE result IS NULL"
    params: tuple[Any, ...] = ()
    if sweep is not None:
        query, params = query + " AND sweep = %s", (sweep,)
    cursor = await connection.execute(query + " ORDER BY id FOR UPDATE", params)
    closed = []
    for row in await cursor.fetchall():
        run = run_from(row, _canonical)
        await _close(connection, run, now)
        closed.append(await _with_pages(connection, await _select_run(connection, run.id)))
    return closed


async def _close(connection: Connection, run: SweepRun, now: float) -> None:
    """End `run` as interrupted, saying what its page out (if any) may have done."""
    cursor = await connection.execute(
        "SELECT page, count FROM sweep_pages WHERE run_id = %s AND outcome = 'sending' "
        "ORDER BY page LIMIT 1",
        (run.id,),
    )
    sending = await cursor.fetchone()
    error = interrupted_error(run, sending)
    if sending is not None:
        lost = PageEnd("unknown", now, error=LOST_ANSWER)
        await settle_page(connection, run.id, sending[0], lost)
    await finish_run(connection, run.id, "interrupted", error, now)


async def runs(connection: Connection, sweep: str, limit: int) -> list[SweepRun]:
    """The latest `limit` runs of `sweep`, newest first, with their pages."""
    cursor = await connection.execute(
        f"SELECT {RUN_COLUMNS} FROM sweep_runs WHERE sweep = %s ORDER BY id DESC LIMIT %s",
        (sweep, limit),
    )
    return [
        await _with_pages(connection, run_from(row, _canonical)) for row in await cursor.fetchall()
    ]


async def last_successes(connection: Connection) -> dict[str, float]:
    """When each sweep's last successful run finished (Unix time)."""
    cursor = await connection.execute(
        "SELECT sweep, max(finished_at) FROM sweep_runs WHERE result = 'success' GROUP BY sweep"
    )
    return {sweep: finished for sweep, finished in await cursor.fetchall()}


async def _forget_old_runs(connection: Connection, sweep: str) -> None:
    """The runs of `sweep` beyond the latest KEEP_RUNS, their pages with them (cascade)."""
    await connection.execute(
        "DELETE FROM sweep_runs WHERE id IN (SELECT id FROM sweep_runs WHERE sweep = %s "
        "ORDER BY id DESC OFFSET %s)",
        (sweep, KEEP_RUNS),
    )


async def _select_run(connection: Connection, run_id: int) -> SweepRun:
    cursor = await connection.execute(
        f"SELECT {RUN_COLUMNS} FROM sweep_runs WHERE id = %s", (run_id,)
    )
    row = await cursor.fetchone()
    assert row is not None  # locked by close_interrupted: still there
    return run_from(row, _canonical)


async def _with_pages(connection: Connection, run: SweepRun) -> SweepRun:
    found = await connection.execute(
        f"SELECT {PAGE_COLUMNS} FROM sweep_pages WHERE run_id = %s ORDER BY page", (run.id,)
    )
    rows = await found.fetchall()
    pages = tuple(page_from(row, _canonical) for row in rows)
    return dataclasses.replace(run, page_records=pages)


def _canonical(value: Any) -> Any:
    """`value` (as read from jsonb) with every object's keys in sorted order, as SQLite's
    `_dumps` stores them: the API shows a run's filter as it was recorded there."""
    return json.loads(json.dumps(value, sort_keys=True))
