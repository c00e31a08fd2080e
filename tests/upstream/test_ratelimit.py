"""The shared rate limiter, driven by an injected clock: no test here sleeps for real.

Each call is reported as the client reports it: `sent` when its headers go out, then
answered (or `unanswered`). A slot that is never settled holds its place for ever.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from daemon.upstream.headers import RateHint
from daemon.upstream.ratelimit import RateLimiter, Slot

# Seconds of real time a test may take before it counts as hung.
GUARD = 5.0


def bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Fail the test after GUARD seconds instead of hanging the run on a limiter that waits
    for ever."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        await asyncio.wait_for(test(*args, **kwargs), GUARD)

    return run


async def settle() -> None:
    """Let every task that can run, run (a waiter takes a few steps to wake and go)."""
    for _ in range(20):
        await asyncio.sleep(0)


class FakeTime:
    """A monotonic clock that jumps forward whenever someone sleeps: waits take no time."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class ManualTime:
    """A monotonic clock that moves only when the test moves it; a sleeper wakes once the
    clock has reached its deadline."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        entry = (self.now + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    async def advance_to(self, when: float) -> None:
        await settle()
        self.now = when
        for deadline, woken in self._sleepers:
            if deadline <= when and not woken.done():
                woken.set_result(None)
        await settle()


def limiter_on(time: FakeTime | ManualTime, *args: Any, **kwargs: Any) -> RateLimiter:
    return RateLimiter(*args, clock=time.clock, sleep=time.sleep, **kwargs)


async def starts_of(limiter: RateLimiter, time: FakeTime, calls: int) -> list[float]:
    """`calls` concurrent calls, each sent as soon as it has its place and answered 200
    with no rate-limit header; the times they were sent."""
    starts: list[float] = []

    async def call() -> None:
        slot = await limiter.acquire()
        limiter.sent(slot)
        starts.append(time.now)
        limiter.answered(slot, status=200, hint=RateHint())

    await asyncio.gather(*(call() for _ in range(calls)))
    return starts


async def paced(limiter: RateLimiter, time: FakeTime, statuses: list[int]) -> list[float]:
    """Calls one after another, each answered with the next of `statuses` and no
    rate-limit header; the times they were sent."""
    starts: list[float] = []
    for status in statuses:
        slot = await limiter.acquire()
        limiter.sent(slot)
        starts.append(time.now)
        limiter.answered(slot, status=status, hint=RateHint())
    return starts


def most_in_any_window(starts: list[float], window: float) -> int:
    return max(sum(1 for t in starts if s <= t < s + window) for s in starts)


def per_second(starts: list[float]) -> list[int]:
    """How many calls were sent in each second [0, 1), [1, 2)..."""
    counts = Counter(math.floor(t) for t in starts)
    return [counts[second] for second in range(max(counts) + 1)]


# -- a known rate ---------------------------------------------------------------------


@bounded
async def test_calls_stay_under_the_limit_in_every_window() -> None:
    """23 concurrent callers at 5/s: never more than 5 starts in any 1-second window."""
    time = FakeTime()
    starts = await starts_of(limiter_on(time, 5), time, 23)
    assert len(starts) == 23
    assert most_in_any_window(starts, 1.0) == 5


@bounded
async def test_limit_is_used_fully_with_calls_evenly_spaced() -> None:
    """The limiter is not slower than it must be, nor bursty: 23 calls at 5/s start one
    every 0.2 s."""
    time = FakeTime()
    starts = await starts_of(limiter_on(time, 5, headroom=0), time, 23)
    assert starts == pytest.approx([n * 0.2 for n in range(23)])


@bounded
async def test_headroom_widens_each_window() -> None:
    """With 50 ms of headroom, 5 calls take 1.05 s, one every 0.21 s: arrivals that
    jitter by up to 50 ms still fit the service's one-second windows."""
    time = FakeTime()
    starts = await starts_of(limiter_on(time, 5, headroom=0.05), time, 15)
    assert starts == pytest.approx([n * 0.21 for n in range(15)])
    assert most_in_any_window(starts, 1.05) == 5


@bounded
async def test_a_sliding_second_sees_no_more_than_the_limit() -> None:
    """400 callers at 200/s: at most 200 starts in any second (not only in the clock's
    seconds), one every 1.05 / 200 s."""
    time = FakeTime()
    starts = await starts_of(limiter_on(time, 200), time, 400)
    assert most_in_any_window(starts, 1.0) <= 200
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert gaps == pytest.approx([1.05 / 200] * 399)


