"""The notifications' statements over the PostgreSQL store: the outbox of the notify action.

The same outbox as the SQLite store's (see `daemon.store.sqlite.notify` for why it is
made so): queued by `settle` in the decision's own transaction (`enqueue`), one row per
(dlqId, rule), each attempt counted before it goes out (`begin_attempt`). Rows go with
their dlqId by the foreign key's ON DELETE CASCADE (SQLite has a trigger), and a pending
one keeps its dlqId from being pruned (`HELD`).

Several replicas may be handed the same due notification (`due` locks nothing): only
one of them begins an attempt, since beginning one makes it due later (see
`begin_attempt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daemon.store.postgres.db import Connection, jsonb
from daemon.store.records import AttemptEnd, Notice, NotificationJob, NotificationResult

# For retention's delete: a record whose notification is still pending is not pruned.
HELD = (
    "EXISTS (SELECT 1 FROM notifications WHERE notifications.dlq_id = callbacks.dlq_id "
    "AND notifications.state = 'pending')"
)


async def enqueue(
    connection: Connection, dlq_id: str, notices: Sequence[Notice], now: float
) -> None:
    """Queue `notices` for `dlq_id`, due now. A pending or sent one is left as it is (at
    most one delivery per dlqId and rule); a failed one is queued again, its attempts
    and time limit starting over (a redrive asked for it). One statement a notice, as
    SQLite's executemany: a rule named twice is queued once, not an error."""
    if not notices:
        return
    async with connection.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO notifications (dlq_id, rule, url, receiver, idempotency_key, "
            "  payload, next_at, queued_at) "
            "VALUES (%(dlq_id)s, %(rule)s, %(url)s, %(receiver)s, %(key)s, %(payload)s, "
            "  %(now)s, %(now)s) "
            "ON CONFLICT (dlq_id, rule) DO UPDATE SET url = excluded.url, "
            "  receiver = excluded.receiver, payload = excluded.payload, state = 'pending', "
            "  attempts = 0, next_at = excluded.next_at, queued_at = excluded.queued_at, "
            "  last_status = NULL, reason = NULL, finished_at = NULL "
            "WHERE notifications.state = 'failed'",
            [
                {
                    "dlq_id": dlq_id,
                    "rule": notice.rule,
                    "url": notice.url,
                    "receiver": notice.receiver,
                    "key": notice.key,
                    "payload": notice.payload,
                    "now": now,
                }
                for notice in notices
            ],
        )


async def due(
    connection: Connection, now: float, limit: int, skip_receivers: Sequence[str]
) -> list[NotificationJob]:
    """Up to `limit` pending notifications due by `now`, the longest due first, none for
    `skip_receivers` (those already as busy as they may be: the rest are not held up).
    Equals in `next_at` in the order they were queued, as SQLite's index gives them."""
    cursor = await connection.execute(
        "SELECT id, dlq_id, rule, url, receiver, idempotency_key, payload, attempts, queued_at "
        "FROM notifications WHERE state = 'pending' AND next_at <= %s "
        "AND receiver <> ALL(%s::text[]) ORDER BY next_at, id LIMIT %s",
        (now, list(skip_receivers), limit),
    )
    return [NotificationJob(*row) for row in await cursor.fetchall()]


async def begin_attempt(
    connection: Connection, notification_id: int, now: float, retry_at: float
) -> int | None:
    """Count an attempt about to go out and make the notification due again at
    `retry_at` should its outcome never be recorded; the attempt's number, or None when
    the notification is no longer pending, or no longer due.

    `next_at <= now`, which SQLite (one process, whose notifier never starts a job twice)
    does without: two replicas handed the same due notification both get here; the
    second waits for the first's row lock, then finds the row moved to `retry_at` and
    leaves it (READ COMMITTED re-checks the WHERE on the row as committed), so one
    attempt goes out, not two. An attempt that outlasts its backoff may still be
    followed by another, as in SQLite: it is taken for lost."""
    cursor = await connection.execute(
        "UPDATE notifications SET attempts = attempts + 1, last_attempt_at = %(now)s, "
        "next_at = %(retry_at)s "
        "WHERE id = %(id)s AND state = 'pending' AND next_at <= %(now)s RETURNING attempts",
        {"now": now, "retry_at": retry_at, "id": notification_id},
    )
    row = await cursor.fetchone()
    return None if row is None else int(row[0])


