"""The lease fence: a replica sends for the work it holds only while the lease it last
renewed has half of it left, and only in the term the work was marked in."""

from __future__ import annotations

import asyncio

from daemon.runtime.replicas import LeaseFence

LEASE = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_sent_before_the_first_renewal() -> None:
    fence = LeaseFence(LEASE, clock=Clock())
    assert fence.term() is None
    assert not fence.holds(0)


def test_the_fence_holds_for_half_the_lease_from_the_beat() -> None:
    """Counted from when the beat began (the store counts the lease from then)."""
    clock = Clock()
    fence = LeaseFence(LEASE, clock=clock)
    fence.renewed(clock.now - 2)  # a beat that took 2 s
    term = fence.term()
    assert term is not None
    clock.now += LEASE / 2 - 2
    assert fence.holds(term)
    clock.now += 0.01
    assert not fence.holds(term)
    assert fence.term() is None


def test_renewals_in_time_keep_the_term() -> None:
    """A beat every third of the lease: one term, for as long as they come."""
    clock = Clock()
    fence = LeaseFence(LEASE, clock=clock)
    fence.renewed(clock.now)
    term = fence.term()
    for _ in range(10):
        clock.now += LEASE / 3
        fence.renewed(clock.now)
        assert fence.holds(term or -1)
    assert fence.term() == term


def test_a_renewal_after_a_lapse_ends_the_term() -> None:
    """Frozen (SIGSTOP) or cut off past half the lease: other replicas may have taken its
    batches, so what was marked before the lapse is not sent, even once it beats again."""
    clock = Clock()
    fence = LeaseFence(LEASE, clock=clock)
    fence.renewed(clock.now)
    before = fence.term()
    assert before is not None
    clock.now += 2 * LEASE
    fence.renewed(clock.now)
    assert not fence.holds(before)
    after = fence.term()
    assert after is not None
    assert after != before
    assert fence.holds(after)


def test_a_store_of_one_daemon_always_holds() -> None:
    """SQLite: no other replica can take the work, whatever the heartbeat does."""
    clock = Clock()
    fence = LeaseFence(LEASE, shared=False, clock=clock)
    assert fence.term() == 0
    clock.now += 10 * LEASE
    assert fence.holds(0)


async def test_a_wait_for_a_renewal_returns_when_it_comes() -> None:
    clock = Clock()
    fence = LeaseFence(LEASE, clock=clock)
    waiting = asyncio.create_task(fence.renewal(at_most=30.0))
    await asyncio.sleep(0)
    fence.renewed(clock.now)
    async with asyncio.timeout(5):
        await waiting
    await fence.renewal(at_most=0.01)  # none comes: back after the time given