@bounded
async def test_a_late_caller_catches_up_within_catch_up_only() -> None:
    """At 10/s a call late by 0.04 s (under catch_up) leaves the schedule as it was: the
    next goes at its turn, 0.2. One late by 0.3 s (the limiter idle) starts a new
    schedule: the next waits a whole interval."""
    time = ManualTime()
    limiter = limiter_on(time, 10, headroom=0, catch_up=0.05)
    limiter.sent(await limiter.acquire())  # at 0: the next turn is 0.1
    await time.advance_to(0.14)
    limiter.sent(await limiter.acquire())  # 0.04 late: the next turn is 0.2
    following = asyncio.create_task(limiter.acquire())
    await time.advance_to(0.2)
    limiter.sent(await following)
    assert following.result().at == 0.2
    await time.advance_to(0.6)  # 0.3 late
    limiter.sent(await limiter.acquire())
    following = asyncio.create_task(limiter.acquire())
    await time.advance_to(0.65)
    assert not following.done()
    await time.advance_to(0.7)
    assert (await following).at == 0.7


@bounded
async def test_no_rate_means_no_wait() -> None:
    """Until a limit is known, calls are not held."""
    time = FakeTime()
    starts = await starts_of(limiter_on(time), time, 100)
    assert max(starts) == 0.0


@bounded
async def test_rate_below_one_widens_the_window() -> None:
    """At 0.5/s one call starts every two seconds."""
    time = FakeTime()
    assert await starts_of(limiter_on(time, 0.5, headroom=0), time, 3) == [0.0, 2.0, 4.0]


@bounded
async def test_pause_holds_every_caller() -> None:
    """A pause holds everyone, not only the caller that was refused."""
    time = FakeTime()
    limiter = limiter_on(time, 100)
    limiter.pause(3.0)
    limiter.pause(1.0)  # a shorter pause does not cut the longer one
    starts = await starts_of(limiter, time, 4)
    assert min(starts) >= 3.0


@bounded
async def test_learned_rate_is_adopted() -> None:
    """A limit the service announces applies to the next calls."""
    time = FakeTime()
    limiter = limiter_on(time, headroom=0)
    limiter.learn(2)
    starts = await starts_of(limiter, time, 5)
    assert starts == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_pinned_rate_ignores_what_the_service_says() -> None:
    """An operator's RECOVERYD_MAX_RPS wins over a learned limit, which is kept all the
    same as the account's (for replicas with no pin)."""
    limiter = RateLimiter(10, pinned=True)
    limiter.learn(200)
    assert (limiter.rate, limiter.source, limiter.learned) == (10, "pinned", (200, "announced"))


def test_a_new_limit_learned_here_is_told_once_and_one_adopted_is_not() -> None:
    """`on_learned` hears of a limit that differs from the one known, with how it was
    learned; the same limit again, or one adopted from the store, is not news."""
    limiter = RateLimiter()
    told: list[tuple[float, str]] = []
    limiter.on_learned = lambda rate, source: told.append((rate, source))
    limiter.learn(200, "discovered")
    limiter.learn(200, "announced")
    limiter.adopt(150, "account")
    assert (limiter.rate, limiter.source, limiter.phase) == (150, "account", "known")
    limiter.learn(200, "announced")
    assert told == [(200, "discovered"), (200, "announced")]


# -- a call counts from when it is sent ------------------------------------------------


@bounded
async def test_a_reserved_call_holds_its_place_until_it_is_sent() -> None:
    """A call that has its place but is not sent yet (waiting for a connection) may go out
    any moment: however long it waits, the next call cannot take its place; once sent,
    it counts from then."""
    time = ManualTime()
    limiter = limiter_on(time, 1, headroom=0)
    reserved = await limiter.acquire()
    waiting = asyncio.create_task(limiter.acquire())
    await time.advance_to(5.0)
    assert not waiting.done()
    limiter.sent(reserved)
    await time.advance_to(5.75)
    assert not waiting.done()
    await time.advance_to(6.0)
    assert (await waiting).at == 6.0


