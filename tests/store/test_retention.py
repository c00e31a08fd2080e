"""Retention: final records pruned in small transactions, without reopening exactly-once."""

from __future__ import annotations

import asyncio

from tests.store.support import OpenStore, batched, callback, done, received, settled

NOW = 100_000.0
DAY = 86_400.0


async def test_final_records_older_than_the_cut_are_pruned(open_store: OpenStore) -> None:
    """Final before `before`: deleted and counted; final since, or not final: kept."""
    async with open_store() as store:
        await settled(store, ["old-failed"], "failed", now=NOW - 10)
        await done(store, ["old-done"], now=NOW - 10)
        await settled(store, ["new-gone"], "gone", now=NOW)
        await batched(store, ["old-batched"], now=NOW - 10)
        await received(store, "old-received", at=NOW - 10)
        assert await store.prune(before=NOW - 5, now=NOW, dedup_for=DAY) == 2
        kept = [d for d in ("old-failed", "old-done", "new-gone", "old-batched",
                            "old-received") if await store.record(d) is not None]  # fmt: skip
        assert kept == ["new-gone", "old-batched", "old-received"]


async def test_a_late_callback_of_a_pruned_dlq_id_is_a_duplicate(open_store: OpenStore) -> None:
    """The service redelivers after the record is gone: not acted on a second time."""
    async with open_store() as store:
        await done(store, ["d-1"], now=NOW - 10)
        await store.prune(before=NOW, now=NOW, dedup_for=DAY)
        assert await store.add_callback(callback("d-1", NOW + 1)) == "duplicate"
        assert await store.add_callback(callback("d-2", NOW + 1)) == "accepted"
        assert await store.inbox_depth() == 1


async def test_dedup_keys_are_forgotten_after_dedup_for(open_store: OpenStore) -> None:
    """A later pass past the key's expiry drops it: the dlqId is new again."""
    async with open_store() as store:
        await done(store, ["d-1"], now=NOW - 10)
        await store.prune(before=NOW, now=NOW, dedup_for=DAY)
        await store.prune(before=NOW, now=NOW + DAY + 1, dedup_for=DAY)
        assert await store.add_callback(callback("d-1", NOW + DAY + 2)) == "accepted"


async def test_a_batch_goes_with_the_last_of_its_records(open_store: OpenStore) -> None:
    """A settled batch whose records are all pruned is deleted; one that still holds a
    record (sent again later, not final yet) stays."""
    async with open_store() as store:
        gone = await done(store, ["d-1", "d-2"], now=NOW - 10)
        kept = await batched(store, ["d-3", "d-4"], now=NOW - 10)
        await store.mark_sending(kept.id, NOW - 10)
        await store.settle_batch(kept.id, done=["d-3"], again=["d-4"], sent=True, now=NOW - 10)
        await store.prune(before=NOW, now=NOW, dedup_for=DAY)
    batches = [row[0] for row in open_store.query("SELECT id FROM batches")]
    assert gone.id not in batches
    assert batches == [kept.id]


async def test_callbacks_are_committed_between_chunks_of_a_pruning_pass(
    open_store: OpenStore,
) -> None:
    """A pass of many chunks does not hold ingest up until it ends."""
    async with open_store() as store:
        await settled(store, [f"d-{i}" for i in range(3000)], "gone", now=NOW - 10)
        pruning = asyncio.create_task(store.prune(before=NOW, now=NOW, dedup_for=DAY, chunk=20))
        await asyncio.sleep(0.01)  # the pass is under way
        assert await store.add_callback(callback("late", NOW)) == "accepted"
        assert not pruning.done()
        assert await pruning == 3000
