"""Retention over the SQLite store: final records pruned in small transactions, each
leaving a compact key behind so that exactly-once survives the pruning.

A pruned dlqId's callback can still come again: the service retries a callback it
thinks was not received, and keeps the DLQ message (which can be redelivered) for the
account's DLQ retention. A redelivery must find a duplicate, not a new dlqId to recover
a second time. Two ways were open:

* refuse callbacks whose `createdAt` is older than the retention. That needs the body
  parsed before the store and trusts the sender's clock, and a message legitimately
  retried late (a long outage of ours) would be refused and lost;
* keep a key of each pruned dlqId for longer than the service can redeliver it: what is
  done here. The key is the first 8 bytes of sha256(dlqId) as an INTEGER PRIMARY KEY,
  with its expiry: about 30 bytes a dlqId instead of the kilobytes of its record, and
  one b-tree lookup at ingest. Two dlqIds share a key with odds of n/2**64 for n keys
  kept (one in 10**11 per callback at 100 million keys), and the cost of a collision
  is one callback answered "duplicate" that was new; the service's own DLQ still holds
  its message.

The caller keeps the keys `dedup_for` seconds: max(the account's DLQ retention, 30 days).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from daemon.store.records import FINAL, dedup_key
from daemon.store.sqlite import lineage as lineage
from daemon.store.sqlite import notify as notify

# Migration 7 (see sqlite.MIGRATIONS).
SCHEMA = """
    CREATE TABLE pruned (key INTEGER PRIMARY KEY, until REAL NOT NULL);
    CREATE INDEX pruned_by_until ON pruned (until);
"""

_FINAL = ", ".join(f"'{state}'" for state in sorted(FINAL))  # literals: the index is used


def prune_chunk(connection: sqlite3.Connection, *, before: float, until: float, chunk: int) -> int:
    """Delete up to `chunk` records final since before `before` (but those with a
    notification pending), keeping their keys until `until`, and the settled batches
    they were the last records of (their notifications go by trigger); how many records
    were deleted (fewer than `chunk`: the last chunk)."""
    gone = connection.execute(
        "DELETE FROM callbacks WHERE rowid IN (SELECT rowid FROM callbacks "
        f"  WHERE state IN ({_FINAL}) AND updated_at < :before "
        f"  AND NOT {notify.HELD} LIMIT :chunk) "  # a pending notification is pending work
        "RETURNING dlq_id, batch_ids",
        {"before": before, "chunk": chunk},
    ).fetchall()
    connection.executemany(
        "INSERT INTO pruned (key, until) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET until = max(until, excluded.until)",
        [(dedup_key(dlq_id), until) for dlq_id, _ in gone],
    )
    _prune_batches(connection, {batch for _, ids in gone for batch in json.loads(ids)})
    return len(gone)


def _prune_batches(connection: sqlite3.Connection, batch_ids: Iterable[int]) -> None:
    """A settled batch goes with the last of its records: a record still there may
    show it (`record`), and an unsettled one is still to be checked."""
    batch_ids = list(batch_ids)
    connection.executemany(
        "DELETE FROM batches WHERE id = ? AND state = 'settled' AND NOT EXISTS ("
        "  SELECT 1 FROM json_each(batches.dlq_ids) AS member "
        "  JOIN callbacks ON callbacks.dlq_id = member.value)",
        [(batch_id,) for batch_id in batch_ids],
    )
    lineage.forget_runs(connection, batch_ids)


def expire_chunk(connection: sqlite3.Connection, *, now: float, chunk: int) -> int:
    """Forget up to `chunk` keys kept long enough; how many."""
    return connection.execute(
        "DELETE FROM pruned WHERE key IN (SELECT key FROM pruned WHERE until < :now LIMIT :chunk)",
        {"now": now, "chunk": chunk},
    ).rowcount


def release_space(connection: sqlite3.Connection) -> None:
    """Give the pages freed back to the file system, where the file allows it (created
    with auto_vacuum = INCREMENTAL; an older file reuses them for new records instead).
    Its own transaction, after each chunk: a whole pass's worth at once would hold the
    lock long. executescript, because execute() would run one step: free one page."""
    connection.executescript("PRAGMA incremental_vacuum")


def checkpoint(connection: sqlite3.Connection) -> None:
    """Copy the WAL into the database and empty it (outside a transaction): a pass
    leaves its deletions in the WAL, and the file's size is only smaller after this."""
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
