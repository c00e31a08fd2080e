"""The pipeline's statements over the PostgreSQL store: leases, outcomes, batches, records.

Async functions of a connection, run by `PostgresStore` inside a transaction (`_write`)
or outside one (`_run`, autocommit reads). The semantics are the SQLite store's
(`daemon.store.sqlite.pipeline`, and `records.py` for the states); what differs is what
several replicas sharing one database need, at READ COMMITTED:

* claim skips the rows another replica is claiming (`FOR UPDATE SKIP LOCKED`), so that
  claimers neither wait on each other nor lease one dlqId twice;
* settle counts a workflow's recoveries under an advisory lock on its key, so that two
  replicas cannot both find a budget not yet spent;
* open_batch locks the rows it moves, in dlqId order, so that a dlqId is in one batch
  at a time; settle_batch locks its batch first, so that a batch is settled once;
* counts by state are deltas appended by triggers (schema.py), summed when read and
  folded back into one row a state by `status`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from daemon.store import records
from daemon.store.postgres import endpoints, lineage, notify
from daemon.store.postgres.db import Connection, jsonb
from daemon.store.records import (
    STATES,
    UNFINISHED,
    BatchEnd,
    BatchRecord,
    Claimed,
    Outcome,
    Pending,
    RecordRow,
    Settled,
    State,
    check_final,
)

# Appends the event parameter (a jsonb object) to a record's history.
_HISTORY = "history = history || jsonb_build_array(%(event)s::jsonb)"
# The advisory lock (pg_try_advisory_xact_lock) of folding the count deltas: "rdcounts".
FOLD_LOCK = 0x7264636F756E7473


async def claim(
    connection: Connection, owner: str, limit: int, lease: float, now: float, bodies: bool = False
) -> list[Claimed]:
    """Lease up to `limit` received dlqIds that are free (no lease, or one that expired,
    or a retry that is due), oldest first; with `bodies`, the signed callbacks' bodies.

    SKIP LOCKED: a row another replica's claim (or a settle) holds is passed over, not
    waited for, and the scan goes on to the next, so concurrent claimers take disjoint
    rows. A row claimed and committed by another after this statement's snapshot is
    locked, then re-checked at READ COMMITTED: its lease is no longer due, so it is
    left out. (One read of callbacks_by_state in order, passing over the rows in backoff:
    not SQLite's two limited reads of `claimable` unioned, as those would each stop at
    `limit` rows that another claimer may hold.)"""
    cursor = await connection.execute(
        "WITH picked AS ("
        "  SELECT dlq_id FROM callbacks WHERE state = 'received' "
        "  AND (lease_until IS NULL OR lease_until <= %(now)s) "
        "  ORDER BY received_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
        "), claimed AS ("
        "  UPDATE callbacks SET lease_owner = %(owner)s, lease_until = %(until)s, "
        "  tries = tries + 1 FROM picked WHERE callbacks.dlq_id = picked.dlq_id "
        "  RETURNING callbacks.dlq_id, callbacks.tries, callbacks.received_at, "
        "  CASE WHEN %(bodies)s AND callbacks.verified THEN callbacks.body END AS signed, "
        "  callbacks.refusals"
        ") SELECT dlq_id, tries, signed, refusals FROM claimed ORDER BY received_at, dlq_id",
        {"owner": owner, "until": now + lease, "now": now, "limit": limit, "bodies": bodies},
    )
    rows = await cursor.fetchall()
    return [
        Claimed(dlq_id, tries, _bytes(signed), refusals) for dlq_id, tries, signed, refusals in rows
    ]


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)  # psycopg gives bytea as memoryview


async def settle(
    connection: Connection, owner: str, outcomes: Sequence[Outcome], now: float
) -> Settled:
    """Record the outcomes of `owner`'s leases (ones it no longer holds are left alone);
    a recovery over its rule's budget becomes `skipped`."""
    # The advisory locks the chunk needs, up front and always in one order (workflows,
    # then endpoints, each by key), so that two replicas' settles cannot deadlock.
    locked = await _lock_budgets(connection, outcomes)
    failures = [outcome.endpoint_failure for outcome in outcomes if outcome.endpoint_failure]
    await endpoints.lock_endpoints(connection, failures)
    settled = Settled([], [])
    for outcome in outcomes:
        held, state, stopped = await _settle_one(connection, owner, outcome, now, locked)
        if held and outcome.notifications:  # the outbox: in the decision's own commit
            await notify.enqueue(connection, outcome.dlq_id, outcome.notifications, now)
        if held:
            records.tally(settled, outcome, state, stopped, now)
    return settled


