"""Endpoint failures and removals over the PostgreSQL store (see `removals.py` for the
states, and `sqlite/endpoints.py`, whose semantics these functions share exactly).

Plain async functions of a connection, run by `PostgresStore` inside a transaction for
writes. A failure is counted in the transaction that settles its dlqId's decision
(`pipeline.settle`); reaching the threshold records the removal in that same
transaction. Everything that follows (the group read, the DELETE) is the remover's
(`daemon/endpoints/remover.py`), each step committed here before the next call.

Several replicas share the database, and unlike SQLite's one writer their transactions
run side by side (READ COMMITTED: each statement sees what was committed when it
began). What SQLite got from that one writer is taken here with advisory transaction
locks, released at commit:

* the endpoint's lock (`_lock_endpoint`) around counting its failures against the
  threshold, and around ending one of its removals: otherwise two replicas counting
  the endpoint's failures at once would each miss the other's uncommitted failure (the
  threshold passed by, no removal) or each see it committed and record a removal twice,
  and a failure counted while its removal ends could be left out of the evidence;
* one fixed lock (`CAP_LOCK`) around counting the removals of the last hour and
  recording the intent: otherwise two replicas could both take the last place under
  RECOVERYD_MAX_REMOVALS_PER_HOUR.

Locks are taken in one order, so that no two transactions wait for each other in a
cycle: endpoint locks (a settle takes all of its own first, by key: `lock_endpoints`),
then callbacks rows of dlqIds being settled, or else a removal's row and then the cap's
lock. (`finish` also updates the row of a dlqId already `done`, which nobody holds while
waiting for these locks.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from daemon.foundation.durations import shown_duration
from daemon.foundation.words import plural
from daemon.store import removals
from daemon.store.postgres.db import Connection, jsonb
from daemon.store.records import EndpointFailure, Outcome, State, decoded
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

# The advisory lock under which the removals of the last hour are counted against the
# cap and an intent recorded: "removals" in ASCII (schema.MIGRATION_LOCK is another).
CAP_LOCK = 0x72656D6F76616C73
# An endpoint's advisory lock key: the same expression wherever it is taken.
_ENDPOINT_KEY = "hashtextextended(%s || ' ' || %s, 0)"


async def _lock_endpoint(connection: Connection, group: str, endpoint: str) -> None:
    """Hold the endpoint's advisory lock until the transaction ends (see the module's
    docstring). The transaction that holds it already takes it again without waiting."""
    await connection.execute(f"SELECT pg_advisory_xact_lock({_ENDPOINT_KEY})", (group, endpoint))


async def lock_endpoints(connection: Connection, failures: Iterable[EndpointFailure]) -> None:
    """Take the locks of the endpoints of `failures` in the order of their keys, before
    any row is locked. A settle calls this before counting its failures: `count_failure`
    takes its endpoint's lock as it comes (again, without waiting, when held already),
    and two settles taking two endpoints' locks in opposite orders would deadlock
    (PostgreSQL would end one of them with an error)."""
    pairs = sorted({(failure.url_group, failure.endpoint) for failure in failures})
    if len(pairs) <= 1:  # one round trip
        for group, endpoint in pairs:
            await _lock_endpoint(connection, group, endpoint)
        return
    cursor = await connection.execute(
        "SELECT DISTINCT hashtextextended(g || ' ' || e, 0) AS key "
        "FROM unnest(%s::text[], %s::text[]) AS t(g, e) ORDER BY key",
        ([group for group, _ in pairs], [endpoint for _, endpoint in pairs]),
    )
    for (key,) in await cursor.fetchall():
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (key,))


async def count_failure(
    connection: Connection, owner: str, outcome: Outcome, now: float
) -> tuple[State, str] | None:
    """Count `outcome`'s failure against its endpoint, and record a removal when that
    reaches the threshold within the window; the dlqId's state and reason. None when
    `owner` no longer holds the dlqId's lease (whoever holds it counts it)."""
    failure = outcome.endpoint_failure
    assert failure is not None
    group, endpoint = failure.url_group, failure.endpoint
    # Before anything is read of the endpoint's failures and removals: the statements
    # below then see whatever another replica's count committed before it let go.
    await _lock_endpoint(connection, group, endpoint)
    # FOR UPDATE: the lease cannot pass to another replica before the settle's update of
    # this row, later in the same transaction.
    cursor = await connection.execute(
        "SELECT received_at FROM callbacks WHERE dlq_id = %s AND state = 'received' "
        "AND lease_owner = %s FOR UPDATE",
        (outcome.dlq_id, owner),
    )
    leased = await cursor.fetchone()
    if leased is None:
        return None
    where = f"endpoint {shown(failure.name, failure.url)} of URL Group {group}"
    # The failure's time is when its callback arrived: a fetch held up by an outage must
    # not spread failures that came together over a longer window.
    cursor = await connection.execute(
        "INSERT INTO endpoint_failures (dlq_id, url_group, endpoint, response_status, "
        "failed_at, counted_at, rule) VALUES (%s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (dlq_id) DO NOTHING RETURNING dlq_id",
        (outcome.dlq_id, group, endpoint, failure.response_status, leased[0], now, outcome.rule),
    )
    if await cursor.fetchone() is None:
        return "done", f"already counted as a failure of {where} (a dlqId counts once)"
    window = await _window(connection, group, endpoint, failure.within)
    counted = (
        f"counted {len(window)} of {failure.failures} {plural(failure.failures, 'failure')} within "
        f"{shown_duration(failure.within)} of {where}"
    )
    cursor = await connection.execute(
        f"SELECT id FROM endpoint_removals WHERE url_group = %s AND endpoint = %s "
        f"AND state IN ({OPEN_SQL}) ORDER BY id LIMIT 1",
        (group, endpoint),
    )
    under_way = await cursor.fetchone()
    if under_way is not None:
        return "done", f"{counted}; its removal {under_way[0]} is under way"
    if len(window) < failure.failures:
        return "done", counted
    assert outcome.rule is not None
    cursor = await connection.execute(
        "INSERT INTO endpoint_removals (url_group, endpoint, endpoint_name, endpoint_url, rule, "
        "threshold_failures, threshold_within, keep_last, dlq_id, state, evidence, created_at, "
        "updated_at) VALUES (%(group)s, %(endpoint)s, %(name)s, %(url)s, %(rule)s, "
        "%(failures)s, %(within)s, %(keep_last)s, %(dlq_id)s, 'pending', %(evidence)s, "
        "%(now)s, %(now)s) RETURNING id",
        {
            "group": group,
            "endpoint": endpoint,
            "name": failure.name,
            "url": failure.url,
            "rule": outcome.rule,
            "failures": failure.failures,
            "within": failure.within,
            "keep_last": int(failure.keep_last),
            "dlq_id": outcome.dlq_id,
            "evidence": jsonb([item.to_json() for item in window]),
            "now": now,
        },
    )
    inserted = await cursor.fetchone()
    assert inserted is not None
    removal_id = inserted[0]
    await connection.execute(
        "UPDATE endpoint_failures SET removal_id = %s WHERE dlq_id = ANY(%s)",
        (removal_id, [item.dlq_id for item in window]),
    )
    return "done", f"{counted}: the threshold is reached; removal {removal_id} is under way"


