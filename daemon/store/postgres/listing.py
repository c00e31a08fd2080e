"""The listings over the PostgreSQL store (daemon/store/listing.py says what they share):
the records and batches a page at a time, the failure groups and each rule's outcomes
from `group_count_deltas`, and the activity per minute.

The groups' counts are kept as deltas, as the counts by state are (schema.py says why:
every replica's transactions would queue on the few rows of a busy group), appended by
statement triggers and folded back when read.
"""

from __future__ import annotations

import json
from typing import Any

from daemon.store import listing
from daemon.store.interface import Page, RecordQuery
from daemon.store.postgres.db import Connection

# The advisory lock of a fold of the groups' deltas: "rdgroups" in ASCII.
FOLD_LOCK = 0x726467726F757073
_KEY = "url_group, endpoint, url, status, rule, state"
# A record's group key, of a row of `inserted` or `deleted` (the statement's rows).
_ROW_KEY = "url_group, endpoint, CASE WHEN url_group IS NULL THEN url END, status, rule, state"


def _delta(rows: str, sign: str, seen: bool) -> str:
    times = "min(received_at), max(received_at)" if seen else "NULL::float8, NULL::float8"
    return f"SELECT {_ROW_KEY}, {sign}count(*), {times} FROM {rows} GROUP BY 1, 2, 3, 4, 5, 6"


_APPEND = f"INSERT INTO group_count_deltas ({_KEY}, n, first_seen, last_seen) "

_CUT = listing.MAX_LISTED  # the listed texts' length

# Migration 6: see sqlite/listing.py's SCHEMA (the same columns and indexes, the same
# backfill from the bodies stored: a body that is not JSON in UTF-8 leaves them NULL).
# batches_by_state gains the id, for the keyset's order of list_batches.
SCHEMA = f"""
    ALTER TABLE callbacks ADD COLUMN url text, ADD COLUMN url_group text,
        ADD COLUMN endpoint text, ADD COLUMN status integer;
    CREATE FUNCTION recoveryd_body_json(body bytea) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN
        RETURN convert_from(body, 'UTF8')::jsonb;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END $$;
    UPDATE callbacks SET
        url = CASE WHEN jsonb_typeof(j -> 'url') = 'string'
            THEN left(j ->> 'url', {_CUT}) END,
        url_group = CASE WHEN jsonb_typeof(j -> 'topicName') = 'string'
            THEN left(j ->> 'topicName', {_CUT}) END,
        endpoint = CASE WHEN jsonb_typeof(j -> 'endpointName') = 'string'
            THEN left(j ->> 'endpointName', {_CUT}) END,
        status = CASE WHEN (j ->> 'status') ~ '^[1-9][0-9][0-9]$'
            AND jsonb_typeof(j -> 'status') = 'number' THEN (j ->> 'status')::integer END
        FROM (SELECT dlq_id AS id, recoveryd_body_json(body) AS j FROM callbacks) AS parsed
        WHERE parsed.id = callbacks.dlq_id AND jsonb_typeof(parsed.j) = 'object';
    DROP FUNCTION recoveryd_body_json(bytea);
    {listing.INDEXES}
    DROP INDEX batches_by_state;
    CREATE INDEX batches_by_state ON batches (state, id);

    CREATE TABLE group_count_deltas (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        url_group text,
        endpoint text,
        url text,
        status integer,
        rule text,
        state text NOT NULL,
        n bigint NOT NULL,
        first_seen double precision,
        last_seen double precision
    );
    {_APPEND} {_delta("callbacks", "", True)};
    CREATE FUNCTION group_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {_APPEND} {_delta("inserted", "", True)};
        RETURN NULL;
    END $$;
    CREATE FUNCTION group_updated() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {_APPEND}
            SELECT {_KEY}, sum(n), min(first_seen), max(last_seen) FROM (
                {_delta("inserted", "", True)}
                UNION ALL
                {_delta("deleted", "-", False)}
            ) AS moves ({_KEY}, n, first_seen, last_seen)
            GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(n) <> 0;
        RETURN NULL;
    END $$;
    CREATE FUNCTION group_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {_APPEND} {_delta("deleted", "-", False)};
        RETURN NULL;
    END $$;
    CREATE TRIGGER callbacks_group_insert AFTER INSERT ON callbacks
        REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION group_inserted();
    CREATE TRIGGER callbacks_group_update AFTER UPDATE ON callbacks
        REFERENCING OLD TABLE AS deleted NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION group_updated();
    CREATE TRIGGER callbacks_group_delete AFTER DELETE ON callbacks
        REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION group_deleted();
"""