async def _lock_budgets(connection: Connection, outcomes: Sequence[Outcome]) -> set[str]:
    """Take the locks of the workflows whose budgets the chunk counts (`_lock_workflow`)
    up front, in key order: taken one by one as the outcomes come, two replicas settling
    chunks with the same workflows in opposite orders would deadlock. The keys locked.
    (`_settle_one` finds each key again, as SQLite's settle does, after the outcomes
    before it are recorded.)"""
    keys = set()
    for outcome in outcomes:
        if outcome.state == "decided" and outcome.budget and outcome.workflow_run_id:
            run, since = outcome.workflow_run_id, outcome.budget.since
            keys.add(await lineage.workflow_key(connection, run, outcome.fingerprint, since))
    for key in sorted(keys):
        await _lock_workflow(connection, key)
    return keys


async def _lock_workflow(connection: Connection, key: str) -> None:
    """Hold the workflow `key` until the transaction ends: counting its recoveries and
    deciding on the count must not interleave with another replica's doing the same for
    the same workflow, or both would find the last recovery of the budget free. The
    other waits, then (a new statement, a new snapshot) counts this one's decision."""
    await connection.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))


async def _settle_one(
    connection: Connection, owner: str, outcome: Outcome, now: float, locked: set[str]
) -> tuple[bool, State, bool]:
    """Record one outcome, if `owner` still holds its lease: whether it did, the state
    recorded, and whether a budget stopped it. `locked`: the workflows locked already."""
    state, reason = outcome.state, outcome.reason
    budget = outcome.budget
    key, stopped = None, False
    if outcome.workflow_run_id:
        since = budget.since if budget else now
        key = await lineage.workflow_key(connection, outcome.workflow_run_id,
                                         outcome.fingerprint, since)  # fmt: skip
    if state == "decided" and budget is not None and key is not None:
        if key not in locked:
            # The chunk's own decisions made another line the likeliest (rare): out of
            # order, this lock could deadlock (PostgreSQL would end the settle with an
            # error, to be tried again); without it, the budget could be overrun.
            await _lock_workflow(connection, key)
        made = await lineage.recoveries(connection, key, budget.since, exclude=outcome.dlq_id)
        if made >= budget.max_recoveries:
            state, stopped = "skipped", True
            reason = records.over_budget_reason(key, outcome.workflow_run_id, made)
    if outcome.endpoint_failure is not None:  # remove-endpoint: counted in this commit
        counted = await endpoints.count_failure(connection, owner, outcome, now)
        state, reason = counted or (state, reason)
    return (
        await _record_outcome(connection, owner, outcome, state, reason, key, now),
        state,
        stopped,
    )


async def _record_outcome(
    connection: Connection,
    owner: str,
    outcome: Outcome,
    state: State,
    reason: str | None,
    key: str | None,
    now: float,
) -> bool:
    """Write the outcome as `state` with `reason`, if `owner` still holds the lease."""
    cursor = await connection.execute(
        "UPDATE callbacks SET state = %(state)s, reason = %(reason)s, rule = %(rule)s, "
        "action = %(action)s, matched = %(matched)s, overrides = %(overrides)s, "
        "workflow_run_id = %(run)s, workflow_key = %(key)s, fingerprint = %(fingerprint)s, "
        "would = %(would)s, facts = %(facts)s, shadow = %(shadow)s, "
        # A decided dlqId stays its decider's, for its batcher (replicas.py).
        "lease_owner = CASE WHEN %(state)s = 'decided' THEN %(owner)s END, "
        "lease_until = %(retry_at)s, refusals = refusals + %(refused)s, "
        "waits_for_service = %(waits)s, "
        "calls = calls || %(calls)s, "
        "decided_at = CASE WHEN %(rule)s::text IS NULL THEN decided_at ELSE %(now)s END, "
        f"updated_at = %(now)s, {_HISTORY} "
        "WHERE dlq_id = %(dlq_id)s AND state = 'received' AND lease_owner = %(owner)s",
        {
            "state": state,
            "reason": reason,
            "rule": outcome.rule,
            "action": outcome.action,
            "matched": records.json_text(outcome.matched),
            "overrides": outcome.overrides,
            "run": outcome.workflow_run_id,
            "key": key,
            "fingerprint": outcome.fingerprint,
            "would": records.json_text(outcome.would),
            "facts": outcome.facts,
            "shadow": outcome.shadow,
            "retry_at": outcome.retry_at,
            "refused": int(outcome.refused),
            "waits": outcome.waits_for_service,
            "calls": jsonb(list(outcome.calls)),
            "event": jsonb(records.event(state, now, reason=reason, rule=outcome.rule)),
            "now": now,
            "dlq_id": outcome.dlq_id,
            "owner": owner,
        },
    )
    return cursor.rowcount > 0


