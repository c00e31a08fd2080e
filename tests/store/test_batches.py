"""Batches in the store: a send is counted only when the call may have reached the service."""

from __future__ import annotations

from tests.store.support import OpenStore, batched

NOW = 2_000.0


async def test_a_batch_saved_is_not_a_send(open_store: OpenStore) -> None:
    """open_batch persists the batch; no dlqId of it counts a send yet."""
    async with open_store() as store:
        await batched(store, ["d-1", "d-2"], now=NOW)
        assert await store.sends(["d-1", "d-2"]) == {"d-1": 0, "d-2": 0}


async def test_an_unsettled_batch_says_whether_its_call_may_have_gone_out(
    open_store: OpenStore,
) -> None:
    """sent_at is None until mark_sending, then the time it was marked, after a reopen too."""
    async with open_store() as store:
        quiet = await batched(store, ["d-1"], now=NOW)
        marked = await batched(store, ["d-2"], now=NOW)
        await store.mark_sending(marked.id, NOW + 1)
    async with open_store() as store:
        found = {record.id: record.sent_at for record in await store.unsettled_batches()}
    assert found == {quiet.id: None, marked.id: NOW + 1}


async def test_a_call_that_may_have_reached_the_service_counts_for_every_dlq_id(
    open_store: OpenStore,
) -> None:
    """sent=True: each dlqId of the batch, done or to go again, counts one send."""
    async with open_store() as store:
        record = await batched(store, ["d-1", "d-2"], now=NOW)
        await store.mark_sending(record.id, NOW)
        await store.settle_batch(record.id, done=["d-1"], again=["d-2"], sent=True, now=NOW)
        assert await store.sends(["d-1", "d-2"]) == {"d-1": 1, "d-2": 1}


async def test_a_refused_call_is_not_counted(open_store: OpenStore) -> None:
    """sent=False (429, 401, connection refused): the dlqIds go again, no send counted."""
    async with open_store() as store:
        record = await batched(store, ["d-1"], now=NOW)
        await store.mark_sending(record.id, NOW)
        await store.settle_batch(record.id, again=["d-1"], reason="429", sent=False, now=NOW)
        assert await store.sends(["d-1"]) == {"d-1": 0}
        assert [item.dlq_id for item in await store.pending()] == ["d-1"]


async def test_a_batch_settled_twice_counts_once(open_store: OpenStore) -> None:
    """Only the first settle of a batch counts its sends."""
    async with open_store() as store:
        record = await batched(store, ["d-1"], now=NOW)
        for _ in range(2):
            await store.settle_batch(record.id, done=["d-1"], sent=True, now=NOW)
        assert await store.sends(["d-1"]) == {"d-1": 1}


async def test_the_record_shows_when_each_batch_was_sent(open_store: OpenStore) -> None:
    """A batch's sentAt is in the dlqId's record."""
    async with open_store() as store:
        record = await batched(store, ["d-1"], now=NOW)
        await store.mark_sending(record.id, NOW + 1)
        await store.settle_batch(record.id, done=["d-1"], sent=True, now=NOW + 2)
        found = await store.record("d-1")
    assert found is not None
    assert found["sends"] == 1
    assert [(batch["sentAt"], batch["settledAt"]) for batch in found["batches"]] == [
        (NOW + 1, NOW + 2)
    ]
