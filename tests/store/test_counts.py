"""State counts kept beside the table, so a scrape does not count 10 million rows."""

from __future__ import annotations

from tests.store.support import COUNTED, OpenStore, batched, done, nonzero, received, settled

NOW = 2_000.0


async def test_counts_follow_every_move_and_deletion(open_store: OpenStore) -> None:
    """Inserts, state changes, redrives and prunes all keep the counts exact."""
    async with open_store() as store:
        await settled(store, ["f-1", "f-2"], "failed", now=NOW)
        await done(store, ["d-1"], now=NOW)
        await batched(store, ["b-1"], now=NOW)
        await settled(store, ["g-1"], "gone", now=NOW - 100)
        await received(store, "r-1", "r-2")
        await store.redrive(now=NOW, apply=True)
        await store.prune(before=NOW - 50, now=NOW, dedup_for=1.0)
        status = await store.status(NOW)
        assert await store.inbox_depth() == 4
    assert nonzero(status) == dict(open_store.query(COUNTED)) == {
        "received": 4, "done": 1, "batched": 1
    }  # fmt: skip


async def test_every_state_is_reported_even_at_zero(open_store: OpenStore) -> None:
    """An empty store reports each state with 0."""
    async with open_store() as store:
        status = await store.status(NOW)
    assert set(status["states"].values()) == {0}
    assert "dry-run" in status["states"]


async def test_the_oldest_pending_age_is_of_the_oldest_unfinished_dlq_id(
    open_store: OpenStore,
) -> None:
    """Received, decided and batched count; final ones, however old, do not."""
    async with open_store() as store:
        await settled(store, ["old-final"], "gone", now=NOW - 500)
        await batched(store, ["b-1"], now=NOW - 30)
        await received(store, "r-1", at=NOW - 10)
        status = await store.status(NOW)
    assert status["oldestPendingSeconds"] == 30