async def retry_now(connection: Connection, now: float, limit: int | None = None) -> int:
    """Make due now the received dlqIds in a backoff that waits for the service (at most
    `limit`, the soonest due first): free (no lease), so that claims take them with the
    others, oldest first. Rows another replica's claim holds are passed over (SKIP
    LOCKED): claimed, they have a lease."""
    cursor = await connection.execute(
        "UPDATE callbacks SET lease_until = NULL WHERE dlq_id IN ("
        "  SELECT dlq_id FROM callbacks WHERE state = 'received' AND lease_until > %s "
        "  AND lease_owner IS NULL AND waits_for_service ORDER BY lease_until LIMIT %s "
        "  FOR UPDATE SKIP LOCKED)",
        (now, limit),
    )
    return cursor.rowcount


async def pending(connection: Connection, owner: str | None) -> list[Pending]:
    """The decided dlqIds `owner` holds, those nobody holds taken over first (every one
    when `owner` is None)."""
    if owner is None:
        cursor = await connection.execute(
            "SELECT dlq_id, action, overrides, rule, decided_at FROM callbacks "
            "WHERE state = 'decided' ORDER BY decided_at, dlq_id"
        )
        return [records.pending_from(row) for row in await cursor.fetchall()]
    await connection.execute(
        "UPDATE callbacks SET lease_owner = %s WHERE state = 'decided' AND lease_owner IS NULL",
        (owner,),
    )
    cursor = await connection.execute(
        "SELECT dlq_id, action, overrides, rule, decided_at FROM callbacks "
        "WHERE state = 'decided' AND lease_owner = %s ORDER BY decided_at, dlq_id",
        (owner,),
    )
    return [records.pending_from(row) for row in await cursor.fetchall()]


async def open_batch(
    connection: Connection,
    action: str,
    overrides: str,
    dlq_ids: Sequence[str],
    now: float,
    owner: str | None,
) -> BatchRecord | None:
    """Persist a batch of those of `dlq_ids` still decided (a dlqId is in one batch at a
    time), held by `owner`; None when none is. Not a send yet: see `mark_sending` and
    `settle_batch`.

    Two replicas opening batches over the same dlqIds: the rows are locked (in dlqId
    order, so that the two cannot deadlock) before they are moved; the second waits for
    the first's commit, then re-checks `state = 'decided'` on the rows as committed
    (READ COMMITTED) and leaves out those now batched."""
    cursor = await connection.execute(
        "INSERT INTO batches (action, overrides, state, dlq_ids, created_at, owner) "
        "VALUES (%s, %s, 'pending', '[]', %s, %s) RETURNING id",
        (action, overrides, now, owner),
    )
    row = await cursor.fetchone()
    assert row is not None
    batch_id: int = row[0]
    cursor = await connection.execute(
        "WITH locked AS ("
        "  SELECT dlq_id FROM callbacks WHERE state = 'decided' AND dlq_id = ANY(%(ids)s::text[]) "
        "  ORDER BY dlq_id FOR UPDATE"
        ") UPDATE callbacks SET state = 'batched', updated_at = %(now)s, lease_owner = NULL, "
        "batch_ids = batch_ids || jsonb_build_array(%(batch)s::bigint), "
        f"{_HISTORY} "
        "FROM locked WHERE callbacks.dlq_id = locked.dlq_id AND callbacks.state = 'decided' "
        "RETURNING callbacks.dlq_id",
        {
            "ids": list(dlq_ids),
            "now": now,
            "batch": batch_id,
            "event": jsonb(records.event("batched", now, batch=batch_id)),
        },
    )
    taken = {dlq_id for (dlq_id,) in await cursor.fetchall()}
    if not taken:
        await connection.execute("DELETE FROM batches WHERE id = %s", (batch_id,))
        return None
    ordered = [dlq_id for dlq_id in dlq_ids if dlq_id in taken]
    await connection.execute(
        "UPDATE batches SET dlq_ids = %s WHERE id = %s", (jsonb(ordered), batch_id)
    )
    return BatchRecord(batch_id, action, overrides, tuple(ordered), now)


