"""Open file descriptors against their limit.

Every connection takes a descriptor. When they run out, accepting fails and the event
loop retries quietly: callbacks stall with no log line. So the soft limit is raised to
the hard one at start, a warning is logged at 80 %, and readiness fails at the limit
(the metrics are prometheus_client's process_open_fds and process_max_fds).
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

WARN_AT = 0.8


def _reserve(limit: int) -> int:
    """ "At the limit": so few left that the daemon's own work (the store, calls to the
    service, a probe's connection) may find none."""
    return min(32, max(4, limit // 20))


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft limit on descriptors to the hard one; the (before, after) soft
    limits. An unlimited hard limit is left alone (the kernel caps what may be set)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, hard
    return soft, soft


def open_descriptors() -> int | None:
    """How many descriptors this process has open; None where the system does not say."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        if Path(folder).is_dir():
            return len(os.listdir(folder)) - 1  # the listing's own
    return None


def soft_limit() -> int | None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


class DescriptorWatch:
    """Warns when descriptors pass WARN_AT of the limit (once, until they fall back
    below), and tells readiness when they are at it."""

    def __init__(
        self,
        *,
        count: Callable[[], int | None] = open_descriptors,
        limit: Callable[[], int | None] = soft_limit,
        every: float = 5.0,
    ) -> None:
        self._count = count
        self._limit = limit
        self._every = every
        self._warned = False

    def problems(self) -> list[str]:
        """Why the daemon is not ready, as far as descriptors go."""
        used, limit = self._count(), self._limit()
        if used is None or limit is None or used < limit - _reserve(limit):
            return []
        return [f"descriptors: {used} of {limit} open; new connections may be refused"]

    def check(self) -> None:
        used, limit = self._count(), self._limit()
        if used is None or limit is None:
            return
        if used >= WARN_AT * limit and not self._warned:
            self._warned = True
            log.warning(
                "open descriptors near their limit; connections will be refused at it",
                open=used,
                limit=limit,
            )
        elif used < (WARN_AT - 0.1) * limit and self._warned:
            self._warned = False
            log.info("open descriptors back under their limit", open=used, limit=limit)

    async def run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self._every)
