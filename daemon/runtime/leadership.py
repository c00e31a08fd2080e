"""The singleton jobs, on one replica at a time.

Token rotation, sweeps, pruning, endpoint removals and notifications must not run on two
replicas at once: two would rotate the token twice, page the DLQ twice, delete the same
endpoint twice. The replica that holds the store's singleton lock (a PostgreSQL advisory
lock; always this daemon's on SQLite) runs them; the others try for it every `retry`
seconds. The holder checks every `check` seconds that the lock is still its own and, once
it may not be, stops the jobs at once: a lock lost is a job stopped within `check` plus
the check's timeout, and taken over by another replica within `retry` of the lock being
freed (at once when the holder dies; within the server's keepalive when the network
between them fails: see store/postgres/singleton.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager

import structlog

from daemon.metrics import Metrics
from daemon.store import SingletonLock, StoreUnavailable

log = structlog.get_logger(__name__)
Job = Callable[[], AbstractAsyncContextManager[object]]


class Leadership:
    def __init__(
        self,
        lock: SingletonLock,
        jobs: Sequence[Job],
        metrics: Metrics,
        *,
        retry: float = 5.0,
        check: float = 2.0,
    ) -> None:
        """`jobs` are entered, in order, while the lock is held, and exited when it is
        lost or the block of `running` ends; each must be able to run again."""
        self._lock = lock
        self._jobs = jobs
        self._metrics = metrics
        self._retry = retry
        self._check = check
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def holding(self) -> bool:
        return self._stack is not None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Leadership]:
        """Hold or wait for the lock for the block. A lock taken at once (SQLite's
        always is) starts the jobs before the block does, as a daemon alone expects."""
        with contextlib.suppress(StoreUnavailable):
            if await self._lock.acquire():
                await self._start()
        task = asyncio.create_task(self._run(), name="recoveryd-leadership")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self._stop()
            await self._lock.release()

    async def _run(self) -> None:
        while True:
            if self.holding:
                await asyncio.sleep(self._check)
                if not await self._lock.held():
                    log.error("singleton lock lost; this replica stops the singleton jobs")
                    await self._stop()
                continue
            await asyncio.sleep(self._retry)
            try:
                if await self._lock.acquire():
                    await self._start()
            except StoreUnavailable as exc:
                log.warning("cannot try for the singleton lock", error=str(exc))
            except Exception as exc:  # a job that cannot start: the next try starts over
                log.error("singleton jobs did not start", error=str(exc), exc_info=exc)

    async def _start(self) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            for job in self._jobs:
                await stack.enter_async_context(job())
        except BaseException:
            await stack.aclose()
            await self._lock.release()
            raise
        self._stack = stack
        self._metrics.singleton_holder.set(1)
        log.info("this replica runs the singleton jobs")

    async def _stop(self) -> None:
        stack, self._stack = self._stack, None
        self._metrics.singleton_holder.set(0)
        if stack is not None:
            await stack.aclose()
            await self._lock.release()
