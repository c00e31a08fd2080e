"""Callbacks in the store: durable, duplicate-free, group-committed."""

from __future__ import annotations

import asyncio

import pytest

from daemon.store import Callback, StoreUnavailable
from tests.store.support import OpenStore


def _callback(dlq_id: str, body: bytes = b'{"dlqId": "x"}') -> Callback:
    return Callback(dlq_id, body, received_at=1_700_000_000.5)


async def test_a_callback_is_read_back_after_the_store_is_reopened(open_store: OpenStore) -> None:
    """What add_callback reported stored is kept, byte for byte."""
    async with open_store() as store:
        assert await store.add_callback(_callback("d-1", b"\x00raw\xff")) == "accepted"
    async with open_store() as store:
        assert await store.get_callback("d-1") == _callback("d-1", b"\x00raw\xff")
        assert await store.get_callback("d-2") is None


async def test_a_second_callback_for_a_dlq_id_is_a_duplicate(open_store: OpenStore) -> None:
    """By dlqId, in separate commits: the first one stays."""
    async with open_store() as store:
        await store.add_callback(_callback("d-1", b"first"))
        assert await store.add_callback(_callback("d-1", b"second")) == "duplicate"
        stored = await store.get_callback("d-1")
        assert stored is not None
        assert stored.body == b"first"


async def test_duplicates_within_one_commit_are_found_too(open_store: OpenStore) -> None:
    """Two callbacks for one dlqId in the same batch: one accepted, one duplicate."""
    async with open_store() as store:
        outcomes = await asyncio.gather(*(store.add_callback(_callback("d-1")) for _ in range(2)))
        assert sorted(outcomes) == ["accepted", "duplicate"]
        assert await store.inbox_depth() == 1


async def test_concurrent_callbacks_share_commits(open_store: OpenStore) -> None:
    """200 callbacks arriving together take far fewer than 200 commits (disk flushes)."""
    commits: list[int] = []
    async with open_store(observe_commit=commits.append) as store:
        adds = (store.add_callback(_callback(f"d-{i}")) for i in range(200))
        assert set(await asyncio.gather(*adds)) == {"accepted"}
        assert await store.inbox_depth() == 200
    assert sum(commits) == 200
    assert len(commits) < 20


async def test_callbacks_waiting_at_close_are_committed(open_store: OpenStore) -> None:
    """Shutting down does not drop callbacks whose commit has not run yet."""
    async with open_store() as store:
        waiting = [asyncio.ensure_future(store.add_callback(_callback(f"d-{i}"))) for i in range(5)]
        await asyncio.sleep(0)  # each task has queued its callback
    assert [await task for task in waiting] == ["accepted"] * 5
    assert open_store.query("SELECT count(*) FROM callbacks") == [(5,)]


async def test_a_closed_store_refuses_new_callbacks(open_store: OpenStore) -> None:
    """After close, add_callback says unavailable rather than hanging."""
    async with open_store() as store:
        pass
    with pytest.raises(StoreUnavailable, match="shutting down"):
        await store.add_callback(_callback("d-late"))


async def test_a_batch_larger_than_one_statement_finds_every_duplicate(
    open_store: OpenStore,
) -> None:
    """700 callbacks at once (three SQLite statements' worth), with duplicates in other
    chunks and of stored ones: each dlqId accepted once, every other copy a duplicate."""
    async with open_store() as store:
        await store.add_callback(_callback("d-5"))
        ids = [f"d-{i}" for i in range(600)] + [f"d-{i}" for i in range(0, 600, 6)]
        outcomes = await asyncio.gather(*(store.add_callback(_callback(i)) for i in ids))
        assert outcomes.count("accepted") == 599
        assert outcomes[5] == "duplicate"
        assert outcomes[600:] == ["duplicate"] * 100
        assert await store.inbox_depth() == 600


async def test_a_failing_metric_does_not_stop_the_writer(open_store: OpenStore) -> None:
    """observe_commit raising is not the store's problem: later callbacks still commit."""

    def broken(size: int) -> None:
        raise RuntimeError("metric backend down")

    async with open_store(observe_commit=broken) as store:
        assert await store.add_callback(_callback("d-1")) == "accepted"
        assert await store.add_callback(_callback("d-2")) == "accepted"


async def test_a_claim_hands_over_signed_bodies_only_when_asked(open_store: OpenStore) -> None:
    """`bodies=True` (RECOVERYD_FETCH=needed) gives each verified callback's body with its
    lease, and none of an unverified one; without it (`always`) no body is read at all."""
    async with open_store() as store:
        await store.add_callback(Callback("signed", b"signed body", 1.0, verified=True))
        await store.add_callback(Callback("unsigned", b"unsigned body", 2.0, verified=False))
        plain = await store.claim("fetcher", 10, 60.0, now=10.0)
        assert [(item.dlq_id, item.signed_callback) for item in plain] == [
            ("signed", None),
            ("unsigned", None),
        ]
        # The leases ran out: claimed again, this time with the bodies.
        with_bodies = await store.claim("fetcher", 10, 60.0, now=100.0, bodies=True)
        assert [(item.dlq_id, item.signed_callback) for item in with_bodies] == [
            ("signed", b"signed body"),
            ("unsigned", None),
        ]