@bounded
async def test_a_call_sent_late_counts_from_its_send() -> None:
    """At 2/s, of two calls let go at 0 the second is sent at 0.75: a third goes when the
    first's window ends (1.0), a fourth only when the late one's does (1.75)."""
    time = ManualTime()
    limiter = limiter_on(time, 2, headroom=0, catch_up=math.inf)  # the window alone
    limiter.sent(await limiter.acquire())
    late = await limiter.acquire()
    third = asyncio.create_task(limiter.acquire())
    fourth = asyncio.create_task(limiter.acquire())
    await time.advance_to(0.75)
    limiter.sent(late)
    await time.advance_to(1.0)
    assert (await third).at == 1.0
    await time.advance_to(1.5)
    assert not fourth.done()
    await time.advance_to(1.75)
    assert (await fourth).at == 1.75


@pytest.mark.parametrize(("sent", "next_at"), [(False, 0.0), (True, 1.0)])
@bounded
async def test_a_call_that_never_went_out_frees_its_place(sent: bool, next_at: float) -> None:
    """`unanswered(sent=False)`: the service never saw the call, so the next one takes its
    place at once; a call that may have gone out keeps it for the whole window."""
    time = ManualTime()
    limiter = limiter_on(time, 1, headroom=0, catch_up=math.inf)  # the window alone
    slot = await limiter.acquire()
    waiting = asyncio.create_task(limiter.acquire())
    await settle()
    limiter.unanswered(slot, sent=sent)
    await settle()
    assert waiting.done() is not sent
    await time.advance_to(next_at)
    assert (await waiting).at == next_at


# -- what the service says ------------------------------------------------------------


@pytest.mark.parametrize(("remaining", "next_at"), [(0, 0.75), (1, 1.05 / 100)])
@bounded
async def test_nothing_remaining_pauses_everyone_until_the_reset(
    remaining: int, next_at: float
) -> None:
    """An answer saying the window is used up (Remaining: 0) holds every caller until its
    reset, even under the rate the limiter knows; with some remaining, the next call
    waits only for its turn."""
    time = FakeTime()
    limiter = limiter_on(time, 100)
    slot = await limiter.acquire()
    limiter.sent(slot)
    hint = RateHint(limit=100, remaining=remaining, reset_in=0.75)
    limiter.answered(slot, status=200, hint=hint)
    assert min(await starts_of(limiter, time, 3)) == pytest.approx(next_at)


@pytest.mark.parametrize(
    ("hint", "wait"),
    [
        (RateHint(retry_after=3.0, reset_in=1.0), 3.0),
        (RateHint(reset_in=2.0), 2.0),
        (RateHint(retry_after=0.0, reset_in=1.5), 1.5),
        (RateHint(retry_after=3600.0), 60.0),
        (RateHint(reset_in=0.5, daily_reset_in=30.0), 30.0),
        (RateHint(retry_after=2.0, daily_reset_in=30.0), 2.0),
    ],
    ids=[
        "retry-after wins",
        "reset",
        "retry-after 0 falls back",
        "capped at max_pause",
        "a spent day",
        "retry-after before the day",
    ],
)
@bounded
async def test_a_429_pauses_everyone_as_long_as_told(hint: RateHint, wait: float) -> None:
    """A 429 holds every caller for its Retry-After, else until the daily reset when the
    day is spent, else until its reset, up to max_pause."""
    time = FakeTime()
    limiter = limiter_on(time, 100, max_pause=60.0)
    slot = await limiter.acquire()
    limiter.sent(slot)
    limiter.answered(slot, status=429, hint=hint)
    assert min(await starts_of(limiter, time, 3)) == wait


@bounded
async def test_a_429_saying_nothing_backs_off_longer_each_time() -> None:
    """429s naming no wait pause everyone for a backoff that doubles per 429 in a row, up
    to its cap, and is never zero (rand() = 0 halves it); a success starts it over."""
    time = FakeTime()
    limiter = limiter_on(time, 100, backoff_base=0.5, backoff_cap=2.0, rand=lambda: 0.0)
    pauses: list[float] = []
    slot = await limiter.acquire()
    for status in (429, 429, 429, 429, 429, 200, 429):
        limiter.sent(slot)
        answered_at = time.now
        limiter.answered(slot, status=status, hint=RateHint())
        slot = await limiter.acquire()
        pauses.append(time.now - answered_at)
    # After the 200, no pause: only the wait for the next call's turn at 100/s.
    assert pauses == pytest.approx([0.25, 0.5, 1.0, 1.0, 1.0, 1.05 / 100, 0.25])


