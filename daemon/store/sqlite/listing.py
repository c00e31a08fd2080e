"""The listings over the SQLite store (daemon/store/listing.py says what they share):
the records and batches a page at a time, the failure groups and each rule's outcomes
from `group_counts`, and the activity per minute.

`group_counts` is kept by triggers as `state_counts` is (pipeline.COUNTS): one row a
group and state, so that the groups are read from a few rows, never from the callbacks.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from daemon.store import listing
from daemon.store.interface import Page, RecordQuery

# A record's group key, of its row as NEW or OLD in a trigger: the URL Group and endpoint,
# or the URL when there is no group; the failed delivery's status; the rule. Empty parts
# are '' and 0: a primary key of SQLite's cannot tell NULLs apart.
_KEY_COLUMNS = "url_group, endpoint, url, status, rule, state"


def _values(row: str) -> tuple[str, ...]:
    return (
        f"coalesce({row}.url_group, '')",
        f"coalesce({row}.endpoint, '')",
        f"CASE WHEN {row}.url_group IS NULL THEN coalesce({row}.url, '') ELSE '' END",
        f"coalesce({row}.status, 0)",
        f"coalesce({row}.rule, '')",
        f"{row}.state",
    )


def _key(row: str) -> str:
    return ", ".join(_values(row))


def _matches(row: str) -> str:
    columns = _KEY_COLUMNS.split(", ")
    return " AND ".join(f"{c} = {v}" for c, v in zip(columns, _values(row), strict=True))


def _counted(row: str) -> str:
    """One more record of `row`'s group and state."""
    return (
        f"INSERT INTO group_counts ({_KEY_COLUMNS}, n, first_seen, last_seen) "
        f"VALUES ({_key(row)}, 1, {row}.received_at, {row}.received_at) "
        f"ON CONFLICT ({_KEY_COLUMNS}) DO UPDATE SET n = n + 1, "
        "first_seen = min(first_seen, excluded.first_seen), "
        "last_seen = max(last_seen, excluded.last_seen);"
    )


def _uncounted(row: str) -> str:
    """One record fewer; a group and state counted down to none is forgotten."""
    return (
        f"UPDATE group_counts SET n = n - 1 WHERE {_matches(row)};"
        f"DELETE FROM group_counts WHERE {_matches(row)} AND n <= 0;"
    )


_CUT = listing.MAX_LISTED  # the listed texts' length

# Migration 18: what a record is listed and grouped by, from its callback (filled at
# insert, `listing.listed_fields`; here from the bodies stored, for the rows there are);
# the indexes each filter of the listing walks; the groups' counts, kept by triggers.
# Partial where the column is empty at insert (rule, action, run id, decision), so that
# ingest pays only for the three filled then: received_at, url, and url_group (for the
# callbacks of a URL Group). callbacks_by_state gains dlq_id, for the keyset's order.
SCHEMA = f"""
    ALTER TABLE callbacks ADD COLUMN url TEXT;
    ALTER TABLE callbacks ADD COLUMN url_group TEXT;
    ALTER TABLE callbacks ADD COLUMN endpoint TEXT;
    ALTER TABLE callbacks ADD COLUMN status INTEGER;
    UPDATE callbacks SET
        url = CASE WHEN json_type(CAST(body AS TEXT), '$.url') = 'text'
            THEN substr(json_extract(CAST(body AS TEXT), '$.url'), 1, {_CUT}) END,
        url_group = CASE WHEN json_type(CAST(body AS TEXT), '$.topicName') = 'text'
            THEN substr(json_extract(CAST(body AS TEXT), '$.topicName'), 1, {_CUT}) END,
        endpoint = CASE WHEN json_type(CAST(body AS TEXT), '$.endpointName') = 'text'
            THEN substr(json_extract(CAST(body AS TEXT), '$.endpointName'), 1, {_CUT}) END,
        status = CASE WHEN json_type(CAST(body AS TEXT), '$.status') = 'integer'
            AND json_extract(CAST(body AS TEXT), '$.status') BETWEEN 100 AND 999
            THEN json_extract(CAST(body AS TEXT), '$.status') END
        WHERE json_valid(CAST(body AS TEXT))
            AND json_type(CAST(body AS TEXT)) = 'object';
    {listing.INDEXES}
    CREATE TABLE group_counts (
        url_group TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        url TEXT NOT NULL,
        status INTEGER NOT NULL,
        rule TEXT NOT NULL,
        state TEXT NOT NULL,
        n INTEGER NOT NULL,
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL,
        PRIMARY KEY ({_KEY_COLUMNS})
    ) WITHOUT ROWID;
    INSERT INTO group_counts ({_KEY_COLUMNS}, n, first_seen, last_seen)
        SELECT {_key("callbacks")}, count(*), min(received_at), max(received_at)
        FROM callbacks GROUP BY 1, 2, 3, 4, 5, 6;
    CREATE TRIGGER callbacks_group_insert AFTER INSERT ON callbacks BEGIN
        {_counted("NEW")}
    END;
    CREATE TRIGGER callbacks_group_update AFTER UPDATE OF state, rule ON callbacks
    WHEN OLD.state IS NOT NEW.state OR OLD.rule IS NOT NEW.rule BEGIN
        {_uncounted("OLD")}
        {_counted("NEW")}
    END;
    CREATE TRIGGER callbacks_group_delete AFTER DELETE ON callbacks BEGIN
        {_uncounted("OLD")}
    END;
"""