async def _window(
    connection: Connection, group: str, endpoint: str, within: float
) -> list[Evidence]:
    """The failures of the endpoint not used up yet, within `within` of the latest."""
    # COLLATE "C": dlqIds that tie on time in byte order, as SQLite orders them.
    cursor = await connection.execute(
        "SELECT dlq_id, response_status, failed_at FROM endpoint_failures "
        "WHERE url_group = %s AND endpoint = %s AND removal_id IS NULL "
        'ORDER BY failed_at, dlq_id COLLATE "C"',
        (group, endpoint),
    )
    rows = await cursor.fetchall()
    return removals.window(rows, within)


async def due(connection: Connection, now: float) -> list[Removal]:
    """The removals not finished whose next step is due, oldest first."""
    cursor = await connection.execute(
        f"SELECT {COLUMNS} FROM endpoint_removals "
        f"WHERE state IN ({OPEN_SQL}) AND (retry_at IS NULL OR retry_at <= %s) ORDER BY id",
        (now,),
    )
    return [removals.removal(row) for row in await cursor.fetchall()]


async def get(connection: Connection, removal_id: int) -> Removal | None:
    cursor = await connection.execute(
        f"SELECT {COLUMNS} FROM endpoint_removals WHERE id = %s", (removal_id,)
    )
    row = await cursor.fetchone()
    return None if row is None else removals.removal(row)


async def _locked(connection: Connection, removal_id: int) -> Removal | None:
    """The removal, its endpoint's lock and its row's held until the transaction ends
    (in that order, the module's), as it stands once any other replica's change to it
    is committed."""
    cursor = await connection.execute(
        "SELECT url_group, endpoint FROM endpoint_removals WHERE id = %s", (removal_id,)
    )
    row = await cursor.fetchone()
    if row is None:
        return None
    await _lock_endpoint(connection, row[0], row[1])
    cursor = await connection.execute(
        f"SELECT {COLUMNS} FROM endpoint_removals WHERE id = %s FOR UPDATE", (removal_id,)
    )
    row = await cursor.fetchone()
    return None if row is None else removals.removal(row)


