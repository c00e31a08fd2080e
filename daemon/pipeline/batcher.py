"""The batcher's loop: batches formed, sent and checked, each in a task, and housekeeping.

Decided dlqIds go out in bulk resume/restart calls, each exactly once (ARCHITECTURE.md,
exactly once; docs/pipeline.md, Batches). The loop runs its collaborators, wired in
the pipeline's assembly (daemon/pipeline/__init__.py), and owns only the tasks and
the timing between them:

* forming.py groups the decided dlqIds and says when a batch is due;
* ledger.py persists each batch and settles it, and knows what this process holds;
* sending.py makes a batch's call and says what its answer means;
* checking.py looks up the dlqIds of a call whose outcome is unknown;
* housekeeping.py finds what no task of this process holds, every `housekeeping`
  seconds and when a replica is gone;
* waits.py ends the backoffs for the service when it is back.

It uses those and the supervisor, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

import structlog

from daemon.metrics import Metrics
from daemon.pipeline.checking import Checker
from daemon.pipeline.forming import Formed, Forming
from daemon.pipeline.housekeeping import Housekeeping
from daemon.pipeline.ledger import Ledger
from daemon.pipeline.sending import LET_GO, Sender, Unsure
from daemon.pipeline.waits import ServiceWaits
from daemon.runtime.supervisor import Supervisor
from daemon.store.records import Pending

log = structlog.get_logger(__name__)
# A batch's work runs in a task of its own, not supervised (housekeeping takes its
# dlqIds up again): a crash is counted under this task name.
BATCH_TASK = "batch"


class Batcher:
    def __init__(
        self,
        forming: Forming,
        ledger: Ledger,
        sender: Sender,
        checker: Checker,
        housekeeping: Housekeeping,
        waits: ServiceWaits,
        metrics: Metrics,
        *,
        supervisor: Supervisor | None = None,
        housekeeping_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Every `housekeeping_every` seconds, batches and decided dlqIds this process does
        not hold (a store error came between two steps) are taken up."""
        self._forming = forming
        self._ledger = ledger
        self._sender = sender
        self._checker = checker
        self._housekeeping = housekeeping
        self._waits = waits
        self._metrics = metrics
        self._supervisor = supervisor or Supervisor(metrics)
        self._housekeeping_every = housekeeping_every
        self._clock = clock
        self._wall_clock = wall_clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._take_up_soon = False

    def add(self, pending: Sequence[Pending]) -> None:
        """Queue decided dlqIds for their batches."""
        self._forming.add(pending, self._clock(), self._wall_clock(), self._ledger.held)
        self._wakeup.set()

    def take_up_now(self) -> None:
        """Look for work nobody holds now, not at the next housekeeping: a replica is
        gone, and its batches and decided dlqIds are anyone's."""
        self._take_up_soon = True
        self._wakeup.set()

    def service_back(self) -> None:
        """The service answers again (a circuit closed): the batches waiting out a
        backoff for it go now."""
        self._waits.back()

    @contextlib.asynccontextmanager
    async def running(self, drain_timeout: float = 10.0) -> AsyncIterator[None]:
        loop = self._supervisor.spawn("batcher", self._run)
        self._metrics.task_crashes.labels(BATCH_TASK)  # at 0 from now on, as the batcher's
        try:
            yield
        finally:
            # Flush what waits and let the calls under way finish, within the deadline;
            # a batch cut short stays persisted and is checked at the next start.
            self._waits.stopping = True
            self._wakeup.set()
            deadline = self._clock() + drain_timeout
            await asyncio.wait([loop], timeout=drain_timeout)
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=max(0.0, deadline - self._clock()))
            tasks = [loop, *self._tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        # Restarted by the supervisor after a crash: whatever this process held is taken
        # up again from the store, so start with nothing held by the loop itself.
        next_housekeeping = self._clock()
        while True:
            due = self._take_up_soon or self._clock() >= next_housekeeping
            if due and not self._waits.stopping:
                self._take_up_soon = False
                await self._take_up_orphans()
                next_housekeeping = self._clock() + self._housekeeping_every
            for formed in self._forming.due(self._clock(), everything=self._waits.stopping):
                self._spawn(self._flush(formed), formed.dlq_ids)
            if self._waits.stopping:
                return
            wait = min([*self._forming.deadlines(), next_housekeeping]) - self._clock()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.0)):
                    await self._wakeup.wait()
            self._wakeup.clear()

    async def _take_up_orphans(self) -> None:
        orphans = await self._housekeeping.orphans()
        if orphans is None:
            return
        for record in orphans.batches:
            self._spawn(self._housekeeping.resume(record), record.dlq_ids, record.id)
        self.add(orphans.pending)

    def _spawn(
        self,
        work: Coroutine[Any, Any, Sequence[Pending]],
        dlq_ids: Sequence[str],
        batch: int | None = None,
    ) -> None:
        task = asyncio.create_task(self._guarded(work, dlq_ids, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(
        self,
        work: Coroutine[Any, Any, Sequence[Pending]],
        dlq_ids: Sequence[str],
        batch: int | None,
    ) -> None:
        """One batch's work, then its dlqIds decided again queued; a crash lets go of its
        dlqIds, which stay in the store as they were (decided, or batched in an unsettled
        batch), for housekeeping to take up."""
        try:
            queued = await work
            if queued:
                self.add(queued)
        except Exception as exc:
            self._metrics.task_crashes.labels(BATCH_TASK).inc()
            log.error(
                "batch task crashed; housekeeping takes its dlqIds up again",
                error_type=type(exc).__name__,
                error=str(exc)[:300],
                exc_info=exc,
            )
            self._ledger.held.difference_update(dlq_ids)
            if batch is not None:
                self._ledger.batches.discard(batch)

    async def _flush(self, formed: Formed) -> Sequence[Pending]:
        """Persist a batch formed, send it, and check it when its answer does not say."""
        record = await self._ledger.open(formed.action, formed.overrides, formed.dlq_ids)
        if record is None:
            return ()
        try:
            outcome = await self._sender.send(record)
            if isinstance(outcome, Unsure):
                return await self._checker.check(
                    record,
                    outcome.reason,
                    outcome.calls,
                    outcome.runs,
                    wait=not outcome.rejected,
                    rejected=outcome.rejected,
                )
            if outcome == LET_GO:
                self.take_up_now()
            return ()
        except Exception:
            # Left unsettled in the store: housekeeping must see it as nobody's.
            self._ledger.batches.discard(record.id)
            raise
