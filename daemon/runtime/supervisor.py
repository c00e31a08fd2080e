"""Every long-lived background task runs here: a crash is logged, counted and restarted.

A worker that dies of an exception nobody foresaw (a library error that escaped its
translation, a bug) must not leave the daemon looking healthy while nothing is fetched
or sent any more. The supervisor restarts it with backoff (never a hot loop), counts the
crash in `recoveryd_task_crashes_total{task}`, and names the task as down in
`/api/v1/status` until it runs again (after Kubernetes' controllers). Not in
readiness: no supervised task stores callbacks, and a replica that stops taking them
because its fetch crashed would only lose the ones the service gives up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import structlog

from daemon.metrics import Metrics

log = structlog.get_logger(__name__)

Work = Callable[[], Coroutine[Any, Any, None]]


class Supervisor:
    """Runs tasks under supervision. `work()` is called again after a crash, so it must
    start from what the store says (every stage does: its state is in the store).

    A task whose `work()` returns has finished and is not restarted. A crash waits
    `base * 2**(crashes-1)` seconds (jittered, at most `cap`) before the restart; a task
    that ran `healthy_after` seconds without crashing starts its count again.
    """

    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        base: float = 0.5,
        cap: float = 30.0,
        healthy_after: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._metrics = metrics
        self._base = base
        self._cap = cap
        self._healthy_after = healthy_after
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self._down: dict[str, str] = {}  # task name -> why it is down, while it is

    def spawn(self, name: str, work: Work) -> asyncio.Task[None]:
        """Start `work` under supervision. While it is down after a crash, `down()` names
        it."""
        if self._metrics is not None:
            self._metrics.task_crashes.labels(name)  # its crashes at 0 from now on
        return asyncio.create_task(self._supervise(name, work), name=f"recoveryd-{name}")

    @contextlib.asynccontextmanager
    async def running(self, name: str, work: Work) -> AsyncIterator[None]:
        """`work` under supervision for the block, cancelled at its end."""
        task = self.spawn(name, work)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def down(self) -> dict[str, str]:
        """The tasks waiting for their restart after a crash, and why; empty when all run."""
        return dict(sorted(self._down.items()))

    async def status(self) -> dict[str, Any]:
        """`/api/v1/status`'s part: the tasks down."""
        return {"tasks": {"down": self.down()}}

    async def _supervise(self, name: str, work: Work) -> None:
        crashes = 0
        while True:
            started = self._clock()
            try:
                await work()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._clock() - started >= self._healthy_after:
                    crashes = 0
                crashes += 1
                delay = min(self._cap, self._base * 2 ** (crashes - 1)) * (0.5 + self._rand() / 2)
                if self._metrics is not None:
                    self._metrics.task_crashes.labels(name).inc()
                log.error(
                    "task crashed; restarting it",
                    task=name,
                    error_type=type(exc).__name__,
                    error=str(exc)[:300],
                    crashes=crashes,
                    in_seconds=round(delay, 3),
                    exc_info=exc,
                )
                self._down[name] = f"{type(exc).__name__}, restarting in {delay:.1f}s"
                try:
                    await self._sleep(delay)
                finally:
                    self._down.pop(name, None)