# -- discovery, while no rate is known ------------------------------------------------


@bounded
async def test_probing_lets_one_call_out_until_the_service_has_answered() -> None:
    """No rate known yet: the second call waits for the first answer, then the rate it
    announced applies to everyone. Learning nothing (None) changes nothing."""
    time = ManualTime()
    limiter = limiter_on(time, probe=True, probe_timeout=30)
    probe = await limiter.acquire()
    limiter.sent(probe)
    second = asyncio.create_task(limiter.acquire())
    await settle()
    limiter.learn(None)
    await settle()
    assert not second.done()
    assert limiter.phase == "probing"
    limiter.answered(probe, status=200, hint=RateHint(limit=2, remaining=1))
    await second
    assert (limiter.rate, limiter.phase) == (2, "known")


@bounded
async def test_an_answer_announcing_no_limit_starts_a_ramp() -> None:
    """The service answers the probe without any limit header: pacing ramps from
    ramp_start calls a second, each clean answer to a call the pace held back adding
    ramp_gain (a call that did not wait says nothing of the pace); it does not stop."""
    time = FakeTime()
    limiter = limiter_on(time, probe=True, ramp_start=2, ramp_gain=2, headroom=0, catch_up=0)
    starts = await paced(limiter, time, [200] * 3)
    assert limiter.phase == "ramping"
    assert limiter.rate is None
    assert limiter.pace == 4  # 2, and 2 for the third call's answer (held until 1.0)
    assert starts == [0.0, 0.0, 1.0]  # at 2/s, the probe's call counting in the window


@bounded
async def test_a_failed_probe_lets_the_next_probe_go() -> None:
    """A 503 to the probe says nothing about the limit: still probing, and the next call
    is the next probe, at once."""
    time = ManualTime()
    limiter = limiter_on(time, probe=True, probe_timeout=30)
    probe = await limiter.acquire()
    limiter.sent(probe)
    limiter.answered(probe, status=503, hint=RateHint())
    assert limiter.phase == "probing"
    assert (await limiter.acquire()).at == 0.0


@bounded
async def test_a_probe_with_no_answer_lets_exactly_one_more_go_after_the_timeout() -> None:
    """A probe that hangs lets one more call go after probe_timeout, which is then the
    probe: a hung connection delays discovery but never lets a burst through."""
    time = ManualTime()
    limiter = limiter_on(time, probe=True, probe_timeout=2.0, headroom=0)
    limiter.sent(await limiter.acquire())  # its answer never comes
    second = asyncio.create_task(limiter.acquire())
    await time.advance_to(1.5)
    assert not second.done()
    await time.advance_to(2.0)
    probe = await second
    assert probe.at == 2.0
    limiter.sent(probe)
    third = asyncio.create_task(limiter.acquire())
    await time.advance_to(3.5)
    assert not third.done()  # the timeout counts from the second probe
    limiter.answered(probe, status=200, hint=RateHint())
    assert (await third).at == 3.5
    assert limiter.phase == "ramping"


@bounded
async def test_a_429_announcing_a_limit_ends_discovery() -> None:
    """A 429 to the probe that names the limit: the rate is known, and everyone waits."""
    time = FakeTime()
    limiter = limiter_on(time, probe=True, headroom=0)
    probe = await limiter.acquire()
    limiter.sent(probe)
    limiter.answered(probe, status=429, hint=RateHint(limit=3, retry_after=1.0))
    assert (limiter.rate, limiter.phase, limiter.source) == (3, "known", "discovered")
    assert await starts_of(limiter, time, 4) == pytest.approx([1.0, 4 / 3, 5 / 3, 2.0])


@bounded
async def test_the_ramp_grows_with_clean_answers_and_halves_on_a_429_naming_no_limit() -> None:
    """Ramping from 2/s, 2 more a second per clean answer to a call the pace held (the
    second call is not held: 2, 4, 6, 8). A header-less 429 pauses everyone for the
    backoff and halves the pace to 4; from then on growth is additive, 5% of the 429's
    pace (0.4/s, at least 1/s) a second at full use."""
    time = FakeTime()
    limiter = limiter_on(time, probe=True, ramp_start=2, headroom=0, rand=lambda: 0.0)
    await paced(limiter, time, [200] * 5)
    assert limiter.pace == 8
    refused = (await paced(limiter, time, [429]))[0]
    assert limiter.pace == 4
    after = await paced(limiter, time, [200] * 5)
    assert after[0] >= refused + 0.25  # the backoff: 0.5 s halved by rand() = 0
    assert 5.0 < (limiter.pace or 0) < 5.2  # about a second of calls at 4-5/s: nearly +1
    assert limiter.phase == "ramping"


