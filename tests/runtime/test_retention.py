"""The retention task: what it prunes, how long pruned dlqIds stay duplicates, and that a
store in trouble postpones a pass instead of ending the task."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from daemon.metrics import Metrics
from daemon.runtime.retention import MIN_DEDUP_SECONDS, Retention
from daemon.store.sqlite import SQLiteStore
from tests.store.support import callback, done, received

NOW = 10_000_000.0
DAY = 86_400.0


def retention(
    store: SQLiteStore, registry: CollectorRegistry, *, keep: float, dlq_days: float | None = None
) -> Retention:
    return Retention(
        store,
        Metrics(registry),
        keep=keep,
        dlq_retention=lambda: None if dlq_days is None else dlq_days * DAY,
        wall_clock=lambda: NOW,
    )


async def test_a_pass_prunes_final_records_older_than_the_retention(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await done(store, ["old-1", "old-2"], now=NOW - 8 * DAY)
        await done(store, ["recent"], now=NOW - 6 * DAY)
        await received(store, "waiting", at=NOW - 9 * DAY)

        assert await retention(store, registry, keep=7 * DAY).prune_once() == 2

        assert await store.record("old-1") is None
        assert await store.record("recent") is not None
        assert await store.record("waiting") is not None  # pending work is never pruned
        assert registry.get_sample_value("recoveryd_pruned_records_total") == 2


async def test_pruned_dlq_ids_stay_duplicates_for_the_longer_of_30_days_and_the_dlq(
    tmp_path: Path,
) -> None:
    """The account keeps DLQ messages 60 days: a callback redelivered on day 59 after
    the pruning is still a duplicate, one on day 61 is new."""
    assert MIN_DEDUP_SECONDS == 30 * DAY
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await done(store, ["d-1"], now=NOW - 2 * DAY)
        await retention(store, CollectorRegistry(), keep=DAY, dlq_days=60).prune_once()
        assert await store.add_callback(callback("d-1", NOW + 59 * DAY)) == "duplicate"
        # A pass after the keys' time forgets them.
        later = Retention(
            store, Metrics(CollectorRegistry()), keep=DAY, dlq_retention=lambda: None,
            wall_clock=lambda: NOW + 61 * DAY,
        )  # fmt: skip
        await later.prune_once()
        assert await store.add_callback(callback("d-1", NOW + 61 * DAY)) == "accepted"


async def test_a_store_in_trouble_postpones_the_pass(tmp_path: Path) -> None:
    """The store's files deleted: the pass prunes nothing and raises nothing (the next
    one tries again); readiness says what is wrong."""
    registry = CollectorRegistry()
    async with SQLiteStore.open(tmp_path / "s.db", health_interval=0.05) as store:
        await done(store, ["old"], now=NOW - 8 * DAY)
        (tmp_path / "s.db").unlink()
        async with asyncio.timeout(5):
            while True:
                if store.problems():
                    break
                await asyncio.sleep(0.05)
        assert await retention(store, registry, keep=7 * DAY).prune_once() == 0
        assert registry.get_sample_value("recoveryd_pruned_records_total") == 0


async def test_records_a_budget_still_counts_are_kept_past_the_retention(tmp_path: Path) -> None:
    """A rule's budget counts recoveries over 30 days: with a retention of 7 days, a
    recovery 8 days old is kept (it still counts), one 31 days old is pruned."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await done(store, ["in-window"], now=NOW - 8 * DAY)
        await done(store, ["past-window"], now=NOW - 31 * DAY)
        task = Retention(
            store, Metrics(CollectorRegistry()), keep=7 * DAY, dlq_retention=lambda: None,
            budget_window=lambda: 30 * DAY, wall_clock=lambda: NOW,
        )  # fmt: skip
        assert await task.prune_once() == 1
        assert await store.record("in-window") is not None
        assert await store.record("past-window") is None