def mark(name: str) -> str:
    """A statement's placeholder for the parameter `name` (listing.Mark); replay uses it too."""
    return f":{name}"


def records(connection: sqlite3.Connection, query: RecordQuery) -> Page:
    sql, params = listing.records_sql(query, mark)
    return listing.record_page(connection.execute(sql, params).fetchall(), query.limit)


def lineage(connection: sqlite3.Connection, dlq_id: str) -> list[dict[str, Any]]:
    rows = connection.execute(listing.lineage_sql(mark), {"dlq_id": dlq_id}).fetchall()
    return [listing.record_item(row) for row in rows]


def batches(
    connection: sqlite3.Connection, state: str | None, cursor: str | None, limit: int
) -> Page:
    sql, params = listing.batches_sql(state, cursor, limit, mark)
    return listing.batch_page(connection.execute(sql, params).fetchall(), limit, _load)


def _load(text: Any) -> Any:
    return None if text is None else json.loads(text)


def groups(connection: sqlite3.Connection, limit: int) -> list[dict[str, Any]]:
    rows = connection.execute(
        f"SELECT {_KEY_COLUMNS}, n, first_seen, last_seen FROM group_counts WHERE n > 0"
    ).fetchall()
    return listing.groups(rows, limit)


def outcomes(connection: sqlite3.Connection) -> dict[str, dict[str, int]]:
    rows = connection.execute(
        "SELECT rule, state, sum(n) FROM group_counts WHERE rule <> '' GROUP BY rule, state"
    ).fetchall()
    return listing.outcomes(rows)


def activity(connection: sqlite3.Connection, now: float, minutes: int) -> dict[str, list[int]]:
    """Two index ranges: callbacks_by_decision over the decisions' times, and
    callbacks_by_update over the `done` ones' (a record's last change is its `done`)."""
    start = now - 60 * minutes
    bounds = {"start": start, "now": now}
    decided = connection.execute(
        "SELECT CAST((decided_at - :start) / 60 AS INTEGER) AS minute, count(*) "
        "FROM callbacks WHERE decided_at >= :start AND decided_at < :now GROUP BY minute",
        bounds,
    ).fetchall()
    recovered = connection.execute(
        "SELECT CAST((updated_at - :start) / 60 AS INTEGER) AS minute, count(*) "
        "FROM callbacks WHERE state = 'done' AND updated_at >= :start AND updated_at < :now "
        "GROUP BY minute",
        bounds,
    ).fetchall()
    return {
        "decided": listing.per_minute(decided, minutes),
        "recovered": listing.per_minute(recovered, minutes),
    }
