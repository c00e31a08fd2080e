"""The account's rate limit, learned once for every replica and every start: kept in the
store beside how it was learned.

A service may tell its limit only on a 429 (`Burst-RateLimit-Limit` on the refusal): a
limiter that starts from nothing pays for it with a burst of 429s. Learned once, the
limit is saved (`Store.save_learned_rate`); a start reads it before the first call, and
replicas sharing a PostgreSQL store read it every `poll` seconds, every `discovering_poll`
while their own limiter is still discovering, so that one replica's discovery ends the
others'. Each replica still keeps to its part of the limit (daemon/runtime/replicas.py).

The latest limit learned wins: a 429 or an answer announcing another limit, or the
account record read at a rotation, replaces the one kept. A limit the operator pinned
(RECOVERYD_MAX_RPS) is that replica's own and not kept; what the service says is kept
all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import structlog

from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.store.records import LearnedRate
from daemon.upstream import RateLimiter
from daemon.upstream.ratelimit import Source

log = structlog.get_logger(__name__)


class SharedRate:
    def __init__(
        self,
        store: Store,
        limiter: RateLimiter,
        replica: str,
        supervisor: Supervisor,
        *,
        poll: float = 10.0,
        discovering_poll: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._limiter = limiter
        self._replica = replica
        self._supervisor = supervisor
        self._poll = poll
        self._discovering_poll = discovering_poll
        self._wall_clock = wall_clock
        self._known: LearnedRate | None = None  # as last read or saved
        self._unsaved: LearnedRate | None = None  # learned here, not in the store yet
        self._news = asyncio.Event()
        self._failing = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For the block: the limit kept is adopted before it starts (when the store
        answers; else at the first look), and every limit learned here is saved."""
        with contextlib.suppress(StoreUnavailable):
            await self._read()
        if self._known is None and (learned := self._limiter.learned) is not None:
            self._learned(*learned)  # before the start (the credentials file's record)
        self._limiter.on_learned = self._learned
        try:
            async with self._supervisor.running("learned-rate", self._run):
                yield
        finally:
            self._limiter.on_learned = None
            with contextlib.suppress(StoreUnavailable):
                await self._save()

    def _learned(self, rate: float, source: Source) -> None:
        self._unsaved = LearnedRate(rate, source, self._wall_clock(), self._replica)
        self._news.set()

    async def _run(self) -> None:
        while True:
            discovering = self._limiter.phase in ("probing", "ramping")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._discovering_poll if discovering else self._poll):
                    await self._news.wait()
            self._news.clear()
            try:
                if self._unsaved is not None:
                    await self._save()
                elif self._store.shared or self._known is None:
                    await self._read()
            except StoreUnavailable as exc:
                if not self._failing:
                    log.warning("the learned rate limit could not be read or kept; "
                                "trying again", error=str(exc))  # fmt: skip
                self._failing = True
            else:
                self._failing = False

    async def _read(self) -> None:
        kept = await self._store.learned_rate()
        if kept is None or kept == self._known or self._unsaved is not None:
            return  # nothing new, or older than what was learned here meanwhile
        self._known = kept
        if self._limiter.learned is None or self._limiter.learned[0] != kept.rate:
            log.info("rate limit adopted from the store", rate=kept.rate, source=kept.source,
                     learned_by=kept.replica)  # fmt: skip
        self._limiter.adopt(kept.rate, kept.source)

    async def _save(self) -> None:
        learned = self._unsaved
        if learned is None:
            return
        await self._store.save_learned_rate(learned)
        log.info("rate limit learned and kept", rate=learned.rate, source=learned.source)
        self._known = learned
        if self._unsaved is learned:  # else a newer one came meanwhile
            self._unsaved = None
