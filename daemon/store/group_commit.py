"""Group commit of incoming callbacks, for every store.

Every callback must be durable before its 2xx leaves, but a commit per request would cap
ingest at the rate the database can flush. So one writer task takes every callback that
arrived while the previous commit was being flushed and commits them together: under
load a flush serves many requests, and when idle a request waits for one flush only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from daemon.store.interface import Added, Callback, StoreUnavailable

log = structlog.get_logger(__name__)

Waiting = list[tuple[Callback, "asyncio.Future[Added]"]]


class GroupCommit:
    """`insert(callbacks)` commits a batch in one transaction and says, for each, whether
    it was new; `failed(exc)` turns what it raised into what the batch's callers hear;
    `committed(outcomes)` hears of each commit that went through."""

    def __init__(
        self,
        insert: Callable[[list[Callback]], Awaitable[list[Added]]],
        *,
        failed: Callable[[Exception], StoreUnavailable],
        committed: Callable[[list[Added]], None] = lambda _: None,
        observe_commit: Callable[[int], None] | None = None,
        max_pending: int = 10_000,
        commit_timeout: float = 10.0,
    ) -> None:
        self._insert = insert
        self._failed = failed
        self._committed = committed
        self._observe_commit = observe_commit
        self._max_pending = max_pending
        self._commit_timeout = commit_timeout
        self._pending: Waiting = []
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self.closing = False
        self._stalled = False  # a commit has run past commit_timeout and not returned yet

    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="recoveryd-group-commit")

    async def close(self) -> bool:
        """Commit what is still pending, within twice the commit timeout (a hung disk must
        not hold up the shutdown for ever); False when the last commit did not finish."""
        self.closing = True
        self._wakeup.set()
        if self._writer is None:
            return True
        done, _ = await asyncio.wait([self._writer], timeout=2 * self._commit_timeout)
        if not done:
            log.error("the store's last commit did not finish; stopping without it")
        return bool(done)

    def add(self, callback: Callback) -> asyncio.Future[Added]:
        """`callback`'s outcome once it is committed; StoreUnavailable at once when it
        cannot be had now."""
        if self.closing:  # also set when the writer has ended, however it ended
            raise StoreUnavailable("the store is shutting down")
        if len(self._pending) >= self._max_pending:
            raise StoreUnavailable("the store is behind; try again")
        if self._stalled:
            raise StoreUnavailable("the store is not committing; try again")
        outcome: asyncio.Future[Added] = asyncio.get_running_loop().create_future()
        self._pending.append((callback, outcome))
        self._wakeup.set()
        return outcome

    async def _write_loop(self) -> None:
        # Whatever arrived while a commit was being flushed is the next batch.
        try:
            while True:
                if not self._pending:
                    if self.closing:
                        return
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    continue
                batch, self._pending = self._pending, []
                await self._commit(batch)
        finally:  # however the writer ends, nobody may be left waiting on it
            self.closing = True
            _fail(self._pending, StoreUnavailable("the store is shutting down"))

    async def _commit(self, batch: Waiting) -> None:
        loop = asyncio.get_running_loop()
        # One timer per commit, not one per request (that was a tenth of the hot path).
        timer = loop.call_later(self._commit_timeout, self._stall, batch)
        try:
            outcomes = await self._insert([callback for callback, _ in batch])
        except Exception as exc:  # every waiter must hear, whatever went wrong
            _fail(batch, self._failed(exc))
            return
        finally:
            timer.cancel()
            self._stalled = False
        self._committed(outcomes)
        for (_, waiter), outcome in zip(batch, outcomes, strict=True):
            if not waiter.done():
                waiter.set_result(outcome)
        if self._observe_commit is not None:
            with contextlib.suppress(Exception):  # a metric must not stop the writer
                self._observe_commit(len(batch))

    def _stall(self, batch: Waiting) -> None:
        """The commit is past commit_timeout (a lock held elsewhere, a stalled disk): tell
        its callers and those queued behind it, and refuse new callbacks until it returns.
        Their callbacks are still written if the store recovers, and the service's retry
        of one then finds a duplicate; if not, the retry stores it. Either way nothing is
        lost or stored twice."""
        self._stalled = True
        _fail([*batch, *self._pending], StoreUnavailable("the store did not commit in time"))


def _fail(waiting: Waiting, error: Exception) -> None:
    for _, waiter in waiting:
        if not waiter.done():  # done: its caller already heard (see _stall)
            waiter.set_exception(error)
