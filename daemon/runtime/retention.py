"""Retention: final dlqId records older than RECOVERYD_RETENTION are pruned on a schedule.

Without it the store grows by every callback for ever, and every query that looks at
pending work gets slower as the finished work piles up. The store prunes in small
transactions, so ingest waits for one of them at most, and keeps a compact key of each
pruned dlqId for longer than the service keeps the DLQ message, so that a late
redelivery of its callback is still a duplicate (store/sqlite/retention.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from daemon.metrics import Metrics
from daemon.store import Store, StoreUnavailable

log = structlog.get_logger(__name__)

# Pruned dlqIds are remembered at least this long, longer when the account's DLQ keeps
# messages longer (the service may redeliver a callback while its message exists).
MIN_DEDUP_SECONDS = 30 * 86400.0


class Retention:
    """Prunes the store every `every` seconds, the first time `first` seconds after start."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        keep: float,
        dlq_retention: Callable[[], float | None],
        budget_window: Callable[[], float] = lambda: 0.0,
        every: float = 600.0,
        first: float = 60.0,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`keep` is RECOVERYD_RETENTION in seconds; `dlq_retention()` the account's DLQ
        retention in seconds, when the service has told it; `budget_window()` the longest
        budget window of the rules in force: records younger than it are kept, however
        short `keep` is, or a budget would forget the recoveries it counts."""
        self._store = store
        self._metrics = metrics
        self._keep = keep
        self._dlq_retention = dlq_retention
        self._budget_window = budget_window
        self._every = every
        self._first = first
        self._wall_clock = wall_clock
        self._sleep = sleep

    async def run(self) -> None:
        """Prune for ever (the supervisor restarts it after a crash)."""
        await self._sleep(self._first)
        while True:
            await self.prune_once()
            await self._sleep(self._every)

    async def prune_once(self) -> int:
        """One pruning pass; how many records it deleted (0 when the store is down)."""
        now = self._wall_clock()
        keep = max(self._keep, self._budget_window())
        dedup_for = max(MIN_DEDUP_SECONDS, self._dlq_retention() or 0.0, keep)
        try:
            pruned = await self._store.prune(before=now - keep, now=now, dedup_for=dedup_for)
        except StoreUnavailable as exc:
            log.warning("retention: store unavailable; pruning later", error=str(exc))
            return 0
        self._metrics.pruned.inc(pruned)
        if pruned:
            log.info("retention: pruned final records", records=pruned,
                     older_than_seconds=keep)  # fmt: skip
        return pruned
