"""A fetch's backoff that waits for the service ends when it is back (`Store.retry_now`)."""

from __future__ import annotations

from daemon.store.records import Outcome
from tests.store.support import OWNER, OpenStore, received

NOW = 2_000.0


async def test_the_dlq_ids_waiting_for_the_service_are_due_at_once_in_order_of_arrival(
    open_store: OpenStore,
) -> None:
    """Whatever their backoffs, those that wait for the service are claimed next, oldest
    first; one waiting out a backoff of its own (a 400) waits on, and one being fetched
    keeps its lease."""
    async with open_store() as store:
        for number, dlq_id in enumerate(["a", "b", "c", "own", "leased"]):
            await received(store, dlq_id, at=1_000.0 + number)
        assert len(await store.claim(OWNER, 5, 60.0, NOW)) == 5
        await store.settle(OWNER, [
            Outcome("c", "received", retry_at=NOW + 10, waits_for_service=True),
            Outcome("a", "received", retry_at=NOW + 60, waits_for_service=True),
            Outcome("b", "received", retry_at=NOW + 30, waits_for_service=True),
            Outcome("own", "received", retry_at=NOW + 5),
        ], NOW)  # fmt: skip
        assert await store.claim("other", 5, 60.0, NOW + 1) == []

        assert await store.retry_now(NOW + 1) == 3
        claimed = await store.claim("other", 5, 60.0, NOW + 1)
        assert [item.dlq_id for item in claimed] == ["a", "b", "c"]
        assert await store.retry_now(NOW + 1) == 0  # leased now: being fetched
        assert [item.dlq_id for item in await store.claim("other", 5, 60.0, NOW + 5)] == ["own"]


async def test_with_a_limit_the_one_due_soonest_is_made_due(open_store: OpenStore) -> None:
    """One dlqId to probe the service with: the one whose retry comes soonest."""
    async with open_store() as store:
        await received(store, "a", "b", "c")
        assert len(await store.claim(OWNER, 3, 60.0, NOW)) == 3
        await store.settle(OWNER, [
            Outcome(dlq_id, "received", retry_at=NOW + delay, waits_for_service=True)
            for dlq_id, delay in (("a", 50), ("b", 20), ("c", 40))
        ], NOW)  # fmt: skip

        assert await store.retry_now(NOW + 1, limit=1) == 1
        assert [item.dlq_id for item in await store.claim("other", 5, 60.0, NOW + 1)] == ["b"]
