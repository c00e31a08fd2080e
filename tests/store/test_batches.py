"""Batches in the store: a send is counted only when the call may have reached the service."""

from __future__ import annotations

from pathlib import Path

from daemon.store.sqlite import SQLiteStore
from tests.store.support import batched, old_database

NOW = 2_000.0


async def test_a_batch_saved_is_not_a_send(tmp_path: Path) -> None:
    """open_batch persists the batch; no dlqId of it counts a send yet."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        await batched(store, ["d-1", "d-2"], now=NOW)
        assert await store.sends(["d-1", "d-2"]) == {"d-1": 0, "d-2": 0}


async def test_an_unsettled_batch_says_whether_its_call_may_have_gone_out(
    tmp_path: Path,
) -> None:
    """sent_at is None until mark_sending, then the time it was marked, after a reopen too."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        quiet = await batched(store, ["d-1"], now=NOW)
        marked = await batched(store, ["d-2"], now=NOW)
        await store.mark_sending(marked.id, NOW + 1)
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        found = {record.id: record.sent_at for record in await store.unsettled_batches()}
    assert found == {quiet.id: None, marked.id: NOW + 1}


async def test_a_call_that_may_have_reached_the_service_counts_for_every_dlq_id(
    tmp_path: Path,
) -> None:
    """sent=True: each dlqId of the batch, done or to go again, counts one send."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        record = await batched(store, ["d-1", "d-2"], now=NOW)
        await store.mark_sending(record.id, NOW)
        await store.settle_batch(record.id, done=["d-1"], again=["d-2"], sent=True, now=NOW)
        assert await store.sends(["d-1", "d-2"]) == {"d-1": 1, "d-2": 1}


async def test_a_refused_call_is_not_counted(tmp_path: Path) -> None:
    """sent=False (429, 401, connection refused): the dlqIds go again, no send counted."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        record = await batched(store, ["d-1"], now=NOW)
        await store.mark_sending(record.id, NOW)
        await store.settle_batch(record.id, again=["d-1"], reason="429", sent=False, now=NOW)
        assert await store.sends(["d-1"]) == {"d-1": 0}
        assert [item.dlq_id for item in await store.pending()] == ["d-1"]


async def test_a_batch_settled_twice_counts_once(tmp_path: Path) -> None:
    """Only the first settle of a batch counts its sends."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        record = await batched(store, ["d-1"], now=NOW)
        for _ in range(2):
            await store.settle_batch(record.id, done=["d-1"], sent=True, now=NOW)
        assert await store.sends(["d-1"]) == {"d-1": 1}


async def test_the_record_shows_when_each_batch_was_sent(tmp_path: Path) -> None:
    """A batch's sentAt is in the dlqId's record."""
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        record = await batched(store, ["d-1"], now=NOW)
        await store.mark_sending(record.id, NOW + 1)
        await store.settle_batch(record.id, done=["d-1"], sent=True, now=NOW + 2)
        found = await store.record("d-1")
    assert found is not None
    assert found["sends"] == 1
    assert [(batch["sentAt"], batch["settledAt"]) for batch in found["batches"]] == [
        (NOW + 1, NOW + 2)
    ]


async def test_a_batch_left_unsettled_by_an_older_recoveryd_is_taken_as_possibly_sent(
    tmp_path: Path,
) -> None:
    """Before sent_at existed nothing said whether the call left: the migration assumes
    it may have, so the batch is checked with GETs rather than sent again blind."""
    connection = old_database(tmp_path / "s.db", version=3)
    connection.execute(
        "INSERT INTO batches (action, overrides, state, dlq_ids, created_at) "
        "VALUES ('resume', '{}', 'pending', '[\"d-1\"]', 5.0)"
    )
    connection.close()
    async with SQLiteStore.open(tmp_path / "s.db") as store:
        [record] = await store.unsettled_batches()
    assert record.sent_at == 5.0
