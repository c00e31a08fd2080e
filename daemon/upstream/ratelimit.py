"""A client-side limiter that keeps every call to the service under its rate limit."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

Clock = Callable[[], float]
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
    """

    def __init__(
        self,
        rate: float | None = None,
        *,
        pinned: bool = False,
        headroom: float = 0.05,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if headroom < 0:
            raise ValueError(f"headroom cannot be negative, got {headroom}")
        self._headroom = headroom
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
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

    def learn(self, rate: float | None) -> None:
        """Adopt the limit the service announced, unless the operator pinned one."""
        if not self._pinned and rate is not None and rate > 0 and rate != self._rate:
            self._set_rate(rate)

    def pause(self, seconds: float) -> None:
        """Hold every caller for `seconds` from now (never shortens a longer pause)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    async def acquire(self) -> None:
        """Wait until one more call fits under the limit, then count it."""
        async with self._lock:
            while (wait := self._wait()) > 0:
                await self._sleep(wait)
            if self._rate is not None:
                self._starts.append(self._clock())

    def _wait(self) -> float:
        now = self._clock()
        if now < self._paused_until:
            return self._paused_until - now
        if self._rate is None:
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