async def defer(
    connection: Connection,
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
    await connection.execute(
        "UPDATE endpoint_removals SET tries = tries + %s, retry_at = %s, reason = %s, "
        "updated_at = %s "
        f"WHERE id = %s AND state IN ({OPEN_SQL})",
        (int(tried), retry_at, reason, now, removal_id),
    )
    await _add_calls(connection, removal_id, calls)


async def intend(
    connection: Connection,
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
    the last hour: then it ends `capped`. Counted and recorded in one transaction under
    CAP_LOCK, so two removals, from any replicas, can never both take the last place
    under the cap."""
    # The endpoint's lock first, though only `finish` needs it, for the locks' order.
    removal = await _locked(connection, removal_id)
    if removal is None or removal.state != "pending":
        return removal
    # Held to the commit of the intent: the next replica's count then includes it.
    await connection.execute("SELECT pg_advisory_xact_lock(%s)", (CAP_LOCK,))
    cursor = await connection.execute(
        "SELECT count(*) FROM endpoint_removals "
        f"WHERE intended_at >= %s AND state IN ({COUNTED_SQL})",
        (now - HOUR,),
    )
    counted = await cursor.fetchone()
    made = counted[0] if counted else 0
    if made >= max_per_hour:
        reason = removals.capped_reason(made, max_per_hour, removal.url_group, name, url)
        await finish(connection, removal_id, "capped", reason, calls=calls, now=now)
    else:
        await connection.execute(
            "UPDATE endpoint_removals SET state = 'removing', intended_at = %s, "
            "endpoint_name = %s, endpoint_url = %s, tries = 0, retry_at = NULL, reason = NULL, "
            "updated_at = %s WHERE id = %s",
            (now, name, url, now, removal_id),
        )
        await _add_calls(connection, removal_id, calls)
    return await get(connection, removal_id)


async def finish(
    connection: Connection,
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
    its final state and reason, in the same transaction. Under the endpoint's lock: a
    failure being counted meanwhile is either seen here or sees the removal ended."""
    removal = await _locked(connection, removal_id)
    if removal is None or removal.state not in OPEN:
        return False
    cursor = await connection.execute(
        "SELECT created_at FROM endpoint_removals WHERE id = %s", (removal_id,)
    )
    row = await cursor.fetchone()
    assert row is not None
    cursor = await connection.execute(
        "UPDATE endpoint_failures SET removal_id = %s "
        "WHERE url_group = %s AND endpoint = %s AND removal_id IS NULL AND counted_at >= %s "
        "RETURNING dlq_id, response_status, failed_at",
        (removal_id, removal.url_group, removal.endpoint, row[0]),
    )
    later = await cursor.fetchall()
    items = removals.later_evidence(later)
    await connection.execute(
        "UPDATE endpoint_removals SET state = %s, reason = %s, evidence = evidence || %s, "
        "retry_at = NULL, finished_at = %s, updated_at = %s WHERE id = %s",
        (result, reason, jsonb(items), now, now, removal_id),
    )
    await _add_calls(connection, removal_id, calls)
    state, told = DLQ_STATE[result], f"{reason} (removal {removal_id})"
    event = {"state": state, "at": now, "reason": told, "removal": removal_id}
    await connection.execute(
        "UPDATE callbacks SET state = %s, reason = %s, updated_at = %s, "
        "history = history || jsonb_build_array(%s::jsonb) WHERE dlq_id = %s AND state = 'done'",
        (state, told, now, jsonb(event), removal.dlq_id),
    )
    return True


async def _add_calls(
    connection: Connection, removal_id: int, calls: Sequence[dict[str, Any]]
) -> None:
    if calls:
        await connection.execute(
            "UPDATE endpoint_removals SET calls = calls || %s WHERE id = %s",
            (jsonb(list(calls)), removal_id),
        )


async def begin_restore(connection: Connection, group: str, name: str, now: float) -> Removal:
    """The last removal of the endpoint `name` (its name, or its url when it has none)
    from `group`, now marked as being restored; RestoreRefused when there is none or it
    was restored already. A restore cut short stays `restoring` and may be run again:
    adding an endpoint the group already has changes nothing."""
    cursor = await connection.execute(
        f"SELECT {COLUMNS}, restore_state, restored_at FROM endpoint_removals "
        "WHERE url_group = %s AND state = 'removed' AND (endpoint_name = %s OR "
        "(endpoint_name IS NULL AND endpoint_url = %s)) ORDER BY id DESC LIMIT 1 FOR UPDATE",
        (group, name, name),
    )
    row = await cursor.fetchone()
    removal = removals.restorable(row, group, name)
    await connection.execute(
        "UPDATE endpoint_removals SET restore_state = 'restoring', updated_at = %s WHERE id = %s",
        (now, removal.id),
    )
    return removal


async def finish_restore(
    connection: Connection,
    removal_id: int,
    *,
    restored: bool,
    reason: str,
    calls: Sequence[dict[str, Any]],
    now: float,
) -> None:
    """The restore went through, or did not (the removal can be restored again)."""
    await connection.execute(
        "UPDATE endpoint_removals SET restore_state = %s, restore_reason = %s, "
        "restored_at = CASE WHEN %s THEN %s ELSE restored_at END, updated_at = %s WHERE id = %s",
        ("restored" if restored else None, reason, restored, now, now, removal_id),
    )
    await _add_calls(connection, removal_id, calls)


async def listed(
    connection: Connection, group: str | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """The latest `limit` removals (of `group` when given), oldest first, as
    `/api/v1/removals` answers them."""
    where, params = ("WHERE url_group = %s", (group,)) if group is not None else ("", ())
    cursor = await connection.execute(
        f"SELECT {LISTED_COLUMNS} FROM endpoint_removals {where} ORDER BY id DESC LIMIT %s",
        (*params, limit),
    )
    rows = await cursor.fetchall()
    # jsonb: psycopg hands it out as Python values
    return [removals.listed(row, load=decoded) for row in reversed(rows)]