def mark(name: str) -> str:
    """A statement's placeholder for the parameter `name` (listing.Mark); replay uses it too."""
    return f"%({name})s"


async def records(connection: Connection, query: RecordQuery) -> Page:
    sql, params = listing.records_sql(query, mark)
    cursor = await connection.execute(sql.encode(), params)
    return listing.record_page(await cursor.fetchall(), query.limit)


async def lineage(connection: Connection, dlq_id: str) -> list[dict[str, Any]]:
    found = await connection.execute(listing.lineage_sql(mark).encode(), {"dlq_id": dlq_id})
    return [listing.record_item(row) for row in await found.fetchall()]


async def batches(
    connection: Connection, state: str | None, cursor: str | None, limit: int
) -> Page:
    sql, params = listing.batches_sql(state, cursor, limit, mark)
    found = await connection.execute(sql.encode(), params)
    return listing.batch_page(await found.fetchall(), limit, _load)


def _load(value: Any) -> Any:
    # jsonb arrives decoded; `overrides` is text holding JSON.
    return json.loads(value) if isinstance(value, str) else value


async def fold(connection: Connection) -> None:
    """Replace the groups' deltas by one row a group and state (their sums), unless
    another replica is folding; as pipeline._fold does for the counts by state."""
    async with connection.transaction():
        cursor = await connection.execute("SELECT pg_try_advisory_xact_lock(%s)", (FOLD_LOCK,))
        row = await cursor.fetchone()
        if not (row and row[0]):
            return
        await connection.execute(
            f"WITH folded AS (DELETE FROM group_count_deltas "
            f"RETURNING {_KEY}, n, first_seen, last_seen) "
            f"{_APPEND} SELECT {_KEY}, sum(n), min(first_seen), max(last_seen) FROM folded "
            "GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(n) <> 0".encode()
        )


async def groups(connection: Connection, limit: int) -> list[dict[str, Any]]:
    await fold(connection)
    cursor = await connection.execute(
        f"SELECT {_KEY}, sum(n), min(first_seen), max(last_seen) FROM group_count_deltas "
        "GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(n) <> 0".encode()
    )
    return listing.groups(await cursor.fetchall(), limit)


async def outcomes(connection: Connection) -> dict[str, dict[str, int]]:
    await fold(connection)
    cursor = await connection.execute(
        "SELECT rule, state, sum(n) FROM group_count_deltas WHERE rule IS NOT NULL "
        "GROUP BY rule, state"
    )
    return listing.outcomes(await cursor.fetchall())


async def activity(connection: Connection, now: float, minutes: int) -> dict[str, list[int]]:
    """Two index ranges, as sqlite/listing.py's activity."""
    bounds = {"start": now - 60 * minutes, "now": now}
    cursor = await connection.execute(
        "SELECT floor((decided_at - %(start)s) / 60)::integer AS minute, count(*) "
        "FROM callbacks WHERE decided_at >= %(start)s AND decided_at < %(now)s GROUP BY minute",
        bounds,
    )
    decided = await cursor.fetchall()
    cursor = await connection.execute(
        "SELECT floor((updated_at - %(start)s) / 60)::integer AS minute, count(*) "
        "FROM callbacks WHERE state = 'done' AND updated_at >= %(start)s "
        "AND updated_at < %(now)s GROUP BY minute",
        bounds,
    )
    recovered = await cursor.fetchall()
    return {
        "decided": listing.per_minute(decided, minutes),
        "recovered": listing.per_minute(recovered, minutes),
    }