async def mark_sending(
    connection: Connection, batch_id: int, now: float, owner: str | None
) -> bool:
    """The batch's call is about to go out: from now on it may reach the service, so a
    crash leaves a batch to be checked, not simply queued again. False, and the call
    must not go out, when the batch is settled or no longer `owner`'s (declared gone,
    its batch adopted by another replica)."""
    cursor = await connection.execute(
        "UPDATE batches SET sent_at = coalesce(sent_at, %s) "
        "WHERE id = %s AND state = 'pending' AND (%s::text IS NULL OR owner = %s)",
        (now, batch_id, owner, owner),
    )
    return cursor.rowcount > 0


async def settle_batch(connection: Connection, batch_id: int, end: BatchEnd) -> Settled:
    """Close a pending batch: its dlqIds `done`, decided `again` (to be sent in a later
    batch), or `failed` or `gone` with `reason`; returns those decided again, with their
    rules, and those it made failed. `sent`: the call may have reached the service, and
    counts as a send for every dlqId of the batch; False when it was refused before the
    service acted or never made. A batch already settled is left as it is (its dlqIds
    may be in another batch now).

    The batch's row is locked first: a second settle of it (another replica's) waits,
    then finds it settled, so its sends are counted once."""
    done, again, failed, gone, reason = end.done, end.again, end.failed, end.gone, end.reason
    runs, calls, sent, now = end.runs, end.calls, end.sent, end.now
    cursor = await connection.execute(
        "SELECT state, dlq_ids FROM batches WHERE id = %s FOR UPDATE", (batch_id,)
    )
    found = await cursor.fetchone()
    if found is None or found[0] != "pending":
        return Settled([], [])
    await connection.execute(
        "UPDATE batches SET state = 'settled', settled_at = %(now)s, reason = %(reason)s, "
        "runs = %(runs)s, calls = %(calls)s, "
        "sent_at = CASE WHEN %(sent)s THEN coalesce(sent_at, %(now)s) ELSE sent_at END "
        "WHERE id = %(id)s",
        {
            "now": now,
            "reason": reason,
            "runs": jsonb(list(runs)),
            "calls": jsonb(list(calls)),
            "sent": sent,
            "id": batch_id,
        },
    )
    await lineage.record_runs(connection, batch_id, runs, now)
    if sent:
        await connection.execute(
            "UPDATE callbacks SET sends = sends + 1 WHERE dlq_id = ANY(%s::text[])",
            (list(found[1]),),
        )
    again = list(again)
    moves = (
        ("done", done, None),
        ("decided", again, reason),
        ("failed", failed, reason),
        ("gone", gone, reason),
    )
    moved = {
        state: await _move(connection, batch_id, state, list(dlq_ids), why, now)
        for state, dlq_ids, why in moves
    }
    return Settled(await _decided(connection, again), [], moved["failed"])


