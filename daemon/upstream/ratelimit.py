"""A client-side limiter that keeps every call to the service under its rate limit."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

from daemon.upstream.headers import RateHint

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
Phase = Literal["known", "probing", "ramping", "unlimited"]
# How the rate in force was learned (daemon.store.records.RateSource): the limit header
# of an answer let through, the account record, that header on a 429, or the operator.
Source = Literal["announced", "account", "discovered", "pinned"]

# Seconds of sends kept while no rate is known, so that a rate learned later counts them.
_UNLIMITED_MEMORY = 10.0
# How soon a waiter looks again when the window is full of calls not yet sent. Only a
# safety net: the send or the end of such a call wakes it at once.
_PENDING_POLL = 0.25


class Slot:
    """One call's place in the window. `acquire` reserves it; `sent` moves it to the
    moment the request really goes out; an answer or `unanswered` settles it. While
    reserved but not sent, it counts as sent now: it will be, any moment."""

    __slots__ = ("at", "held", "pending", "probe")

    def __init__(self, at: float, *, probe: bool, held: bool = False) -> None:
        self.at = at
        self.pending = True
        self.probe = probe
        self.held = held  # the limiter made it wait: the pace, not the caller, bound it


class RateLimiter:
    """A sliding-window limiter shared by every caller of one account, that spaces calls
    evenly.

    Counting. At most `capacity` (the rate, rounded down) calls are sent in any window
    of one second plus `headroom`, on the injected monotonic clock, and one call is let
    go every `window / capacity` seconds: a service that counts a sliding second, not
    fixed windows, sees no burst either. Calls whose callers came late for their turns
    (by up to `catch_up` seconds) may catch up; after a longer pause the turns start
    again from the next call, with no burst.

    A call counts from the moment its request headers go out (the client reports
    httpcore's trace event through `sent`), not from when `acquire` let it go: waiting
    for a connection or a TLS handshake must not squeeze two calls into one of the
    service's windows. When
    no such event comes (httpx.ASGITransport fires none) the reservation time is the
    send time. The service counts arrivals in fixed one-second windows, and network
    delay varies, so two sends a second apart can arrive less than a second apart:
    `headroom` absorbs that much variation, at the price of `headroom` seconds of
    throughput a window (5% by default). Waiters are served in arrival order.

    The rate is pinned (configured by the operator) or learned: from the account
    record's `max_requests_per_second` or any answer's `Burst-RateLimit-Limit`, or
    adopted as another replica, or an earlier start, learned it (daemon/account/rate.py).
    `learned` is the account's limit and how it was learned, pinned or not;
    `on_learned` is told when an answer or a record here teaches a new one.

    The service's word on any answer is obeyed (`answered`): `Remaining: 0` with a
    reset pauses everyone until the reset; a 429 pauses everyone until its
    `Retry-After`, else the daily limit's reset when it says the day is spent, else its
    reset, else for a jittered backoff that doubles per 429 in a row. Pauses are capped
    at `max_pause`: a day spent is looked at again once a pause, not once a second.

    With `probe`, and no rate known, the limiter discovers instead of guessing:

    * probing: one call at a time until the service answers one. A call that gets no
      answer within `probe_timeout` lets exactly one more go (so a hung connection
      delays, but never bursts). An answer that announces the limit ends it.
    * ramping: an answer with no limit announced (the service may tell it only on a
      429) starts at `ramp_start` calls a second, and each answer that comes back clean
      to a call the pace held back adds `ramp_gain` calls a second: the pace grows as
      fast as answers prove it safe (it doubles within 1 / ramp_gain of a second when
      used to the full), and not while they do not come, nor past what the callers
      need (a pace far above the calls made would reach the ceiling and stop limiting,
      untested). A 429 naming the limit ends discovery; one that names none halves the
      pace, and from then on growth is additive: 5% of the pace of that 429 a second.
      Past `ramp_ceiling` the limiter stops limiting.

    Without `probe`, calls are not held until a rate is known.
    """

    def __init__(
        self,
        rate: float | None = None,
        *,
        pinned: bool = False,
        headroom: float = 0.05,
        catch_up: float = 0.25,
        probe: bool = False,
        probe_timeout: float = 2.0,
        ramp_start: float = 4.0,
        ramp_gain: float = 2.0,
        ramp_ceiling: float = 1000.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        max_pause: float = 60.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if headroom < 0:
            raise ValueError(f"headroom cannot be negative, got {headroom}")
        if not 0 < ramp_start <= ramp_ceiling:
            raise ValueError("need 0 < ramp_start <= ramp_ceiling")
        self._headroom = headroom
        self._catch_up = catch_up
        self._next_at = -math.inf  # when the next call's even turn comes
        self._share: tuple[int, int] | None = None  # (rank, members) among replicas
        self._share_until = math.inf  # when that part lapses unless given again
        self._clock = clock
        self._sleep = sleep
        self._rand = rand
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._slots: deque[Slot] = deque()
        self._paused_until = 0.0
        self._refusals = 0  # 429s in a row that named no wait
        self._max_pause = max_pause
        self._backoff = (backoff_base, backoff_cap)
        # Discovery, while no rate is known.
        self._probing = probe and rate is None
        self._probes_out = 0
        self._last_probe = -math.inf
        self._probe_timeout = probe_timeout
        self._adaptive = probe
        self._ramp: float | None = None  # calls a second while ramping
        self._ramp_start = ramp_start
        self._ramp_gain = ramp_gain
        self._additive: float | None = None  # growth a second after a 429 naming no limit
        self._ramp_ceiling = ramp_ceiling
        self._pinned = pinned and rate is not None
        self._rate: float | None = None
        self._learned: tuple[float, Source] | None = None
        self.on_learned: Callable[[float, Source], None] | None = None
        if rate is not None:
            self._set_rate(rate)

    @property
    def rate(self) -> float | None:
        """The service's limit in calls per second, pinned or learned; None while unknown."""
        return self._rate

    @property
    def pace(self) -> float | None:
        """Calls a second the limiter lets through now: the rate once known, the slow
        start's pace while ramping; None while probing (one at a time) or unlimited."""
        if self._rate is not None:
            return self._rate
        return self._ramp

    @property
    def learned(self) -> tuple[float, Source] | None:
        """The account's limit and how it was learned; None while unknown. With a pinned
        rate, what the service said all the same (kept for the other replicas)."""
        return self._learned

    @property
    def source(self) -> Source | None:
        """How the rate in force was learned; None while unknown."""
        if self._pinned:
            return "pinned"
        return None if self._learned is None else self._learned[1]

    @property
    def phase(self) -> Phase:
        """How calls are paced now: by a known rate, by probing, by a slow start, or not."""
        if self._rate is not None:
            return "known"
        if self._probing:
            return "probing"
        return "ramping" if self._ramp is not None else "unlimited"

    def learn(self, rate: float | None, source: Source = "announced") -> None:
        """The account's rate limit, as the service told it (None: nothing learned), and
        how. Adopted unless the operator pinned one; it ends probing and ramping either
        way. `on_learned` hears of a limit that differs from the one known."""
        if self._adopt(rate, source) and self.on_learned is not None and rate is not None:
            self.on_learned(rate, source)

    def adopt(self, rate: float, source: Source) -> None:
        """The account's limit as another replica, or an earlier start, learned it: as
        `learn`, but not told to `on_learned` (it is known already)."""
        self._adopt(rate, source)

    def _adopt(self, rate: float | None, source: Source) -> bool:
        if rate is None or rate <= 0:
            return False
        self._end_discovery()
        new = self._learned is None or self._learned[0] != rate
        if new:
            self._learned = (rate, source)
        if not self._pinned and rate != self._rate:
            self._set_rate(rate)
        self._wake()
        return new

    def share(self, rank: int, members: int, *, until: float = math.inf) -> None:
        """Replicas share the account: this one, `rank` among `members` (0: none of the
        budget for now), keeps to its part of the calls a window, a whole number each,
        the parts adding up to the account's (daemon/runtime/replicas.py). The part lapses at
        `until`, on this limiter's clock, unless given again before: a replica whose
        heartbeat stalls may be counted gone by the others, who then take its part."""
        self._share = (rank, members)
        self._share_until = until
        self._wake()

    def pause(self, seconds: float) -> None:
        """Hold every caller for `seconds` from now (never shortens a longer pause)."""
        until = self._clock() + min(max(seconds, 0.0), self._max_pause)
        self._paused_until = max(self._paused_until, until)

    async def acquire(self) -> Slot:
        """Wait until one more call fits under the limit, and reserve its place."""
        called = self._clock()
        async with self._lock:
            while (wait := self._wait(self._clock())) > 0:
                await self._nap(wait)
            now = self._clock()
            slot = Slot(now, probe=self._probing, held=now > called)
            if slot.probe:
                self._probes_out += 1
                self._last_probe = now
            elif (pace := self._pace(now)) is not None and pace[0] > 0:
                self._space(now, pace[1] / pace[0])
            # Kept even with no rate known yet: calls made just before the rate is
            # learned are in the service's current window too.
            self._slots.append(slot)
            return slot

    def sent(self, slot: Slot) -> None:
        """The slot's request headers are going out now."""
        slot.at = self._clock()
        slot.pending = False
        self._wake()

    def unanswered(self, slot: Slot, *, sent: bool) -> None:
        """The call ended without an answer. `sent=False`: it surely never reached the
        service, so it takes no place in the window."""
        self._settle(slot)
        if not sent:
            with contextlib.suppress(ValueError):
                self._slots.remove(slot)
        self._wake()

    def answered(self, slot: Slot, *, status: int, hint: RateHint) -> None:
        """The service answered the slot's call with `status`; `hint` is what the
        answer's headers say about the rate limit."""
        self._settle(slot)
        self.learn(hint.limit, "discovered" if status == 429 else "announced")
        if status == 429:
            self._refused(hint)
        else:
            self._refusals = 0
            if hint.remaining == 0 and hint.reset_in:
                self.pause(hint.reset_in)  # the service's window is used up: wait it out
            if self._probing and status < 500:
                self._start_ramp()  # it answers, and announces no limit
            elif self._ramp is not None and status < 500 and slot.held:
                self._grow_ramp()
        self._wake()

    # -- the window ------------------------------------------------------------------

    def _wait(self, now: float) -> float:
        """Seconds until one more call may go; 0 when it may go now."""
        if now < self._paused_until:
            return self._paused_until - now
        if self._probing:
            self._forget(now, _UNLIMITED_MEMORY)  # probes that failed, kept for a while
            if self._probes_out == 0:
                return 0.0
            return max(0.0, self._last_probe + self._probe_timeout - now)
        pace = self._pace(now)
        self._forget(now, pace[1] if pace else _UNLIMITED_MEMORY)
        if pace is None:
            return 0.0
        capacity, window = pace
        if capacity == 0:
            return _PENDING_POLL  # no part of the budget yet: the share may change
        if now < self._next_at:
            return self._next_at - now  # not its even turn yet
        if len(self._slots) < capacity:
            return 0.0
        first = self._slots[0]
        return _PENDING_POLL if first.pending else first.at + window - now

    def _pace(self, now: float) -> tuple[int, float] | None:
        """(capacity, window) in force now; None when calls are not limited."""
        pace = self._rate if self._rate is not None else self._ramp
        if pace is None:
            return None
        capacity, window = self._shared(*_shape(pace, self._headroom))
        return (0, window) if now > self._share_until else (capacity, window)

    def _shared(self, capacity: int, window: float) -> tuple[int, float]:
        """This replica's part of `capacity` calls a `window`: the whole when alone. Parts
        are whole calls, the first ranks taking one more, so that they add up to the
        whole. With fewer calls than replicas, each has one call every `members / capacity`
        windows, and the parts may then meet in one window."""
        if self._share is None:
            return capacity, window
        rank, members = self._share
        if members == 0:
            return 0, window
        part = capacity // members + (1 if rank < capacity % members else 0)
        if part == 0:
            return 1, window * members / capacity
        return part, window

    def _space(self, now: float, interval: float) -> None:
        """The next call's turn, `interval` after this one's. This one may have come late
        for its turn (its caller was busy): up to `catch_up` late, the turns keep to their
        schedule, so the next may go sooner; later than that, the limiter was idle and
        the schedule starts again from now, with no burst."""
        late = now - self._next_at
        self._next_at = (now if late > self._catch_up else self._next_at) + interval

    def _forget(self, now: float, memory: float) -> None:
        # Sends are nearly in order, so only the oldest end is trimmed: a slot sent out
        # of order lingers a little, which can only make the limiter stricter.
        while self._slots and not self._slots[0].pending and self._slots[0].at <= now - memory:
            self._slots.popleft()

    async def _nap(self, seconds: float) -> None:
        """Sleep `seconds` (the injected sleep), or less if something changes first."""
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        waker = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    def _wake(self) -> None:
        """Tell the waiter that its wait may be over: a slot moved, or the pace changed."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _settle(self, slot: Slot) -> None:
        slot.pending = False
        if slot.probe:
            slot.probe = False
            self._probes_out = max(0, self._probes_out - 1)

    def _refused(self, hint: RateHint) -> None:
        """A 429: the whole account is over its limit, so everyone waits."""
        told = hint.retry_after or hint.daily_reset_in or hint.reset_in
        if told:
            self.pause(told)
        else:
            self._refusals += 1
            base, cap = self._backoff
            ceiling = min(cap, base * 2.0 ** (self._refusals - 1))
            self.pause(ceiling * (0.5 + self._rand() / 2))
        if hint.limit is None and self._rate is None and self._adaptive:
            self._slow_down()

    # -- discovery, while no rate is known ---------------------------------------------

    def _end_discovery(self) -> None:
        self._probing = False
        self._ramp = None

    def _start_ramp(self) -> None:
        self._probing = False
        self._ramp = self._ramp_start

    def _grow_ramp(self) -> None:
        """One more answer came back clean: the pace may grow. Each answer adds
        `ramp_gain` (so the pace grows by ramp_gain times itself a second when used to
        the full), or, after a 429 naming no limit, its share of the additive growth."""
        assert self._ramp is not None
        if self._additive is None:
            self._ramp += self._ramp_gain
        else:
            self._ramp += self._additive / self._ramp
        if self._ramp >= self._ramp_ceiling:
            self._ramp = None  # no sign of a limit this far up: stop limiting

    def _slow_down(self) -> None:
        """A 429 that names no limit, while discovering: halve the pace, grow additively."""
        if self._probing:
            current = self._ramp_start * 2
        elif self._ramp is not None:
            current = self._ramp
        else:  # had stopped limiting
            current = self._ramp_ceiling
        self._probing = False
        self._ramp = max(self._ramp_start, current / 2)
        self._additive = max(1.0, current * 0.05)

    def _set_rate(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self._rate = rate


def _shape(rate: float, headroom: float) -> tuple[int, float]:
    """(capacity, window) for `rate` calls a second. Under one call a second the window
    widens instead of allowing a fraction of a call."""
    capacity = max(1, math.floor(rate))
    return capacity, capacity / rate + headroom
