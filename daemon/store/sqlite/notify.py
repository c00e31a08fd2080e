"""The notifications' statements over the SQLite store: the outbox of the notify action.

A notification is queued by `settle` in the transaction that records its dlqId's
decision (`enqueue`), so a decision is never recorded without it nor it without the
decision. One row per (dlqId, rule): a dlqId decided again (a redrive) does not notify
twice. Each attempt is counted and its retry time written before the request goes out
(`begin_attempt`), so a crash mid-attempt leaves a notification that is due again after
its backoff, not at once and not never. Rows go with their dlqId (a trigger), and a
pending one keeps its dlqId from being pruned (`HELD`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from daemon.store.records import AttemptEnd, Notice, NotificationJob, NotificationResult

# One migration (see sqlite.MIGRATIONS).
SCHEMA = """
    CREATE TABLE notifications (
        id INTEGER PRIMARY KEY,
        dlq_id TEXT NOT NULL,
        rule TEXT NOT NULL,
        url TEXT NOT NULL,
        receiver TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        payload TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        queued_at REAL NOT NULL,
        last_attempt_at REAL,
        last_status INTEGER,
        reason TEXT,
        finished_at REAL,
        UNIQUE (dlq_id, rule)
    );
    CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';
    CREATE TRIGGER callbacks_forget_notifications AFTER DELETE ON callbacks BEGIN
        DELETE FROM notifications WHERE dlq_id = OLD.dlq_id;
    END;
"""

# For retention's delete: a record whose notification is still pending is not pruned.
HELD = (
    "EXISTS (SELECT 1 FROM notifications WHERE notifications.dlq_id = callbacks.dlq_id "
    "AND notifications.state = 'pending')"
)


def enqueue(
    connection: sqlite3.Connection, dlq_id: str, notices: Sequence[Notice], now: float
) -> None:
    """Queue `notices` for `dlq_id`, due now. A pending or sent one is left as it is (at
    most one delivery per dlqId and rule); a failed one is queued again, its attempts
    and time limit starting over (a redrive asked for it)."""
    connection.executemany(
        "INSERT INTO notifications (dlq_id, rule, url, receiver, idempotency_key, payload, "
        "  next_at, queued_at) "
        "VALUES (:dlq_id, :rule, :url, :receiver, :key, :payload, :now, :now) "
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


def due(
    connection: sqlite3.Connection, now: float, limit: int, skip_receivers: Sequence[str]
) -> list[NotificationJob]:
    """Up to `limit` pending notifications due by `now`, the longest due first, none for
    `skip_receivers` (those already as busy as they may be: the rest are not held up)."""
    marks = ", ".join("?" * len(skip_receivers))
    skip = f"AND receiver NOT IN ({marks}) " if skip_receivers else ""
    rows = connection.execute(
        "SELECT id, dlq_id, rule, url, receiver, idempotency_key, payload, attempts, queued_at "
        f"FROM notifications WHERE state = 'pending' AND next_at <= ? {skip}"
        "ORDER BY next_at LIMIT ?",
        (now, *skip_receivers, limit),
    ).fetchall()
    return [NotificationJob(*row) for row in rows]


def begin_attempt(
    connection: sqlite3.Connection, notification_id: int, now: float, retry_at: float
) -> int | None:
    """Count an attempt about to go out and make the notification due again at
    `retry_at` should its outcome never be recorded; the attempt's number, or None when
    the notification is no longer pending."""
    row = connection.execute(
        "UPDATE notifications SET attempts = attempts + 1, last_attempt_at = ?, next_at = ? "
        "WHERE id = ? AND state = 'pending' RETURNING attempts",
        (now, retry_at, notification_id),
    ).fetchone()
    return None if row is None else int(row[0])


def finish_attempt(connection: sqlite3.Connection, notification_id: int, end: AttemptEnd) -> bool:
    """Record an attempt's outcome: `sent`, `failed`, or `retry` at `next_at`. When the
    notification ends, its dlqId's record says so: a dlqId its notify rule decided ends
    `failed` with the reason if it cannot be delivered (True then)."""
    result, status, reason, next_at, now = end.result, end.status, end.reason, end.next_at, end.now
    if result == "retry":
        connection.execute(
            "UPDATE notifications SET last_status = ?, reason = ?, next_at = ? "
            "WHERE id = ? AND state = 'pending'",
            (status, reason, next_at, notification_id),
        )
        return False
    row = connection.execute(
        "UPDATE notifications SET state = ?, last_status = ?, reason = ?, finished_at = ? "
        "WHERE id = ? AND state = 'pending' RETURNING dlq_id, rule, receiver",
        (result, status, reason, now, notification_id),
    ).fetchone()
    if row is None:
        return False
    decided = _tell_the_record(connection, *row, result=result, reason=reason, now=now)
    return decided and result == "failed"


def _tell_the_record(
    connection: sqlite3.Connection,
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
    event = json.dumps({"state": state, "at": now, "rule": rule, "reason": why})
    decided = connection.execute(
        "UPDATE callbacks SET state = :state, reason = :why, updated_at = :now, "
        "history = json_insert(history, '$[#]', json(:event)) "
        "WHERE dlq_id = :dlq_id AND rule = :rule AND action = 'notify' AND state = 'done'",
        {"state": state, "why": why, "now": now, "event": event, "dlq_id": dlq_id, "rule": rule},
    ).rowcount
    if decided:
        return True
    name = "notified" if result == "sent" else "notification-failed"
    event = json.dumps({"state": name, "at": now, "rule": rule, "reason": why})
    connection.execute(
        "UPDATE callbacks SET history = json_insert(history, '$[#]', json(?)) WHERE dlq_id = ?",
        (event, dlq_id),
    )
    return False


def pending_count(connection: sqlite3.Connection) -> int:
    (count,) = connection.execute(
        "SELECT count(*) FROM notifications WHERE state = 'pending'"
    ).fetchone()
    return int(count)


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


def of_dlq_id(connection: sqlite3.Connection, dlq_id: str) -> list[dict[str, Any]]:
    """The notifications of `dlq_id`, as its record shows them: never the URL (a webhook's
    path or query is often its secret), its origin as `receiver`."""
    columns = ", ".join(column for _, column in _SHOWN)
    rows = connection.execute(
        f"SELECT {columns} FROM notifications WHERE dlq_id = ? ORDER BY id", (dlq_id,)
    ).fetchall()
    return [dict(zip((name for name, _ in _SHOWN), row, strict=True)) for row in rows]