@bounded
async def test_the_ramp_stops_limiting_past_its_ceiling() -> None:
    """No sign of a limit up to ramp_ceiling: the limiter stops limiting."""
    time = FakeTime()
    limiter = limiter_on(time, probe=True, ramp_start=2, ramp_ceiling=4, headroom=0)
    starts = await paced(limiter, time, [200] * 10)
    assert starts == [0.0, 0.0] + [1.0] * 8
    assert limiter.phase == "unlimited"


@bounded
async def test_the_ramp_does_not_grow_past_what_the_callers_need() -> None:
    """Calls that never wait for their turn (fewer than the pace allows) do not grow it:
    the pace stays where it binds, and never reaches the ceiling that stops limiting."""
    time = FakeTime()
    limiter = limiter_on(time, probe=True, ramp_start=10, headroom=0)
    for _ in range(50):
        await paced(limiter, time, [200])
        await time.sleep(0.5)  # the caller's own pace: 2 a second
    assert (limiter.phase, limiter.pace) == ("ramping", 10)


@bounded
async def test_a_slot_is_what_acquire_reserves() -> None:
    """`acquire` hands out a pending slot at the time it was let go; `sent` moves it."""
    time = ManualTime()
    limiter = limiter_on(time, 10)
    slot = await limiter.acquire()
    assert isinstance(slot, Slot)
    assert (slot.at, slot.pending) == (0.0, True)
    await time.advance_to(0.5)
    limiter.sent(slot)
    assert (slot.at, slot.pending) == (0.5, False)


# -- a limit shared by replicas -------------------------------------------------------


@bounded
@pytest.mark.parametrize(("rank", "part"), [(0, 4), (1, 3), (2, 3)])
async def test_replicas_parts_are_whole_calls_that_add_up_to_the_limit(
    rank: int, part: int
) -> None:
    """10/s among 3 replicas: 4, 3 and 3 calls a window, the first rank taking the one
    left over; 4 + 3 + 3 = 10, so together they never pass the limit."""
    time = FakeTime()
    limiter = limiter_on(time, 10, headroom=0)
    limiter.share(rank, 3)
    starts = await starts_of(limiter, time, 3 * part)
    assert per_second(starts) == [part, part, part]


@bounded
async def test_no_part_holds_every_call_until_one_is_given() -> None:
    """A replica that has just joined (members 0) sends nothing until its part comes."""
    time = ManualTime()
    limiter = limiter_on(time, 10, headroom=0)
    limiter.share(0, 0)
    acquired: list[float] = []

    async def call() -> None:
        slot = await limiter.acquire()
        limiter.sent(slot)
        acquired.append(time.now)

    task = asyncio.create_task(call())
    for step in range(1, 5):
        await time.advance_to(step * 0.25)
    assert acquired == []
    limiter.share(0, 1)  # the call goes at once, not at its next look
    await settle()
    await task
    assert acquired == [1.0]


@bounded
async def test_a_part_lapses_at_its_end_until_given_again() -> None:
    """A part given `until` a time holds every call after it (its heartbeat stalled: the
    other replicas may take it), and goes on once it is given again."""
    time = ManualTime()
    limiter = limiter_on(time, 10, headroom=0)
    limiter.share(0, 1, until=0.05)  # before the second call's turn (at 0.1)
    acquired: list[float] = []

    async def calls(count: int) -> None:
        for _ in range(count):
            slot = await limiter.acquire()
            limiter.sent(slot)
            acquired.append(time.now)

    task = asyncio.create_task(calls(2))
    await settle()
    assert acquired == [0.0]  # within its part's time
    for step in range(1, 9):
        await time.advance_to(step * 0.25)
    assert acquired == [0.0]  # lapsed
    limiter.share(0, 1, until=4.0)
    await settle()
    await task
    assert acquired == [0.0, 2.0]
