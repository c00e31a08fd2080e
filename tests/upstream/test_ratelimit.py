"""The shared rate limiter, driven by an injected clock: no test here sleeps for real."""

from __future__ import annotations

import asyncio

import pytest

from daemon.upstream.ratelimit import RateLimiter


class FakeTime:
    """A monotonic clock that only moves when someone sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def starts_of(limiter: RateLimiter, time: FakeTime, calls: int) -> list[float]:
    starts: list[float] = []

    async def call() -> None:
        await limiter.acquire()
        starts.append(time.now)

    await asyncio.gather(*(call() for _ in range(calls)))
    return starts


def most_in_any_window(starts: list[float], window: float) -> int:
    return max(sum(1 for t in starts if s <= t < s + window) for s in starts)


async def test_calls_stay_under_the_limit_in_every_window() -> None:
    """23 concurrent callers at 5/s: never more than 5 starts in any 1-second window."""
    time = FakeTime()
    limiter = RateLimiter(5, clock=time.clock, sleep=time.sleep)
    starts = await starts_of(limiter, time, 23)
    assert len(starts) == 23
    assert most_in_any_window(starts, 1.0) == 5


async def test_limit_is_used_fully() -> None:
    """The limiter is not slower than it must be: 23 calls at 5/s start within 4 seconds."""
    time = FakeTime()
    limiter = RateLimiter(5, headroom=0, clock=time.clock, sleep=time.sleep)
    starts = await starts_of(limiter, time, 23)
    assert max(starts) == 4.0


async def test_headroom_widens_each_window() -> None:
    """With 50 ms of headroom, each next batch of 5 starts 1.05 s after the last:
    arrivals that jitter by up to 50 ms still fit the service's one-second windows."""
    time = FakeTime()
    limiter = RateLimiter(5, headroom=0.05, clock=time.clock, sleep=time.sleep)
    starts = await starts_of(limiter, time, 15)
    assert sorted(set(starts)) == pytest.approx([0.0, 1.05, 2.10])
    assert most_in_any_window(starts, 1.05) == 5


async def test_no_rate_means_no_wait() -> None:
    """Until a limit is known, calls are not held."""
    time = FakeTime()
    starts = await starts_of(RateLimiter(clock=time.clock, sleep=time.sleep), time, 100)
    assert max(starts) == 0.0


async def test_rate_below_one_widens_the_window() -> None:
    """At 0.5/s one call starts every two seconds."""
    time = FakeTime()
    limiter = RateLimiter(0.5, headroom=0, clock=time.clock, sleep=time.sleep)
    assert await starts_of(limiter, time, 3) == [0.0, 2.0, 4.0]


async def test_pause_holds_every_caller() -> None:
    """After a 429 everyone waits, not only the caller that was refused."""
    time = FakeTime()
    limiter = RateLimiter(100, clock=time.clock, sleep=time.sleep)
    limiter.pause(3.0)
    limiter.pause(1.0)  # a shorter pause does not cut the longer one
    starts = await starts_of(limiter, time, 4)
    assert min(starts) >= 3.0


async def test_learned_rate_is_adopted() -> None:
    """A limit the service announces applies to the next calls."""
    time = FakeTime()
    limiter = RateLimiter(headroom=0, clock=time.clock, sleep=time.sleep)
    limiter.learn(2)
    starts = await starts_of(limiter, time, 5)
    assert starts == [0.0, 0.0, 1.0, 1.0, 2.0]


def test_pinned_rate_ignores_what_the_service_says() -> None:
    """An operator's RECOVERYD_MAX_RPS wins over a learned limit."""
    limiter = RateLimiter(10, pinned=True)
    limiter.learn(200)
    assert limiter.rate == 10


async def test_probing_lets_one_call_out_until_the_service_has_answered() -> None:
    """No rate known yet: the second call waits for the first answer, then the rate it
    announced applies to everyone."""
    time = FakeTime()
    limiter = RateLimiter(probe=True, probe_timeout=30, clock=time.clock, sleep=time.sleep)
    await limiter.acquire()
    second = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not second.done()
    limiter.learn(2)
    await asyncio.wait_for(second, 1)
    assert limiter.rate == 2


async def test_a_probe_with_no_answer_lets_the_next_call_go_after_the_timeout() -> None:
    limiter = RateLimiter(probe=True, probe_timeout=0.05)
    await limiter.acquire()  # its call never answers (a connection error, say)
    await asyncio.wait_for(limiter.acquire(), 1)
    third = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()  # still probing: the second call is now the probe
    limiter.learn(None)  # an answer with no limit: no limit, no more probing
    await asyncio.wait_for(third, 1)
    await asyncio.wait_for(limiter.acquire(), 1)