async def _move(
    connection: Connection,
    batch_id: int,
    state: str,
    dlq_ids: list[str],
    reason: str | None,
    now: float,
) -> list[tuple[str, str]]:
    """Those of `dlq_ids` still batched move to `state`, with `reason`; those moved, with
    their rules ("" for none)."""
    if not dlq_ids:
        return []
    cursor = await connection.execute(
        "UPDATE callbacks SET state = %(state)s, reason = %(reason)s, updated_at = %(now)s, "
        # Decided again: the batch's owner queues them (replicas.py).
        "lease_owner = CASE WHEN %(state)s = 'decided' "
        "  THEN (SELECT owner FROM batches WHERE id = %(batch)s) END, "
        f"{_HISTORY} WHERE dlq_id = ANY(%(ids)s::text[]) AND state = 'batched' "
        "RETURNING dlq_id, coalesce(rule, '')",
        {
            "state": state,
            "reason": reason,
            "now": now,
            "event": jsonb(records.event(state, now, batch=batch_id, reason=reason)),
            "ids": dlq_ids,
            "batch": batch_id,
        },
    )
    return [(dlq_id, rule) for dlq_id, rule in await cursor.fetchall()]


async def _decided(connection: Connection, dlq_ids: Iterable[str]) -> list[Pending]:
    """Those of `dlq_ids` that are decided, as the batcher queues them."""
    cursor = await connection.execute(
        "SELECT dlq_id, action, overrides, rule, decided_at FROM callbacks "
        "WHERE dlq_id = ANY(%s::text[]) AND state = 'decided' "
        "ORDER BY decided_at, dlq_id",
        (list(dlq_ids),),
    )
    return [records.pending_from(row) for row in await cursor.fetchall()]


async def unsettled_batches(connection: Connection, owner: str | None) -> list[BatchRecord]:
    """The unsettled batches `owner` holds, those nobody holds adopted first (every one
    when `owner` is None). A batch whose owner is alive is never adopted: it may be
    sending it right now."""
    if owner is not None:
        await connection.execute(
            "UPDATE batches SET owner = %s WHERE state = 'pending' AND owner IS NULL", (owner,)
        )
    cursor = await connection.execute(
        "SELECT id, action, overrides, dlq_ids, created_at, sent_at FROM batches "
        "WHERE state = 'pending' AND (%s::text IS NULL OR owner = %s) ORDER BY id",
        (owner, owner),
    )
    return [records.batch_from(row, records.decoded) for row in await cursor.fetchall()]


async def sends(connection: Connection, dlq_ids: Sequence[str]) -> dict[str, int]:
    cursor = await connection.execute(
        "SELECT dlq_id, sends FROM callbacks WHERE dlq_id = ANY(%s::text[])", (list(dlq_ids),)
    )
    return {dlq_id: count for dlq_id, count in await cursor.fetchall()}


async def record(connection: Connection, dlq_id: str) -> dict[str, Any] | None:
    """Everything known about one dlqId, as `/api/v1/dlq/{dlqId}` answers it. (jsonb
    columns come back as Python values; `matched`, `would` and `overrides` are text.)"""
    cursor = await connection.execute(
        "SELECT dlq_id, state, reason, rule, action, matched, overrides, workflow_run_id, "
        "would, tries, refusals, sends, batch_ids, calls, history, received_at, decided_at, "
        "updated_at "
        "FROM callbacks WHERE dlq_id = %s",
        (dlq_id,),
    )
    row = await cursor.fetchone()
    if row is None:
        return None
    found = RecordRow(*row)
    return records.record_json(found, await _batches(connection, found.batch_ids), records.decoded)


async def _batches(connection: Connection, batch_ids: list[int]) -> list[dict[str, Any]]:
    """The batches a record was in, in the order it was in them."""
    cursor = await connection.execute(
        "SELECT id, action, state, created_at, sent_at, settled_at, reason, runs, calls, "
        "jsonb_array_length(dlq_ids) FROM batches WHERE id = ANY(%s::bigint[])",
        (batch_ids,),
    )
    found = {row[0]: row for row in await cursor.fetchall()}
    batches = []
    for batch_id in batch_ids:
        if batch_id in found:  # a batch whose dlqIds were all pruned is pruned with them
            batches.append(records.batch_json(found[batch_id], records.decoded))
    return batches


async def callback(connection: Connection, dlq_id: str) -> tuple[Any, ...] | None:
    """The stored callback's row: dlqId, body, received_at, verified."""
    cursor = await connection.execute(
        "SELECT dlq_id, body, received_at, verified FROM callbacks WHERE dlq_id = %s", (dlq_id,)
    )
    return await cursor.fetchone()