async def finish_attempt(connection: Connection, notification_id: int, end: AttemptEnd) -> bool:
    """Record an attempt's outcome: `sent`, `failed`, or `retry` at `next_at`. When the
    notification ends, its dlqId's record says so: a dlqId its notify rule decided ends
    `failed` with the reason if it cannot be delivered (True then)."""
    result, status, reason, next_at, now = end.result, end.status, end.reason, end.next_at, end.now
    if result == "retry":
        await connection.execute(
            "UPDATE notifications SET last_status = %s, reason = %s, next_at = %s "
            "WHERE id = %s AND state = 'pending'",
            (status, reason, next_at, notification_id),
        )
        return False
    cursor = await connection.execute(
        "UPDATE notifications SET state = %s, last_status = %s, reason = %s, finished_at = %s "
        "WHERE id = %s AND state = 'pending' RETURNING dlq_id, rule, receiver",
        (result, status, reason, now, notification_id),
    )
    row = await cursor.fetchone()
    if row is None:
        return False
    dlq_id, rule, receiver = row
    decided = await _tell_the_record(
        connection, dlq_id, rule, receiver, result=result, reason=reason, now=now
    )
    return decided and result == "failed"


async def _tell_the_record(
    connection: Connection,
    dlq_id: str,
    rule: str,
    receiver: str,
    *,
    result: NotificationResult,
    reason: str,
    now: float,
) -> bool:
    """The dlqId decided by this notify rule: its reason (and, failed, its state) follow
    the notification (True). One that another rule decided: a line in its history only."""
    if result == "sent":
        state, why = "done", f"rule {rule} notified {receiver}"
    else:
        state, why = "failed", f"rule {rule} could not notify {receiver}: {reason}"
    event = {"state": state, "at": now, "rule": rule, "reason": why}
    cursor = await connection.execute(
        "UPDATE callbacks SET state = %(state)s, reason = %(why)s, updated_at = %(now)s, "
        "history = history || jsonb_build_array(%(event)s::jsonb) "
        "WHERE dlq_id = %(dlq_id)s AND rule = %(rule)s AND action = 'notify' "
        "AND state = 'done'",
        {"state": state, "why": why, "now": now, "event": jsonb(event), "dlq_id": dlq_id,
         "rule": rule},
    )  # fmt: skip
    if cursor.rowcount:
        return True
    name = "notified" if result == "sent" else "notification-failed"
    event = {"state": name, "at": now, "rule": rule, "reason": why}
    await connection.execute(
        "UPDATE callbacks SET history = history || jsonb_build_array(%s::jsonb) WHERE dlq_id = %s",
        (jsonb(event), dlq_id),
    )
    return False


async def pending_count(connection: Connection) -> int:
    cursor = await connection.execute("SELECT count(*) FROM notifications WHERE state = 'pending'")
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


# What a record shows of each notification: (its field, the column it comes from).
_SHOWN = (
    ("rule", "rule"),
    ("receiver", "receiver"),
    ("state", "state"),
    ("attempts", "attempts"),
    ("lastStatus", "last_status"),
    ("reason", "reason"),
    ("idempotencyKey", "idempotency_key"),
    ("queuedAt", "queued_at"),
    ("lastAttemptAt", "last_attempt_at"),
    ("nextAt", "CASE WHEN state = 'pending' THEN next_at END"),
    ("finishedAt", "finished_at"),
)


async def of_dlq_id(connection: Connection, dlq_id: str) -> list[dict[str, Any]]:
    """The notifications of `dlq_id`, as its record shows them: never the URL (a webhook's
    path or query is often its secret), its origin as `receiver`."""
    columns = ", ".join(column for _, column in _SHOWN)
    cursor = await connection.execute(
        f"SELECT {columns} FROM notifications WHERE dlq_id = %s ORDER BY id", (dlq_id,)
    )
    rows = await cursor.fetchall()
    return [dict(zip((name for name, _ in _SHOWN), row, strict=True)) for row in rows]
