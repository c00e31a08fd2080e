"""Batch and send: decided dlqIds go out in bulk resume/restart calls, each exactly once.

dlqIds decided for the same action and the same overrides share a batch (PRODUCT.md
4.4). A batch is flushed when it holds `maxSize` dlqIds or `maxWait` after its first;
at most 50 go in one call. The batch is persisted (its dlqIds `batched`) when it is
formed, marked as sending right before its call goes out, and settled after it. What a
failed call becomes depends on what the service may have done:

* refused (429, 401/403, connection refused, circuit open): surely not carried out; the
  dlqIds go out again after a backoff and the call is not counted as a send;
* rejected (another 4xx): final, the dlqIds are `failed` (a redrive can retry them);
* unknown (a 5xx, a lost or corrupt answer, a crash after the mark): nothing is sent
  again blind. Each dlqId is looked up with a GET, retried with backoff for as long as
  the service cannot answer: one that left the DLQ was recovered (`done`), one still
  there goes out again. A service that is down never makes a dlqId `failed`.

A batch found unsettled at start whose call was never marked as sending goes straight
back to `decided`: its call surely never left.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, cast

import structlog

from daemon.metrics import Metrics
from daemon.pipeline.calls import recording
from daemon.pipeline.fetch import backoff, is_final_for
from daemon.rules import BatchPolicy
from daemon.store import Store, StoreUnavailable
from daemon.store.records import BatchRecord, Pending
from daemon.supervisor import Supervisor
from daemon.upstream import (
    MAX_BULK,
    BulkAction,
    NotFound,
    Overrides,
    ServiceClient,
    ServiceError,
)
from daemon.upstream.errors import surely_not_carried_out

log = structlog.get_logger(__name__)
Key = tuple[str, str]  # action, overrides (canonical JSON)


@dataclass
class _Group:
    """dlqIds waiting for one batch, with the tightest policy among their rules."""

    action: str
    overrides: str
    dlq_ids: list[str]
    started: float  # monotonic time the first of them was decided
    max_size: int
    max_wait: float

    def due(self, now: float, everything: bool) -> bool:
        full = len(self.dlq_ids) >= self.max_size
        return bool(self.dlq_ids) and (everything or full or now >= self.started + self.max_wait)


class Batcher:
    def __init__(
        self,
        store: Store,
        client: ServiceClient,
        metrics: Metrics,
        policy_of: Callable[[str], BatchPolicy],
        *,
        supervisor: Supervisor | None = None,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        senders: int = 4,
        housekeeping: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`policy_of(rule name)` is the batch policy of a rule in force. A batch whose
        call failed is looked at again after `retry_base` * 2**(sends-1) seconds, at most
        `retry_cap`, jittered. Every `housekeeping` seconds, batches and decided dlqIds
        this process does not hold (a store error came between two steps) are taken up."""
        self._store = store
        self._client = client
        self._metrics = metrics
        self._policy_of = policy_of
        self._supervisor = supervisor or Supervisor(metrics)
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._senders = asyncio.Semaphore(senders)
        self._housekeeping = housekeeping
        self._clock = clock
        self._wall_clock = wall_clock
        self._rand = rand
        self._groups: dict[Key, _Group] = {}
        self._held: set[str] = set()  # dlqIds in a group or in a batch of this process
        self._rule_of: dict[str, str] = {}  # the rule that decided each held dlqId
        self._batches: set[int] = set()  # batches this process is sending or checking
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._stopping = False

    def add(self, pending: Sequence[Pending]) -> None:
        """Queue decided dlqIds for their batches."""
        now, wall = self._clock(), self._wall_clock()
        for item in pending:
            if item.dlq_id in self._held:
                continue
            rule = item.rule or self._rule_of.get(item.dlq_id, "")
            policy = self._policy_of(rule)
            key = (item.action, item.overrides)
            group = self._groups.get(key)
            if group is None:
                started = now - max(0.0, wall - item.decided_at)  # maxWait survives a restart
                group = _Group(item.action, item.overrides, [], started, MAX_BULK, policy.max_wait)
                self._groups[key] = group
            group.max_size = min(group.max_size, policy.max_size)
            group.max_wait = min(group.max_wait, policy.max_wait)
            group.dlq_ids.append(item.dlq_id)
            self._held.add(item.dlq_id)
            if rule:
                self._rule_of[item.dlq_id] = rule
        self._wakeup.set()

    @contextlib.asynccontextmanager
    async def running(self, drain_timeout: float = 10.0) -> AsyncIterator[None]:
        loop = self._supervisor.spawn("batcher", self._run)
        try:
            yield
        finally:
            # Flush what waits and let the calls under way finish, within the deadline;
            # a batch cut short stays persisted and is checked at the next start.
            self._stopping = True
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
            if self._clock() >= next_housekeeping and not self._stopping:
                await self._take_up_orphans()
                next_housekeeping = self._clock() + self._housekeeping
            now = self._clock()
            for key, group in list(self._groups.items()):
                while group.due(now, everything=self._stopping):
                    dlq_ids = group.dlq_ids[: group.max_size]
                    del group.dlq_ids[: group.max_size]
                    group.started = now
                    self._spawn(self._flush(group.action, group.overrides, dlq_ids), dlq_ids)
                if not group.dlq_ids:
                    del self._groups[key]
            if self._stopping:
                return
            deadlines = [group.started + group.max_wait for group in self._groups.values()]
            wait = min([*deadlines, next_housekeeping]) - self._clock()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.0)):
                    await self._wakeup.wait()
            self._wakeup.clear()

    def _spawn(
        self, work: Coroutine[Any, Any, None], dlq_ids: Sequence[str], batch: int | None = None
    ) -> None:
        task = asyncio.create_task(self._guarded(work, dlq_ids, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(
        self, work: Coroutine[Any, Any, None], dlq_ids: Sequence[str], batch: int | None
    ) -> None:
        """One batch's work; a crash lets go of its dlqIds, which stay in the store as they
        were (decided, or batched in an unsettled batch), for housekeeping to take up."""
        try:
            await work
        except Exception as exc:
            self._metrics.task_crashes.labels("batch").inc()
            log.error(
                "batch task crashed; housekeeping takes its dlqIds up again",
                error_type=type(exc).__name__,
                error=str(exc)[:300],
                exc_info=exc,
            )
            self._held.difference_update(dlq_ids)
            if batch is not None:
                self._batches.discard(batch)

    async def _take_up_orphans(self) -> None:
        """Unsettled batches and decided dlqIds that no task of this process holds: at
        start, everything a previous run left; later, what a store error stranded."""
        try:
            pending = await self._store.pending()
            # Read last, and compared with `_batches` with no await in between: a batch
            # settled (and released) while an earlier read was out must not look orphaned.
            batches = await self._store.unsettled_batches()
        except StoreUnavailable as exc:
            log.warning("batcher: store unavailable", error=str(exc))
            return
        for record in batches:
            if record.id in self._batches:
                continue
            self._adopt(record)
            if record.sent_at is None:
                log.info("a batch whose call never went out goes back to its queue",
                         batch=record.id, dlq_ids=len(record.dlq_ids))  # fmt: skip
                work = self._again(record, record.dlq_ids, "its call never went out",
                                   (), sent=False, wait=False)  # fmt: skip
            else:
                log.info("checking a batch whose call was not settled", batch=record.id,
                         dlq_ids=len(record.dlq_ids))  # fmt: skip
                work = self._check(record, "the call's outcome was not recorded", wait=False)
            self._spawn(work, record.dlq_ids, record.id)
        self.add(pending)

    def _adopt(self, record: BatchRecord) -> None:
        self._batches.add(record.id)
        self._held.update(record.dlq_ids)

    def _release(self, record: BatchRecord) -> None:
        self._batches.discard(record.id)
        self._held.difference_update(record.dlq_ids)
        for dlq_id in record.dlq_ids:
            self._rule_of.pop(dlq_id, None)

    async def _flush(self, action: str, overrides: str, dlq_ids: list[str]) -> None:
        try:
            record = await self._store.open_batch(action, overrides, dlq_ids, self._wall_clock())
        except StoreUnavailable as exc:
            # Still decided in the store: housekeeping takes them up again.
            log.warning("batch not persisted; will try again", error=str(exc))
            self._held.difference_update(dlq_ids)
            return
        self._held.difference_update(set(dlq_ids) - set(record.dlq_ids if record else ()))
        if record is not None:
            self._batches.add(record.id)
            await self._send(record)

    async def _send(self, record: BatchRecord) -> None:
        overrides = Overrides.model_validate_json(record.overrides)
        async with self._senders:
            if not await self._service_answers(record.action):
                return  # stopping: the batch was never marked, the next start re-queues it
            try:
                await self._store.mark_sending(record.id, self._wall_clock())
            except StoreUnavailable as exc:
                log.warning("batch not marked as sending; will try again", batch=record.id,
                            error=str(exc))  # fmt: skip
                self._batches.discard(record.id)  # housekeeping puts it back in the queue
                return
            with recording() as calls:
                runs: list[dict[str, Any]] = []
                try:
                    action = cast(BulkAction, record.action)  # only recoveries are batched
                    async for page in self._client.bulk_pages(
                        action, dlq_ids=record.dlq_ids, overrides=overrides
                    ):
                        runs += [run.model_dump(by_alias=True) for run in page.workflow_runs]
                except ServiceError as exc:
                    error: ServiceError | None = exc
                else:
                    error = None
        if error is None:
            await self._settle(record, sent=True, done=record.dlq_ids, runs=runs, calls=calls)
            self._metrics.batch_size.observe(len(record.dlq_ids))
            self._metrics.recovered.labels(record.action).inc(len(record.dlq_ids))
            log.info(
                "batch sent",
                batch=record.id,
                action=record.action,
                dlq_ids=len(record.dlq_ids),
                runs=len(runs),
            )
        elif not surely_not_carried_out(error):
            await self._check(record, f"the call failed: {error}", calls)
        elif is_final_for(error):
            reason = f"the service rejected the call: {error}"
            log.error("batch rejected", batch=record.id, reason=reason)
            await self._settle(record, sent=True, failed=record.dlq_ids, reason=reason, calls=calls)
        else:
            reason = f"the service refused the call: {error}"
            await self._again(record, record.dlq_ids, reason, calls, sent=False)

    async def _service_answers(self, action: str) -> bool:
        """Wait while the client holds `action` back (its circuit is open): a call now
        would only be refused. False when the batcher stops meanwhile."""
        while (retry_at := self._client.retry_at(action)) is not None:
            if self._stopping:
                return False
            await asyncio.sleep(max(0.05, min(1.0, retry_at - self._clock())))
        return True

    async def _check(
        self,
        record: BatchRecord,
        reason: str,
        calls: Sequence[dict[str, Any]] = (),
        *,
        wait: bool = True,
    ) -> None:
        """The call may or may not have been carried out: look each dlqId up (after the
        backoff, when `wait`), then settle the batch. Lookups that fail are tried again,
        with a growing backoff, for as long as the service cannot answer them."""
        sends = await self._sends(record)
        if sends is None:
            return
        attempt = max(sends.values(), default=0) + 1 if wait else 0
        while True:
            if attempt:
                await asyncio.sleep(backoff(attempt, self._retry_base, self._retry_cap, self._rand))
            attempt += 1
            if not await self._service_answers("get_dlq_message"):
                self._batches.discard(record.id)
                return
            lookups = await asyncio.gather(*(self._in_dlq(dlq_id) for dlq_id in record.dlq_ids))
            if None not in lookups:
                break
            if self._stopping:  # checked again at the next start
                self._batches.discard(record.id)
                return
            log.warning("batch not checked; will try again", batch=record.id)
        gone = [dlq_id for dlq_id, there in zip(record.dlq_ids, lookups, strict=True) if not there]
        still = [dlq_id for dlq_id, there in zip(record.dlq_ids, lookups, strict=True) if there]
        log.info("batch checked", batch=record.id, gone=len(gone), still_in_dlq=len(still),
                 reason=reason)  # fmt: skip
        await self._again(record, still, reason, calls, done=gone, sent=True, wait=False)

    async def _in_dlq(self, dlq_id: str) -> bool | None:
        """Whether `dlq_id` is still in the DLQ; None when the service cannot say."""
        try:
            await self._client.get_dlq_message(dlq_id)
        except NotFound:
            return False
        except ServiceError:
            return None
        return True

    async def _again(
        self,
        record: BatchRecord,
        dlq_ids: Sequence[str],
        reason: str,
        calls: Sequence[dict[str, Any]],
        *,
        sent: bool,
        done: Sequence[str] = (),
        wait: bool = True,
    ) -> None:
        """Settle the batch with `done` recovered and `dlq_ids` decided again, then queue
        those for a later batch under their rules' policies. `wait`: after the backoff."""
        if wait:
            sends = await self._sends(record)
            if sends is None:
                return
            await asyncio.sleep(self._delay(sends))
        rules = {dlq_id: self._rule_of.get(dlq_id, "") for dlq_id in dlq_ids}
        settled = await self._settle(
            record, sent=sent, done=done, again=dlq_ids, reason=reason, calls=calls
        )
        if settled and dlq_ids:
            now = self._wall_clock()
            again = [
                Pending(dlq_id, record.action, record.overrides, rules[dlq_id], now)
                for dlq_id in dlq_ids
            ]
            self.add(again)

    async def _sends(self, record: BatchRecord) -> dict[str, int] | None:
        """How many calls may have carried each of the batch's dlqIds; None when the store
        cannot say, and the batch is left for housekeeping."""
        try:
            return await self._store.sends(list(record.dlq_ids))
        except StoreUnavailable:
            self._batches.discard(record.id)
            return None

    def _delay(self, sends: dict[str, int]) -> float:
        """Backoff before a batch's dlqIds go out again: longer each time they were sent."""
        return backoff(max(sends.values(), default=1), self._retry_base, self._retry_cap,
                       self._rand)  # fmt: skip

    async def _settle(
        self,
        record: BatchRecord,
        *,
        sent: bool,
        done: Sequence[str] = (),
        again: Sequence[str] = (),
        failed: Sequence[str] = (),
        reason: str | None = None,
        runs: Sequence[dict[str, Any]] = (),
        calls: Sequence[dict[str, Any]] = (),
    ) -> bool:
        try:
            await self._store.settle_batch(
                record.id,
                done=done,
                again=again,
                failed=failed,
                reason=reason,
                runs=runs,
                calls=calls,
                sent=sent,
                now=self._wall_clock(),
            )
        except StoreUnavailable as exc:
            # Unsettled in the store: housekeeping checks it with GETs, nothing is lost.
            log.warning("batch outcome not recorded", batch=record.id, error=str(exc))
            self._batches.discard(record.id)
            return False
        finally:
            self._release(record)
        return True
