"""The account's learned rate limit: one record, the latest kept, read back after a
restart (and, on PostgreSQL, by another replica)."""

from __future__ import annotations

from daemon.store.records import LearnedRate
from tests.store.support import OpenStore


async def test_the_learned_rate_is_kept_across_a_restart(open_store: OpenStore) -> None:
    """None before any is learned; the latest saved replaces the one before, and is what
    the next opening of the store reads."""
    discovered = LearnedRate(200.0, "discovered", 1_000.0, "replica-a")
    announced = LearnedRate(150.0, "announced", 1_010.0, "replica-b")
    async with open_store() as store:
        assert await store.learned_rate() is None
        await store.save_learned_rate(discovered)
        assert await store.learned_rate() == discovered
        await store.save_learned_rate(announced)
    async with open_store() as store:
        assert await store.learned_rate() == announced
    assert open_store.query("SELECT count(*) FROM learned_rate") == [(1,)]
