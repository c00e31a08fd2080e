"""The pipeline's statements over the SQLite store: leases, outcomes, batches, records.

Plain functions of a connection, run by `SQLiteStore` on its thread inside a
transaction (`_write`) or outside one (`_run`, reads). See `records.py` for the states.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from daemon.store import records
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
    check_final,
)
from daemon.store.sqlite import endpoints as endpoints
from daemon.store.sqlite import lineage as lineage
from daemon.store.sqlite import notify as notify

# What the pipeline adds to the schema of version 1 (migration 2, see sqlite.MIGRATIONS).
SCHEMA = """
    ALTER TABLE callbacks ADD COLUMN state TEXT NOT NULL DEFAULT 'received';
    ALTER TABLE callbacks ADD COLUMN lease_owner TEXT;
    ALTER TABLE callbacks ADD COLUMN lease_until REAL;
    ALTER TABLE callbacks ADD COLUMN tries INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE callbacks ADD COLUMN sends INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE callbacks ADD COLUMN reason TEXT;
    ALTER TABLE callbacks ADD COLUMN rule TEXT;
    ALTER TABLE callbacks ADD COLUMN action TEXT;
    ALTER TABLE callbacks ADD COLUMN matched TEXT;
    ALTER TABLE callbacks ADD COLUMN overrides TEXT;
    ALTER TABLE callbacks ADD COLUMN workflow_run_id TEXT;
    ALTER TABLE callbacks ADD COLUMN would TEXT;
    ALTER TABLE callbacks ADD COLUMN batch_ids TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE callbacks ADD COLUMN calls TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE callbacks ADD COLUMN history TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE callbacks ADD COLUMN decided_at REAL;
    ALTER TABLE callbacks ADD COLUMN updated_at REAL;
    CREATE INDEX callbacks_by_state ON callbacks (state, received_at);
    CREATE INDEX callbacks_by_run ON callbacks (workflow_run_id, decided_at);
    CREATE TABLE batches (
        id INTEGER PRIMARY KEY,
        action TEXT NOT NULL,
        overrides TEXT NOT NULL,
        state TEXT NOT NULL,
        dlq_ids TEXT NOT NULL,
        created_at REAL NOT NULL,
        settled_at REAL,
        runs TEXT NOT NULL DEFAULT '[]',
        calls TEXT NOT NULL DEFAULT '[]',
        reason TEXT
    );
    CREATE INDEX batches_by_state ON batches (state);
"""

# Migration 4: when a batch's call was about to go out. Batches left unsettled by an
# older recoveryd, which did not record it, are taken as possibly sent: checked with GETs.
SENT_AT = """
    ALTER TABLE batches ADD COLUMN sent_at REAL;
    UPDATE batches SET sent_at = created_at WHERE state = 'pending';
"""

# Migration 14: whether the callback's signature verified. Rows from before it count as
# unverified, so that RECOVERYD_FETCH=needed reads their DLQ messages as before.
VERIFIED = """
    ALTER TABLE callbacks ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;
"""

# Migration 15: the final answers (a 400...) a dlqId's reads got, apart from its tries: an
# outage's transient failures count as tries, and must not bring it nearer to `failed`.
# Rows from before it start at 0: their tries cannot be told apart, and starting over
# can only give a dlqId up to five more final answers, never fail one early.
REFUSALS = """
    ALTER TABLE callbacks ADD COLUMN refusals INTEGER NOT NULL DEFAULT 0;
"""

# Migration 5: the pending-work queries must not read the finished work, which is nearly
# all of the table. `claimable` holds only received rows (partial), ordered so that claim
# reads the free ones and the due ones without stepping over those in backoff or leased;
# `by_update` finds final records by when they became final (prune, redrive).
INDEXES = """
    CREATE INDEX callbacks_claimable ON callbacks (lease_until, received_at)
        WHERE state = 'received';
    CREATE INDEX callbacks_by_update ON callbacks (state, updated_at);
