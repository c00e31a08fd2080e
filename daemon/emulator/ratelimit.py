"""The account's requests-per-second limit, counted in fixed one-second windows."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What the limiter says about one request, and the `Burst-RateLimit-*` headers it earns."""

    allowed: bool
    limit: int | None
    remaining: int
    reset: int  # unix seconds: the end of the current window

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


class FixedWindow:
    """Counts every arriving request in its one-second window, whether it is let through or not.

    `max_in_window` is the most requests seen in any one window, so a test can assert that a
    client never went over the limit, even when the limit is off (`limit=None`).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.calls = 0
        self.max_in_window = 0
        self._window: int | None = None
        self._count = 0

    def reset(self, limit: int | None) -> None:
        """Forget every count, and start over with `limit`."""
        self.limit = limit
        self.calls = self.max_in_window = self._count = 0
        self._window = None

    def hit(self, now: float) -> Verdict:
        window = math.floor(now)
        if window != self._window:
            self._window, self._count = window, 0
        self._count += 1
        self.calls += 1
        self.max_in_window = max(self.max_in_window, self._count)
        if self.limit is None:
            return Verdict(True, None, 0, window + 1)
        remaining = max(0, self.limit - self._count)
        return Verdict(self._count <= self.limit, self.limit, remaining, window + 1)
