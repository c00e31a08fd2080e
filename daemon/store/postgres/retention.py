"""Retention over the PostgreSQL store: final records pruned in small transactions, each
leaving a compact key behind so that exactly-once survives the pruning.

Why a key, and which (`records.dedup_key`, the same as SQLite's so that both stores
keep the same keys): see `daemon.store.sqlite.retention`. Here the key is a `bigint`
primary key. The space freed is reclaimed by autovacuum, not by the store.

Several replicas may prune at once, beside the pipeline: a chunk locks the records it
deletes (`FOR UPDATE SKIP LOCKED`), passing over those another transaction holds
(another replica's chunk, a settle, a redrive) instead of waiting for them, and a
settled batch is locked before it is found to have no record left (`_prune_batches`).
"""

from __future__ import annotations

from collections.abc import Iterable

from daemon.store.postgres import lineage, notify
from daemon.store.postgres.db import Connection
from daemon.store.records import FINAL, dedup_key

_FINAL = ", ".join(f"'{state}'" for state in sorted(FINAL))  # literals: the index is used


async def prune_chunk(connection: Connection, *, before: float, until: float, chunk: int) -> int:
    """Delete up to `chunk` records final since before `before` (but those with a
    notification pending), keeping their keys until `until`, and the settled batches
    they were the last records of (their notifications go by cascade); how many records
    were deleted (fewer than `chunk`: the last chunk, or rows another transaction held).

    The records are locked as they are picked, and at READ COMMITTED a record changed
    since the statement began is checked again as it now is: one redriven or decided
    again meanwhile is no longer final, or final since `before`, and stays. (Deciding it
    is what queues a notification, so its own columns tell that too.)"""
    cursor = await connection.execute(
        "WITH doomed AS ("
        "  SELECT dlq_id FROM callbacks "
        f"  WHERE state IN ({_FINAL}) AND updated_at < %(before)s "
        f"  AND NOT {notify.HELD} "  # a pending notification is pending work
        "  LIMIT %(chunk)s FOR UPDATE OF callbacks SKIP LOCKED"
        ") DELETE FROM callbacks USING doomed WHERE callbacks.dlq_id = doomed.dlq_id "
        "RETURNING callbacks.dlq_id, callbacks.batch_ids",
        {"before": before, "chunk": chunk},
    )
    gone: list[tuple[str, list[int]]] = await cursor.fetchall()
    if not gone:
        return 0
    await _keep_keys(connection, (dlq_id for dlq_id, _ in gone), until)
    await _prune_batches(connection, {batch for _, ids in gone for batch in ids})
    return len(gone)


async def _keep_keys(connection: Connection, dlq_ids: Iterable[str], until: float) -> None:
    """The pruned dlqIds' keys, kept until `until` (or later, if one was kept longer).
    A set: one INSERT cannot update a row twice, should two dlqIds share a key."""
    keys = sorted({dedup_key(dlq_id) for dlq_id in dlq_ids})
    await connection.execute(
        "INSERT INTO pruned (key, until) SELECT key, %s FROM unnest(%s::bigint[]) AS key "
        "ON CONFLICT (key) DO UPDATE SET until = GREATEST(pruned.until, excluded.until)",
        (until, keys),
    )


async def _prune_batches(connection: Connection, batch_ids: Iterable[int]) -> None:
    """A settled batch goes with the last of its records: a record still there may
    show it (`record`), and an unsettled one is still to be checked.

    The batches are locked (in id order) before the look for records left, in a
    statement of its own: two replicas pruning the last two records of one batch would
    otherwise each see the other's record, not yet deleted, and neither delete the
    batch. Locked, the second looks after the first has committed, and finds none."""
    batch_ids = sorted(batch_ids)
    if not batch_ids:
        return
    await connection.execute(
        "SELECT id FROM batches WHERE id = ANY(%s::bigint[]) AND state = 'settled' "
        "ORDER BY id FOR UPDATE",
        (batch_ids,),
    )
    await connection.execute(
        "DELETE FROM batches WHERE id = ANY(%s::bigint[]) AND state = 'settled' "
        "AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(batches.dlq_ids) "
        "  AS member (dlq_id) JOIN callbacks ON callbacks.dlq_id = member.dlq_id)",
        (batch_ids,),
    )
    await lineage.forget_runs(connection, batch_ids)


async def expire_chunk(connection: Connection, *, now: float, chunk: int) -> int:
    """Forget up to `chunk` keys kept long enough; how many. (SKIP LOCKED: replicas
    expiring at once share the keys out rather than queue on the same ones.)"""
    cursor = await connection.execute(
        "DELETE FROM pruned WHERE key IN (SELECT key FROM pruned WHERE until < %s "
        "LIMIT %s FOR UPDATE SKIP LOCKED)",
        (now, chunk),
    )
    return cursor.rowcount