"""

# Migration 6: counts by state kept by triggers, so that a scrape reads a few rows instead
# of counting the whole table. Initialised from the rows already there.
COUNTS = """
    CREATE TABLE state_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO state_counts (state, n) SELECT state, count(*) FROM callbacks GROUP BY state;
    CREATE TRIGGER callbacks_count_insert AFTER INSERT ON callbacks BEGIN
        INSERT INTO state_counts (state, n) VALUES (NEW.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER callbacks_count_update AFTER UPDATE OF state ON callbacks
    WHEN OLD.state IS NOT NEW.state BEGIN
        UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;
        INSERT INTO state_counts (state, n) VALUES (NEW.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER callbacks_count_delete AFTER DELETE ON callbacks BEGIN
        UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;
    END;
"""

# Migration 16: whether a received dlqId's backoff waits for the service (a transient
# failure) rather than for itself; the service's return ends the first (`retry_now`).
# Rows from before it wait out their backoff, as they did.
WAITS_FOR_SERVICE = """
    ALTER TABLE callbacks ADD COLUMN waits_for_service INTEGER NOT NULL DEFAULT 0;
"""

_HISTORY = "history = json_insert(history, '$[#]', json(:event))"


def _event(state: str, at: float, **detail: Any) -> str:
    return json.dumps(records.event(state, at, **detail))


def release_leases(connection: sqlite3.Connection) -> int:
    """Free every lease: an SQLite store has one daemon, so at its start no worker holds
    one (a crashed one's would otherwise wait out its expiry)."""
    cursor = connection.execute(
        "UPDATE callbacks SET lease_owner = NULL, lease_until = NULL "
        "WHERE state = 'received' AND lease_owner IS NOT NULL"
    )
    return cursor.rowcount


def claim(
    connection: sqlite3.Connection,
    owner: str,
    limit: int,
    lease: float,
    now: float,
    bodies: bool = False,
) -> list[Claimed]:
    """Lease up to `limit` received dlqIds that are free (no lease, or one that expired,
    or a retry that is due), oldest first; with `bodies`, the signed callbacks' bodies.

    Two reads of the `claimable` index, the free rows and the due ones, each in order and
    limited: one `lease_until IS NULL OR lease_until <= now` would walk every received
    row, those in backoff included. INDEXED BY because, without statistics, SQLite
    prefers callbacks_by_state, which holds the rows in backoff too."""
    claimable = "FROM callbacks INDEXED BY callbacks_claimable WHERE state = 'received'"
    rows = connection.execute(
        "UPDATE callbacks SET lease_owner = :owner, lease_until = :until, tries = tries + 1 "
        "WHERE rowid IN (SELECT id FROM ("
        f"  SELECT * FROM (SELECT rowid AS id, received_at {claimable} "
        "    AND lease_until IS NULL ORDER BY received_at LIMIT :limit)"
        "  UNION ALL"
        f"  SELECT * FROM (SELECT rowid AS id, received_at {claimable} "
        "    AND lease_until <= :now ORDER BY received_at LIMIT :limit)"
        ") ORDER BY received_at LIMIT :limit) "
        "RETURNING dlq_id, tries, CASE WHEN :bodies AND verified THEN body END, refusals",
        {"owner": owner, "until": now + lease, "now": now, "limit": limit, "bodies": bodies},
    ).fetchall()
    return [Claimed(*row) for row in rows]


def settle(
    connection: sqlite3.Connection, owner: str, outcomes: Sequence[Outcome], now: float
) -> Settled:
    """Record the outcomes of `owner`'s leases (ones it no longer holds are left alone);
    a recovery over its rule's budget becomes `skipped`."""
    settled = Settled([], [])
    for outcome in outcomes:
        state, reason = outcome.state, outcome.reason
        budget = outcome.budget
        key, stopped = None, False
        if outcome.workflow_run_id:
            since = budget.since if budget else now
            key = lineage.workflow_key(connection, outcome.workflow_run_id, outcome.fingerprint,
                                       since)  # fmt: skip
        if state == "decided" and budget is not None and key is not None:
            made = lineage.recoveries(connection, key, budget.since, exclude=outcome.dlq_id)
            if made >= budget.max_recoveries:
                state, stopped = "skipped", True
                reason = records.over_budget_reason(key, outcome.workflow_run_id, made)
        if outcome.endpoint_failure is not None:  # remove-endpoint: counted in this commit
            counted = endpoints.count_failure(connection, owner, outcome, now)
            state, reason = counted or (state, reason)
        held = connection.execute(
            "UPDATE callbacks SET state = :state, reason = :reason, rule = :rule, "
            "action = :action, matched = :matched, overrides = :overrides, "
            "workflow_run_id = :run, workflow_key = :key, fingerprint = :fingerprint, "
            "would = :would, facts = :facts, shadow = :shadow, "
            "lease_owner = NULL, lease_until = :retry_at, refusals = refusals + :refused, "
            "waits_for_service = :waits, "
            "calls = :calls, "
            "decided_at = CASE WHEN :rule IS NULL THEN decided_at ELSE :now END, "
            f"updated_at = :now, {_HISTORY} "
            "WHERE dlq_id = :dlq_id AND state = 'received' AND lease_owner = :owner",
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
                "calls": json.dumps(_calls(connection, outcome.dlq_id) + list(outcome.calls)),
                "event": _event(state, now, reason=reason, rule=outcome.rule),
                "now": now,
                "dlq_id": outcome.dlq_id,
                "owner": owner,
            },
        ).rowcount
        if held and outcome.notifications:  # the outbox: in the decision's own commit
            notify.enqueue(connection, outcome.dlq_id, outcome.notifications, now)
        if held:
            records.tally(settled, outcome, state, stopped, now)
    return settled


def retry_now(connection: sqlite3.Connection, now: float, limit: int | None = None) -> int:
    """Make due now the received dlqIds in a backoff that waits for the service (at most
    `limit`, the soonest due first): free (no lease), so that claim takes them with the
    others, oldest first. A range of the `claimable` index: the retries still to come."""
    cursor = connection.execute(
        "UPDATE callbacks SET lease_until = NULL WHERE rowid IN ("
        "  SELECT rowid FROM callbacks INDEXED BY callbacks_claimable "
        "  WHERE state = 'received' AND lease_until > ? AND lease_owner IS NULL "
        "  AND waits_for_service ORDER BY lease_until LIMIT ?)",
        (now, -1 if limit is None else limit),
    )
    return cursor.rowcount


def _calls(connection: sqlite3.Connection, dlq_id: str) -> list[Any]:
    row = connection.execute("SELECT calls FROM callbacks WHERE dlq_id = ?", (dlq_id,)).fetchone()
    return list(json.loads(row[0])) if row else []


def pending(connection: sqlite3.Connection, owner: str | None = None) -> list[Pending]:
    """The decided dlqIds, oldest first (`owner`: one daemon has the store, all are its)."""
    rows = connection.execute(
        "SELECT dlq_id, action, overrides, rule, decided_at FROM callbacks "
        "WHERE state = 'decided' ORDER BY decided_at, dlq_id"
    ).fetchall()
    return [records.pending_from(row) for row in rows]


def open_batch(
    connection: sqlite3.Connection,
    action: str,
    overrides: str,
    dlq_ids: Sequence[str],
    now: float,
    owner: str | None = None,  # one daemon has the store: every batch is its own
) -> BatchRecord | None:
    """Persist a batch of those of `dlq_ids` still decided (a dlqId is in one batch at a
    time); None when none is. Not a send yet: see `mark_sending` and `settle_batch`."""
    cursor = connection.execute(
        "INSERT INTO batches (action, overrides, state, dlq_ids, created_at) "
        "VALUES (?, ?, 'pending', '[]', ?)",
        (action, overrides, now),
    )
    batch_id = cursor.lastrowid
    assert batch_id is not None
    marks = ", ".join("?" * len(dlq_ids))
    taken = [
        dlq_id
        for (dlq_id,) in connection.execute(
            "UPDATE callbacks SET state = 'batched', updated_at = ?, "
            "batch_ids = json_insert(batch_ids, '$[#]', ?), "
            "history = json_insert(history, '$[#]', json(?)) "
            f"WHERE state = 'decided' AND dlq_id IN ({marks}) RETURNING dlq_id",
            (now, batch_id, _event("batched", now, batch=batch_id), *dlq_ids),
        )
    ]
    if not taken:
        connection.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
        return None
    ordered = [dlq_id for dlq_id in dlq_ids if dlq_id in set(taken)]
    connection.execute(
        "UPDATE batches SET dlq_ids = ? WHERE id = ?", (json.dumps(ordered), batch_id)
    )
    return BatchRecord(batch_id, action, overrides, tuple(ordered), now)


def mark_sending(
    connection: sqlite3.Connection, batch_id: int, now: float, owner: str | None = None
) -> bool:
    """The batch's call is about to go out: from now on it may reach the service, so a
    crash leaves a batch to be checked, not simply queued again. False when the batch
    is settled: its call must not go out."""
    cursor = connection.execute(
        "UPDATE batches SET sent_at = coalesce(sent_at, ?) WHERE id = ? AND state = 'pending'",
        (now, batch_id),
    )
    return cursor.rowcount > 0


def settle_batch(connection: sqlite3.Connection, batch_id: int, end: BatchEnd) -> Settled:
    """Close a pending batch: its dlqIds `done`, decided `again` (to be sent in a later
    batch), or `failed` or `gone` with `reason`; returns those decided again, with their
    rules, and those it made failed. `sent`: the call may have reached the service, and
    counts as a send for every dlqId of the batch; False when it was refused before the
    service acted or never made. A batch already settled is left as it is (its dlqIds
    may be in another batch now)."""
    done, again, failed, gone, reason = end.done, end.again, end.failed, end.gone, end.reason
    runs, calls, sent, now = end.runs, end.calls, end.sent, end.now
    found = connection.execute(
        "SELECT state, dlq_ids FROM batches WHERE id = ?", (batch_id,)
    ).fetchone()
    if found is None or found[0] != "pending":
        return Settled([], [])
    connection.execute(
        "UPDATE batches SET state = 'settled', settled_at = ?, reason = ?, "
        "runs = ?, calls = ?, sent_at = CASE WHEN ? THEN coalesce(sent_at, ?) ELSE sent_at END "
        "WHERE id = ?",
        (now, reason, json.dumps(list(runs)), json.dumps(list(calls)), sent, now, batch_id),
    )
    lineage.record_runs(connection, batch_id, runs, now)
    if sent:
        connection.execute(
            "UPDATE callbacks SET sends = sends + 1 "
            "WHERE dlq_id IN (SELECT value FROM json_each(?))",
            (found[1],),
        )
    moves = (
        ("done", done, None),
        ("decided", again, reason),
        ("failed", failed, reason),
        ("gone", gone, reason),
    )
    made_failed: list[tuple[str, str]] = []
    for state, dlq_ids, why in moves:
        if state == "failed":  # those the move below takes: still batched
            made_failed = connection.execute(
                "SELECT dlq_id, coalesce(rule, '') FROM callbacks "
                "WHERE dlq_id IN (SELECT value FROM json_each(?)) AND state = 'batched'",
                (json.dumps(list(dlq_ids)),),
            ).fetchall()
        connection.executemany(
            "UPDATE callbacks SET state = :state, reason = :reason, updated_at = :now, "
            f"{_HISTORY} WHERE dlq_id = :dlq_id AND state = 'batched'",
            [
                {
                    "state": state,
                    "reason": why,
                    "now": now,
                    "event": _event(state, now, batch=batch_id, reason=why),
                    "dlq_id": dlq_id,
                }
                for dlq_id in dlq_ids
            ],
        )
    failed_now = [(dlq_id, rule) for dlq_id, rule in made_failed]
    return Settled(_decided(connection, again), [], failed_now)


def _decided(connection: sqlite3.Connection, dlq_ids: Iterable[str]) -> list[Pending]:
    """Those of `dlq_ids` that are decided, as the batcher queues them."""
    rows = connection.execute(
        "SELECT dlq_id, action, overrides, rule, decided_at FROM callbacks "
        "WHERE dlq_id IN (SELECT value FROM json_each(?)) AND state = 'decided' "
        "ORDER BY decided_at, dlq_id",
        (json.dumps(list(dlq_ids)),),
    ).fetchall()
    return [records.pending_from(row) for row in rows]


def unsettled_batches(
    connection: sqlite3.Connection, owner: str | None = None
) -> list[BatchRecord]:
    rows = connection.execute(
        "SELECT id, action, overrides, dlq_ids, created_at, sent_at FROM batches "
        "WHERE state = 'pending' ORDER BY id"
    ).fetchall()
    return [records.batch_from(row, json.loads) for row in rows]


def sends(connection: sqlite3.Connection, dlq_ids: Sequence[str]) -> dict[str, int]:
    marks = ", ".join("?" * len(dlq_ids))
    rows = connection.execute(
        f"SELECT dlq_id, sends FROM callbacks WHERE dlq_id IN ({marks})", tuple(dlq_ids)
    )
    return dict(rows.fetchall())


def record(connection: sqlite3.Connection, dlq_id: str) -> dict[str, Any] | None:
    """Everything known about one dlqId, as `/api/v1/dlq/{dlqId}` answers it."""
    row = connection.execute(
        "SELECT dlq_id, state, reason, rule, action, matched, overrides, workflow_run_id, "
        "would, tries, refusals, sends, batch_ids, calls, history, received_at, decided_at, "
        "updated_at "
        "FROM callbacks WHERE dlq_id = ?",
        (dlq_id,),
    ).fetchone()
    if row is None:
        return None
    found = RecordRow(*row)
    batches = []
    for batch_id in json.loads(found.batch_ids):
        batch = connection.execute(
            "SELECT id, action, state, created_at, sent_at, settled_at, reason, runs, calls, "
            "json_array_length(dlq_ids) FROM batches WHERE id = ?",
            (batch_id,),
        ).fetchone()
        if batch is not None:  # a batch whose dlqIds were all pruned is pruned with them
            batches.append(records.batch_json(batch, json.loads))
    return records.record_json(found, batches, json.loads)


def callback(connection: sqlite3.Connection, dlq_id: str) -> tuple[Any, ...] | None:
    """The stored callback's row: dlqId, body, received_at, verified."""
    row: tuple[Any, ...] | None = connection.execute(
        "SELECT dlq_id, body, received_at, verified FROM callbacks WHERE dlq_id = ?", (dlq_id,)
    ).fetchone()
    return row


def inbox_depth(connection: sqlite3.Connection) -> int:
    row = connection.execute("SELECT n FROM state_counts WHERE state = 'received'").fetchone()
    return int(row[0]) if row else 0


def status(connection: sqlite3.Connection, now: float) -> dict[str, Any]:
    """Counts by state, batches not yet settled, and the age of the oldest dlqId not in
    a final state. A few index reads whatever the size of the table: a scrape runs it."""
    counts: dict[str, int] = dict.fromkeys(STATES, 0)
    counts.update(connection.execute("SELECT state, n FROM state_counts").fetchall())
    (batches,) = connection.execute(
        "SELECT count(*) FROM batches WHERE state = 'pending'"
    ).fetchone()
    # One min() per state, each the first entry of callbacks_by_state: min() over
    # `state IN (...)` would read every pending row.
    (oldest,) = connection.execute(
        "SELECT min(oldest) FROM ("
        + " UNION ALL ".join(
            f"SELECT min(received_at) AS oldest FROM callbacks WHERE state = '{state}'"
            for state in UNFINISHED
        )
        + ")"
    ).fetchone()
    return records.status_json(counts, batches, oldest, now)


def redrive(
    connection: sqlite3.Connection,
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
    params: dict[str, Any] = {f"s{number}": state for number, state in enumerate(states)}
    where = [f"state IN ({', '.join(':' + name for name in params)})"]
    if rule is not None:
        where.append("rule = :rule")
        params["rule"] = rule
    if since is not None:
        where.append("updated_at >= :since")
        params["since"] = since
    if dlq_ids is not None:
        where.append("dlq_id IN (SELECT value FROM json_each(:ids))")
        params["ids"] = json.dumps(list(dlq_ids))
    condition = " AND ".join(where)
    if not apply:
        rows = connection.execute(f"SELECT dlq_id FROM callbacks WHERE {condition}", params)
        return sorted(dlq_id for (dlq_id,) in rows)
    rows = connection.execute(
        "UPDATE callbacks SET state = 'received', tries = 0, refusals = 0, lease_owner = NULL, "
        "lease_until = NULL, reason = NULL, updated_at = :now, "
        # json_patch onto {} drops the null members, as _event leaves out empty ones.
        "history = json_insert(history, '$[#]', json_patch('{}', json_object("
        "  'state', 'redriven', 'at', :now, 'from', state, 'reason', reason))) "
        f"WHERE {condition} RETURNING dlq_id",
        {**params, "now": now},
    )
    return sorted(dlq_id for (dlq_id,) in rows)
