"""The account's limits on calls: requests per second, counted in fixed one-second
windows or in a sliding second, and requests per day, counted per UTC day."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

# Which answers carry the `Burst-RateLimit-*` headers: every answer (as the service
# documents), or only a 429 (a service that tells its limit only once it is exceeded).
Announce = Literal["always", "on_429"]
# How arrivals are counted: in fixed windows of one second of the clock, or in the
# second before each arrival (a sliding window, stricter: no two windows' worth can
# arrive within one second across a window's edge).
Counting = Literal["fixed", "sliding"]


@dataclass(frozen=True)
class Verdict:
    """What the limiter says about one request, and the `Burst-RateLimit-*` headers it earns."""

    allowed: bool
    limit: int | None
    remaining: int
    reset: int  # unix seconds: the end of the current window, or when a sliding one has room
    announce: Announce = "always"

    def headers(self) -> dict[str, str]:
        if self.limit is None:
            return {}
        return burst_headers(self.limit, self.remaining, self.reset)


def burst_headers(limit: int, remaining: int, reset: int) -> dict[str, str]:
    return {
        "Burst-RateLimit-Limit": str(limit),
        "Burst-RateLimit-Remaining": str(remaining),
        "Burst-RateLimit-Reset": str(reset),
    }


class BurstLimit:
    """Counts every arriving request against the per-second limit, whether it is let
    through or not: in its fixed one-second window (`counting="fixed"`, the default), or
    among the arrivals of the second before it (`"sliding"`).

    `max_in_window` is the most requests seen in any one window (with `"sliding"`, in any
    second), so a test can assert that a client never went over the limit, even when the
    limit is off (`limit=None`). `announce` says which answers carry the headers.
    """

    def __init__(
        self, limit: int | None, *, counting: Counting = "fixed", announce: Announce = "always"
    ) -> None:
        self.limit = limit
        self.counting: Counting = counting
        self.announce: Announce = announce
        self.calls = 0
        self.max_in_window = 0
        self._window: int | None = None
        self._count = 0
        self._arrivals: deque[float] = deque()  # the last second's, when sliding

    def reset(
        self, limit: int | None, *, counting: Counting = "fixed", announce: Announce = "always"
    ) -> None:
        """Forget every count, and start over with `limit`."""
        self.limit = limit
        self.counting, self.announce = counting, announce
        self.calls = self.max_in_window = self._count = 0
        self._window = None
        self._arrivals.clear()

    def hit(self, now: float) -> Verdict:
        self.calls += 1
        if self.counting == "sliding":
            count, reset = self._slide(now)
        else:
            count, reset = self._fixed(now)
        self.max_in_window = max(self.max_in_window, count)
        if self.limit is None:
            return Verdict(True, None, 0, reset, self.announce)
        remaining = max(0, self.limit - count)
        return Verdict(count <= self.limit, self.limit, remaining, reset, self.announce)

    def _fixed(self, now: float) -> tuple[int, int]:
        """This arrival's count in its window, and the window's end."""
        window = math.floor(now)
        if window != self._window:
            self._window, self._count = window, 0
        self._count += 1
        return self._count, window + 1

    def _slide(self, now: float) -> tuple[int, int]:
        """Arrivals in the second up to this one (itself included), and the whole second
        by which the oldest of them has left it."""
        while self._arrivals and self._arrivals[0] <= now - 1.0:
            self._arrivals.popleft()
        self._arrivals.append(now)
        return len(self._arrivals), math.ceil(self._arrivals[0] + 1.0)


DAY = 86_400  # seconds


@dataclass(frozen=True)
class DailyVerdict:
    """What the daily budget says about one call, and the `RateLimit-*` headers it earns."""

    allowed: bool
    limit: int
    remaining: int
    reset: int  # unix seconds: the next UTC midnight

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset),
        }


class DailyBudget:
    """The account's requests per day (`max_requests_per_day`), counted per UTC day.

    The service documents the headers and the 429, not what spends the budget; here
    every call it serves does (the calls the burst limit counts), and a call it refuses
    or a fault answers does not.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self._day: int | None = None

    def reset(self, limit: int | None) -> None:
        """Forget what was spent, and start over with `limit`."""
        self.limit = limit
        self.used = 0
        self._day = None

    def check(self, now: float) -> DailyVerdict | None:
        """Whether one more call fits today; None when no daily limit is set."""
        if self.limit is None:
            return None
        day = math.floor(now / DAY)
        if day != self._day:
            self._day, self.used = day, 0
        remaining = max(0, self.limit - self.used)
        return DailyVerdict(remaining > 0, self.limit, remaining, (day + 1) * DAY)

    def spend(self, verdict: DailyVerdict) -> DailyVerdict:
        """Spend one call of the budget `verdict` allowed; the verdict after it."""
        self.used += 1
        return DailyVerdict(True, verdict.limit, max(0, verdict.remaining - 1), verdict.reset)


@dataclass
class CallLimits:
    """What the account's limits say about one call: whether it is refused, and the
    headers its answer carries. `quiet`: a fault asked for no such header."""

    burst: Verdict | None
    daily: DailyVerdict | None
    quiet: bool = False

    @property
    def refusal(self) -> str | None:
        """The 429's message when a limit refuses the call, the daily one first."""
        if self.daily is not None and not self.daily.allowed:
            return "daily request limit exceeded"
        if self.burst is not None and not self.burst.allowed:
            return "rate limit exceeded"
        return None

    def admit(self, budget: DailyBudget) -> str | None:
        """The 429's message when a limit refuses the call; else None, and the call is
        spent from the daily `budget`."""
        refusal = self.refusal
        if refusal is None and self.daily is not None:
            self.daily = budget.spend(self.daily)
        return refusal

    def headers(self, status: int) -> dict[str, str]:
        if self.quiet:
            return {}
        told: dict[str, str] = {}
        if self.burst is not None and (self.burst.announce == "always" or status == 429):
            told = self.burst.headers()
        # The SDKs take any 429 with `RateLimit-Limit` for the daily limit's: no other
        # 429 may carry it.
        if self.daily is not None and (status != 429 or not self.daily.allowed):
            told |= self.daily.headers()
        return told
