"""A client-side limiter that keeps every call to the service under its rate limit."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

Clock = Callable[[], float]
# Seconds of starts kept while no rate is known, so that a rate learned later counts them.
_UNLIMITED_MEMORY = 10.0
Sleep = Callable[[float], Awaitable[None]]


class RateLimiter:
    """A sliding-window limiter shared by every caller of one account.

    At most `capacity` (the rate, rounded down) calls start in any window of one
    second plus `headroom`, measured on the injected monotonic clock. The service
    counts arrivals in its own windows, and a call arrives some variable time after
    it starts, so two starts a second apart can arrive less than a second apart.
    `headroom` absorbs that much variation in network delay, at the price of
    `headroom` seconds of throughput a window (5% by default). Waiters are served in
    arrival order (asyncio.Lock is FIFO), so a burst drains fairly.

    The rate is either pinned (configured by the operator) or learned: from the
    account record's `max_requests_per_second` or a response's
    `Burst-RateLimit-Limit`. `pause` stops everyone after a 429: one caller being
    told to slow down means the whole account is over its limit.

    With `probe`, and no rate yet, calls go one at a time until the service has
    announced its limit or answered a call successfully (`learn` is told of every
    answer): a daemon that starts with a backlog must not burst past a limit nobody
    has announced yet. A probe that gets no answer within `probe_timeout` lets the
    next call go.
    """

    def __init__(
        self,
        rate: float | None = None,
        *,
        pinned: bool = False,
        headroom: float = 0.05,
        probe: bool = False,
        probe_timeout: float = 2.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if headroom < 0:
            raise ValueError(f"headroom cannot be negative, got {headroom}")
        self._headroom = headroom
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._probing = probe and rate is None
        self._probe_out = False
        self._probe_timeout = probe_timeout
        self._answered = asyncio.Event()
        self._starts: deque[float] = deque()
        self._paused_until = 0.0
        self._pinned = pinned and rate is not None
        self._rate: float | None = None
        self._capacity = 0
        self._window = 0.0
        self._set_rate(rate)

    @property
    def rate(self) -> float | None:
        """Calls per second allowed now; None means unlimited."""
        return self._rate

    def learn(self, rate: float | None, *, settled: bool = True) -> None:
        """The service answered, announcing `rate` (None: no limit announced). Adopt it,
        unless the operator pinned one. An answer that is an error and announces nothing
        (`settled=False`) does not end probing: the next probe goes."""
        if rate is not None or settled:
            self._probing = False
        self._probe_out = False
        self._answered.set()
        if self._probing:  # wake the waiters; they wait on a fresh event from now on
            self._answered = asyncio.Event()
        if not self._pinned and rate is not None and rate > 0 and rate != self._rate:
            self._set_rate(rate)

    def pause(self, seconds: float) -> None:
        """Hold every caller for `seconds` from now (never shortens a longer pause)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    async def acquire(self) -> None:
        """Wait until one more call fits under the limit, then count it."""
        while self._probing and self._probe_out:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._probe_timeout):
                    await self._answered.wait()
                continue
            self._probe_out = False  # the probe got no answer in time: the next one goes
        self._probe_out = self._probing
        async with self._lock:
            while (wait := self._wait()) > 0:
                await self._sleep(wait)
            # Counted even with no rate known yet: calls made just before the rate is
            # learned are in the service's current window too.
            self._starts.append(self._clock())

    def _wait(self) -> float:
        now = self._clock()
        if now < self._paused_until:
            return self._paused_until - now
        if self._rate is None:
            while self._starts and self._starts[0] <= now - _UNLIMITED_MEMORY:
                self._starts.popleft()
            return 0.0
        while self._starts and self._starts[0] <= now - self._window:
            self._starts.popleft()
        if len(self._starts) < self._capacity:
            return 0.0
        return self._starts[0] + self._window - now

    def _set_rate(self, rate: float | None) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self._rate = rate
        if rate is None:
            return
        # Under one call a second, widen the window instead of allowing a fraction.
        self._capacity = max(1, math.floor(rate))
        self._window = self._capacity / rate + self._headroom