async def inbox_depth(connection: Connection) -> int:
    cursor = await connection.execute(
        "SELECT coalesce(sum(n), 0) FROM state_count_deltas WHERE state = 'received'"
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def status(connection: Connection, now: float) -> dict[str, Any]:
    """Counts by state, batches not yet settled, and the age of the oldest dlqId not in
    a final state. A few index reads, and the deltas since the last fold: a scrape runs
    it, so it folds them too (`_fold`), to keep them few."""
    async with connection.transaction():
        await _fold(connection)
    counts: dict[str, int] = dict.fromkeys(STATES, 0)
    cursor = await connection.execute("SELECT state, sum(n) FROM state_count_deltas GROUP BY state")
    counts.update((state, int(n)) for state, n in await cursor.fetchall())
    cursor = await connection.execute("SELECT count(*) FROM batches WHERE state = 'pending'")
    row = await cursor.fetchone()
    batches = int(row[0]) if row else 0
    # One min() per state, each the first entry of callbacks_by_state: min() over
    # `state IN (...)` would read every pending row.
    cursor = await connection.execute(
        "SELECT min(oldest) FROM ("
        + " UNION ALL ".join(
            f"SELECT min(received_at) AS oldest FROM callbacks WHERE state = '{state}'"
            for state in UNFINISHED
        )
        + ") AS unfinished"
    )
    row = await cursor.fetchone()
    oldest = row[0] if row else None
    return records.status_json(counts, batches, oldest, now)


async def _fold(connection: Connection) -> None:
    """Replace the count deltas by one row a state (their sums), in one statement, unless
    another replica is folding (it would only wait, then find little to do). Deltas
    committed after this statement's snapshot are neither deleted nor summed: they stay,
    and are added to the next fold. A state whose sum is 0 keeps no row."""
    cursor = await connection.execute("SELECT pg_try_advisory_xact_lock(%s)", (FOLD_LOCK,))
    row = await cursor.fetchone()
    if not (row and row[0]):
        return
    await connection.execute(
        "WITH folded AS (DELETE FROM state_count_deltas RETURNING state, n) "
        "INSERT INTO state_count_deltas (state, n) "
        "SELECT state, sum(n) FROM folded GROUP BY state HAVING sum(n) <> 0"
    )


async def redrive(
    connection: Connection,
    states: Sequence[str],
    rule: str | None,
    since: float | None,
    dlq_ids: Sequence[str] | None,
    now: float,
    apply: bool,
) -> list[str]:
    """The dlqIds in one of the final `states`, decided by `rule` when given, final since
    `since` when given, among `dlq_ids` when given, in dlqId order; with `apply` they go
    back to `received` as if just arrived (tries, lease and reason cleared), with a
    `redriven` event in their history naming the state and reason they leave."""
    check_final(states)
    params: dict[str, Any] = {"states": list(states)}
    where = ["state = ANY(%(states)s::text[])"]
    if rule is not None:
        where.append("rule = %(rule)s")
        params["rule"] = rule
    if since is not None:
        where.append("updated_at >= %(since)s")
        params["since"] = since
    if dlq_ids is not None:
        where.append("dlq_id = ANY(%(ids)s::text[])")
        params["ids"] = list(dlq_ids)
    condition = " AND ".join(where)
    if not apply:
        cursor = await connection.execute(f"SELECT dlq_id FROM callbacks WHERE {condition}", params)
        return sorted(dlq_id for (dlq_id,) in await cursor.fetchall())
    cursor = await connection.execute(
        "UPDATE callbacks SET state = 'received', tries = 0, refusals = 0, lease_owner = NULL, "
        "lease_until = NULL, reason = NULL, updated_at = %(now)s, "
        # The state and reason left (the old values); a null reason is left out, as
        # _event leaves out empty members.
        "history = history || jsonb_build_array(%(event)s::jsonb "
        "  || jsonb_strip_nulls(jsonb_build_object('from', state, 'reason', reason))) "
        f"WHERE {condition} RETURNING dlq_id",
        {**params, "now": now, "event": jsonb({"state": "redriven", "at": now})},
    )
    return sorted(dlq_id for (dlq_id,) in await cursor.fetchall())
