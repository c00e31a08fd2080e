"""Endpoint failures and removals over the SQLite store (see `removals.py` for the states).

Plain functions of a connection, run by `SQLiteStore` on its thread, inside a
transaction for writes. A failure is counted in the transaction that settles its
dlqId's decision; reaching the threshold records the removal in that same transaction.
Everything that follows (the group read, the DELETE) is the remover's
(`daemon/endpoints/remover.py`), each step committed here before the next call.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from daemon.foundation.durations import shown_duration
from daemon.foundation.words import plural
from daemon.store import removals
from daemon.store.records import Outcome, State
from daemon.store.removals import (
    COLUMNS,
    COUNTED_SQL,
    DLQ_STATE,
    HOUR,
    LISTED_COLUMNS,
    OPEN,
    OPEN_SQL,
    Evidence,
    Removal,
    RemovalResult,
    shown,
)

# Migration (see sqlite.MIGRATIONS). `endpoint` is how the failures name the endpoint:
# its name, else its url. A failure is used up (`removal_id`) by the removal its
# threshold led to, whatever became of it: the count then starts again.
SCHEMA = """
    CREATE TABLE endpoint_failures (
        dlq_id TEXT PRIMARY KEY,
        url_group TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        response_status INTEGER,
        failed_at REAL NOT NULL,
        counted_at REAL NOT NULL,
        rule TEXT,
        removal_id INTEGER
    );
    CREATE INDEX endpoint_failures_open ON endpoint_failures (url_group, endpoint, failed_at)
        WHERE removal_id IS NULL;
    CREATE TABLE endpoint_removals (
        id INTEGER PRIMARY KEY,
        url_group TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        endpoint_name TEXT,
        endpoint_url TEXT,
        rule TEXT NOT NULL,
        threshold_failures INTEGER NOT NULL,
        threshold_within REAL NOT NULL,
        keep_last INTEGER NOT NULL,
        dlq_id TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        evidence TEXT NOT NULL DEFAULT '[]',
        tries INTEGER NOT NULL DEFAULT 0,
        retry_at REAL,
        calls TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL,
        intended_at REAL,
        finished_at REAL,
        restore_state TEXT,
        restore_reason TEXT,
        restored_at REAL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX endpoint_removals_open ON endpoint_removals (state, id)
        WHERE state IN ('pending', 'removing');
    CREATE INDEX endpoint_removals_by_endpoint ON endpoint_removals (url_group, endpoint);
    CREATE INDEX endpoint_removals_by_intent ON endpoint_removals (intended_at);
"""


def count_failure(
    connection: sqlite3.Connection, owner: str, outcome: Outcome, now: float
) -> tuple[State, str] | None:
    """Count `outcome`'s failure against its endpoint, and record a removal when that
    reaches the threshold within the window; the dlqId's state and reason. None when
    `owner` no longer holds the dlqId's lease (whoever holds it counts it)."""
    failure = outcome.endpoint_failure
    assert failure is not None
    leased = connection.execute(
        "SELECT received_at FROM callbacks WHERE dlq_id = ? AND state = 'received' "
        "AND lease_owner = ?",
        (outcome.dlq_id, owner),
    ).fetchone()
    if leased is None:
        return None
    group, endpoint = failure.url_group, failure.endpoint
    where = f"endpoint {shown(failure.name, failure.url)} of URL Group {group}"
    if connection.execute(
        "SELECT 1 FROM endpoint_failures WHERE dlq_id = ?", (outcome.dlq_id,)
    ).fetchone():
        return "done", f"already counted as a failure of {where} (a dlqId counts once)"
    # The failure's time is when its callback arrived: a fetch held up by an outage must
    # not spread failures that came together over a longer window.
    connection.execute(
        "INSERT INTO endpoint_failures (dlq_id, url_group, endpoint, response_status, "
        "failed_at, counted_at, rule) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (outcome.dlq_id, group, endpoint, failure.response_status, leased[0], now, outcome.rule),
    )
    window = _window(connection, group, endpoint, failure.within)
    counted = (
        f"counted {len(window)} of {failure.failures} {plural(failure.failures, 'failure')} within "
        f"{shown_duration(failure.within)} of {where}"
    )
    under_way = connection.execute(
        f"SELECT id FROM endpoint_removals WHERE url_group = ? AND endpoint = ? "
        f"AND state IN ({OPEN_SQL})",
        (group, endpoint),
    ).fetchone()
    if under_way is not None:
        return "done", f"{counted}; its removal {under_way[0]} is under way"
    if len(window) < failure.failures:
        return "done", counted
    assert outcome.rule is not None
    removal_id = connection.execute(
        "INSERT INTO endpoint_removals (url_group, endpoint, endpoint_name, endpoint_url, rule, "
        "threshold_failures, threshold_within, keep_last, dlq_id, state, evidence, created_at, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
        (group, endpoint, failure.name, failure.url, outcome.rule, failure.failures,
         failure.within, failure.keep_last, outcome.dlq_id,
         json.dumps([item.to_json() for item in window]), now, now),
    ).lastrowid  # fmt: skip
    connection.executemany(
        "UPDATE endpoint_failures SET removal_id = ? WHERE dlq_id = ?",
        [(removal_id, item.dlq_id) for item in window],
    )
    return "done", f"{counted}: the threshold is reached; removal {removal_id} is under way"


def _window(
    connection: sqlite3.Connection, group: str, endpoint: str, within: float
) -> list[Evidence]:
    """The failures of the endpoint not used up yet, within `within` of the latest."""
    rows = connection.execute(
        "SELECT dlq_id, response_status, failed_at FROM endpoint_failures "
        "WHERE url_group = ? AND endpoint = ? AND removal_id IS NULL ORDER BY failed_at, dlq_id",
        (group, endpoint),
    ).fetchall()
    return removals.window(rows, within)


def due(connection: sqlite3.Connection, now: float) -> list[Removal]:
    """The removals not finished whose next step is due, oldest first."""
    rows = connection.execute(
        f"SELECT {COLUMNS} FROM endpoint_removals INDEXED BY endpoint_removals_open "
        f"WHERE state IN ({OPEN_SQL}) AND (retry_at IS NULL OR retry_at <= ?) ORDER BY id",
        (now,),
    ).fetchall()
    return [removals.removal(row) for row in rows]


def get(connection: sqlite3.Connection, removal_id: int) -> Removal | None:
    row = connection.execute(
        f"SELECT {COLUMNS} FROM endpoint_removals WHERE id = ?", (removal_id,)
    ).fetchone()
    return None if row is None else removals.removal(row)


def defer(
    connection: sqlite3.Connection,
    removal_id: int,
    *,
    reason: str,
    retry_at: float,
    tried: bool = True,
    calls: Sequence[dict[str, Any]],
    now: float,
) -> None:
    """The step could not be taken now (the group read or the DELETE failed in a way a
    later try may not): try again at `retry_at`. `tried`: a call was made, and counts as
    a try (one the client held back, its circuit open, does not)."""
    connection.execute(
        "UPDATE endpoint_removals SET tries = tries + ?, retry_at = ?, reason = ?, "
        "updated_at = ? "
        f"WHERE id = ? AND state IN ({OPEN_SQL})",
        (int(tried), retry_at, reason, now, removal_id),
    )
    _add_calls(connection, removal_id, calls)


def intend(
    connection: sqlite3.Connection,
    removal_id: int,
    *,
    name: str | None,
    url: str | None,
    max_per_hour: int,
    calls: Sequence[dict[str, Any]],
    now: float,
) -> Removal | None:
    """Record the removal as intended (`removing`, with the endpoint's `name` and `url`
    as read from the group), unless RECOVERYD_MAX_REMOVALS_PER_HOUR removals were made in
    the last hour: then it ends `capped`. Counted and recorded in one transaction, so two
    removals can never both take the last place under the cap."""
    removal = get(connection, removal_id)
    if removal is None or removal.state != "pending":
        return removal
    (made,) = connection.execute(
        "SELECT count(*) FROM endpoint_removals INDEXED BY endpoint_removals_by_intent "
        f"WHERE intended_at >= ? AND state IN ({COUNTED_SQL})",
        (now - HOUR,),
    ).fetchone()
    if made >= max_per_hour:
        reason = removals.capped_reason(made, max_per_hour, removal.url_group, name, url)
        finish(connection, removal_id, "capped", reason, calls=calls, now=now)
    else:
        connection.execute(
            "UPDATE endpoint_removals SET state = 'removing', intended_at = ?, "
            "endpoint_name = ?, endpoint_url = ?, tries = 0, retry_at = NULL, reason = NULL, "
            "updated_at = ? WHERE id = ?",
            (now, name, url, now, removal_id),
        )
        _add_calls(connection, removal_id, calls)
    return get(connection, removal_id)


def finish(
    connection: sqlite3.Connection,
    removal_id: int,
    result: RemovalResult,
    reason: str,
    *,
    calls: Sequence[dict[str, Any]],
    now: float,
) -> bool:
    """End the removal with `result`; False when it had ended already. The endpoint's
    failures counted while it was under way are used up by it too (added to its
    evidence), and the dlqId whose failure reached the threshold takes its outcome as
    its final state and reason, in the same transaction."""
    row = connection.execute(
        "SELECT url_group, endpoint, dlq_id, evidence, created_at, state "
        "FROM endpoint_removals WHERE id = ?",
        (removal_id,),
    ).fetchone()
    if row is None or row[5] not in OPEN:
        return False
    group, endpoint, dlq_id, evidence, created_at, _ = row
    later = connection.execute(
        "UPDATE endpoint_failures SET removal_id = ? "
        "WHERE url_group = ? AND endpoint = ? AND removal_id IS NULL AND counted_at >= ? "
        "RETURNING dlq_id, response_status, failed_at",
        (removal_id, group, endpoint, created_at),
    ).fetchall()
    items = json.loads(evidence) + removals.later_evidence(later)
    connection.execute(
        "UPDATE endpoint_removals SET state = ?, reason = ?, evidence = ?, retry_at = NULL, "
        "finished_at = ?, updated_at = ? WHERE id = ?",
        (result, reason, json.dumps(items), now, now, removal_id),
    )
    _add_calls(connection, removal_id, calls)
    state, told = DLQ_STATE[result], f"{reason} (removal {removal_id})"
    event = json.dumps({"state": state, "at": now, "reason": told, "removal": removal_id})
    connection.execute(
        "UPDATE callbacks SET state = ?, reason = ?, updated_at = ?, "
        "history = json_insert(history, '$[#]', json(?)) WHERE dlq_id = ? AND state = 'done'",
        (state, told, now, event, dlq_id),
    )
    return True


def _add_calls(
    connection: sqlite3.Connection, removal_id: int, calls: Sequence[dict[str, Any]]
) -> None:
    if calls:
        connection.execute(
            "UPDATE endpoint_removals SET calls = ? WHERE id = ?",
            (json.dumps(_calls(connection, removal_id) + list(calls)), removal_id),
        )


def _calls(connection: sqlite3.Connection, removal_id: int) -> list[Any]:
    row = connection.execute(
        "SELECT calls FROM endpoint_removals WHERE id = ?", (removal_id,)
    ).fetchone()
    return list(json.loads(row[0])) if row else []


def begin_restore(connection: sqlite3.Connection, group: str, name: str, now: float) -> Removal:
    """The last removal of the endpoint `name` (its name, or its url when it has none)
    from `group`, now marked as being restored; RestoreRefused when there is none or it
    was restored already. A restore cut short stays `restoring` and may be run again:
    adding an endpoint the group already has changes nothing."""
    row = connection.execute(
        f"SELECT {COLUMNS}, restore_state, restored_at FROM endpoint_removals "
        "WHERE url_group = ? AND state = 'removed' AND (endpoint_name = ? OR "
        "(endpoint_name IS NULL AND endpoint_url = ?)) ORDER BY id DESC LIMIT 1",
        (group, name, name),
    ).fetchone()
    removal = removals.restorable(row, group, name)
    connection.execute(
        "UPDATE endpoint_removals SET restore_state = 'restoring', updated_at = ? WHERE id = ?",
        (now, removal.id),
    )
    return removal


def finish_restore(
    connection: sqlite3.Connection,
    removal_id: int,
    *,
    restored: bool,
    reason: str,
    calls: Sequence[dict[str, Any]],
    now: float,
) -> None:
    """The restore went through, or did not (the removal can be restored again)."""
    connection.execute(
        "UPDATE endpoint_removals SET restore_state = ?, restore_reason = ?, "
        "restored_at = CASE WHEN ? THEN ? ELSE restored_at END, updated_at = ? WHERE id = ?",
        ("restored" if restored else None, reason, restored, now, now, removal_id),
    )
    _add_calls(connection, removal_id, calls)


def listed(
    connection: sqlite3.Connection, group: str | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """The latest `limit` removals (of `group` when given), oldest first, as
    `/api/v1/removals` answers them."""
    where, params = ("WHERE url_group = ?", (group,)) if group is not None else ("", ())
    rows = connection.execute(
        f"SELECT {LISTED_COLUMNS} FROM endpoint_removals {where} ORDER BY id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [removals.listed(row, load=json.loads) for row in reversed(rows)]
