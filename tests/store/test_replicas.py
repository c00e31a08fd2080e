"""Replicas on one PostgreSQL store: what a replica holds stays its own while it lives,
and becomes the others' once it is gone (declared so by a heartbeat) or has left; and
each replica's part of the account's rate limit, as its heartbeat works it out."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from daemon.metrics import Metrics
from daemon.runtime.replicas import Heartbeat, share_of
from daemon.store import Store
from daemon.store.records import Outcome, Replica
from daemon.upstream import RateLimiter
from tests.store.postgres.test_store import replicas
from tests.store.support import ACTION, OVERRIDES, OpenStore, batched, received, settled

NOW = 2_000.0
LEASE = 30.0
A, B = "replica-a", "replica-b"


@pytest.fixture
def database(postgres_url: str) -> OpenStore:
    return OpenStore(postgres_url)


async def decided_by(store: Store, owner: str, dlq_ids: list[str]) -> None:
    """dlqIds received, leased by `owner` and decided by it."""
    await received(store, *dlq_ids, at=NOW)
    claimed = await store.claim(owner, len(dlq_ids), 60.0, NOW)
    assert sorted(item.dlq_id for item in claimed) == sorted(dlq_ids)
    outcomes = [
        Outcome(dlq_id, "decided", rule="rule-a", action=ACTION, overrides=OVERRIDES)
        for dlq_id in dlq_ids
    ]
    await store.settle(owner, outcomes, NOW)


async def test_a_batch_is_adopted_only_once_its_replica_is_gone(database: OpenStore) -> None:
    async with replicas(database, 2) as (a, b):
        assert await a.heartbeat(A, LEASE, NOW) == []
        assert await b.heartbeat(B, LEASE, NOW) == []
        await decided_by(a, A, ["d1", "d2"])
        record = await a.open_batch(ACTION, OVERRIDES, ["d1", "d2"], NOW, A)
        assert record is not None

        # A lives: its batch is not B's to check, however often B looks.
        assert await b.unsettled_batches(B) == []
        assert await b.heartbeat(B, LEASE, NOW + LEASE - 1) == []
        assert await b.unsettled_batches(B) == []
        assert [batch.id for batch in await a.unsettled_batches(A)] == [record.id]

        # A misses its lease: B's next beat declares it gone, and B adopts the batch.
        assert await b.heartbeat(B, LEASE, NOW + LEASE + 1) == [A]
        assert [batch.id for batch in await b.unsettled_batches(B)] == [record.id]
        assert await a.unsettled_batches(A) == []
        # A, still running after all, may not send it any more; B may.
        assert await a.mark_sending(record.id, NOW + LEASE + 2, A) is False
        assert await b.mark_sending(record.id, NOW + LEASE + 2, B) is True


async def test_decided_dlq_ids_stay_their_deciders_until_it_leaves(database: OpenStore) -> None:
    async with replicas(database, 2) as (a, b):
        await a.heartbeat(A, LEASE, NOW)
        await b.heartbeat(B, LEASE, NOW)
        await decided_by(a, A, ["d1"])
        await decided_by(b, B, ["d2"])
        assert [item.dlq_id for item in await a.pending(A)] == ["d1"]
        assert [item.dlq_id for item in await b.pending(B)] == ["d2"]
        assert sorted(item.dlq_id for item in await b.pending()) == ["d1", "d2"]

        await a.leave(A)
        assert sorted(item.dlq_id for item in await b.pending(B)) == ["d1", "d2"]
        assert [replica.id for replica in await b.replicas(NOW)] == [B]


async def test_a_gone_replicas_leases_are_claimable_at_once(database: OpenStore) -> None:
    """Its fetch lease (60 s here) would otherwise hold the dlqIds until it expires."""
    async with replicas(database, 2) as (a, b):
        await a.heartbeat(A, LEASE, NOW)
        await received(a, "r1", "r2", at=NOW)
        assert len(await a.claim(A, 2, 60.0, NOW)) == 2
        await b.heartbeat(B, LEASE, NOW + 1)
        assert await b.claim(B, 2, 60.0, NOW + 1) == []

        assert await b.heartbeat(B, LEASE, NOW + LEASE + 1) == [A]
        taken = await b.claim(B, 2, 60.0, NOW + LEASE + 1)
        assert sorted(item.dlq_id for item in taken) == ["r1", "r2"]
        # A's outcomes for dlqIds it no longer holds are left alone.
        late = [Outcome("r1", "decided", rule="rule-a", action=ACTION, overrides=OVERRIDES)]
        assert (await a.settle(A, late, NOW + LEASE + 2)).decided == []


async def test_a_replica_declared_gone_comes_back_with_its_next_beat(database: OpenStore) -> None:
    async with replicas(database, 2) as (a, b):
        await a.heartbeat(A, LEASE, NOW)
        await b.heartbeat(B, LEASE, NOW + LEASE + 1)
        assert [replica.id for replica in await b.replicas(NOW + LEASE + 1)] == [B]
        await a.heartbeat(A, LEASE, NOW + LEASE + 2)
        alive = await b.replicas(NOW + LEASE + 2)
        assert [replica.id for replica in alive] == [A, B]


async def test_a_settled_batch_is_not_sent(open_store: OpenStore) -> None:
    """On both stores: mark_sending refuses a batch settled meanwhile."""
    async with open_store() as store:
        record = await batched(store, ["s1"], now=NOW)
        await store.settle_batch(record.id, again=["s1"], sent=False, now=NOW)
        assert await store.mark_sending(record.id, NOW) is False
        await settled(store, ["s2"], "decided", now=NOW)
        fresh = await store.open_batch(ACTION, OVERRIDES, ["s2"], NOW)
        assert fresh is not None
        assert await store.mark_sending(fresh.id, NOW) is True


def test_parts_of_the_limit_grow_only_once_every_replica_knows_the_newest() -> None:
    new_c = Replica("c", started_at=200.0, seen_at=200.0)
    # c has just joined: b has not beaten since (more than 1 s after it).
    a = Replica("a", started_at=100.0, seen_at=203.0)
    b_unaware = Replica("b", started_at=110.0, seen_at=200.5)
    assert share_of("c", [a, b_unaware, new_c]) == (0, 0)  # nothing until all know of it
    assert share_of("a", [a, b_unaware, new_c]) == (2, 3)  # the smallest part meanwhile
    # Every one has beaten since (c too: a beat is how one knows it was seen): each
    # takes its own rank's part.
    b = Replica("b", started_at=110.0, seen_at=202.0)
    c = Replica("c", started_at=200.0, seen_at=202.5)
    assert share_of("a", [a, b, c]) == (0, 3)
    assert share_of("b", [a, b, c]) == (1, 3)
    assert share_of("c", [a, b, c]) == (2, 3)
    # Alone: the whole limit.
    assert share_of("a", [a]) == (0, 1)
    # Not among the living (declared gone): nothing.
    assert share_of("z", [a, b]) == (0, 0)


async def test_a_stalled_heartbeat_gives_its_part_of_the_limit_up_before_the_others_take_it(
    database: OpenStore, postgres_url: str
) -> None:
    """A heartbeat that cannot reach the store (its table held by another session here;
    a slow or cut-off store in production) stops this replica's calls half a lease after
    the last beat began. The others count it gone after a whole lease and take its part:
    one that went on sending at its part would put the account over its limit."""
    lease = 2.0
    limiter = RateLimiter(10, headroom=0)
    async with database() as store:
        heartbeat = Heartbeat(store, A, Metrics(CollectorRegistry()), lease=lease, limiter=limiter)
        async with heartbeat.running():
            await asyncio.wait_for(limiter.acquire(), lease)  # its part, from the first beat
            other = await psycopg.AsyncConnection.connect(postgres_url)
            async with other, other.transaction():
                await other.execute("LOCK TABLE replicas IN ACCESS EXCLUSIVE MODE")
                # The last beat that got through began before the lock: its part lapses.
                await asyncio.sleep(lease / 2 + 0.2)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(limiter.acquire(), lease)
            # The store answers again: the next beat gives the part back.
            await asyncio.wait_for(limiter.acquire(), 2 * lease)
