"""Batch and send: decided dlqIds go out in bulk resume/restart calls, each exactly once.

dlqIds decided for the same action and the same overrides share a batch (PRODUCT.md
4.4). A batch is flushed when it holds `maxSize` dlqIds or `maxWait` after its first;
at most 50 go in one call. The batch is persisted (its dlqIds `batched`) when it is
formed, marked as sending right before its call goes out, and settled after it. What a
failed call becomes depends on what the service may have done:

* refused (429, 401/403, connection refused, circuit open): surely not carried out; the
  same batch's call is made again after a growing backoff (at most `retry_cap`), or
  once the circuit lets calls through again, and a refused call is not counted as a send;
* rejected (another 4xx but 404): not carried out, and maybe because it named dlqIds no
  longer in the DLQ (a stricter service refuses such a call whole). Each dlqId is
  looked up: one gone is `done` when an earlier call of ours may have recovered it
  (its answer lost), else `gone`, and the others go out again without it. Only when
  none is gone was the call itself at fault: the dlqIds are `failed` (a redrive can
  retry them);
* unknown (a 5xx, a 404, a lost or corrupt answer, any attempt or page of the call that
  may have acted, a crash after the mark): nothing is sent again blind (the client
  repeats a bulk call only when it surely never reached the service). Each dlqId is
  looked up with a GET, retried with backoff for as long as the service cannot answer:
  one that left the DLQ was recovered (`done`), one still there goes out again. A
  service that is down never makes a dlqId `failed`. The runs of any page answered
  before the failure are kept in the batch's record.

Every such backoff ends early when the service is back (`service_back`): the wait was
for the service, not for the batch.

A batch found unsettled at start whose call was never marked as sending goes straight
back to `decided`: its call surely never left.

On a shared store each attempt also asks the replica's lease fence (replicas.py): a
replica whose lease may have lapsed sends nothing more for its batches; a call it
could not finish is let go, unsettled, for whoever holds the batch now to check.
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

from daemon.metrics import FailedReason, Metrics
from daemon.pipeline.calls import recording
from daemon.pipeline.failures import backoff, is_final_for
from daemon.rules import BatchPolicy
from daemon.runtime.replicas import LeaseFence
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.store.records import BatchRecord, Pending
from daemon.upstream import (
    MAX_BULK,
    BulkAction,
    CircuitOpen,
    InvalidResponse,
    NotFound,
    Overrides,
    ServiceClient,
    ServiceError,
    refused,
    surely_not_carried_out,
)

log = structlog.get_logger(__name__)
# A batch's work runs in a task of its own, not supervised (housekeeping takes its
# dlqIds up again): a crash is counted under this task name.
BATCH_TASK = "batch"
Key = tuple[str, str]  # action, overrides (canonical JSON)


@dataclass
class _Answer:
    """What one bulk call (every page of it) came to."""

    runs: list[dict[str, Any]]
    error: ServiceError | None
    pages: int  # pages the service answered before the error, if any
    calls: list[dict[str, Any]]

    @property
    def may_have_acted(self) -> bool:
        """Failed, but the service may have acted on some of the dlqIds all the same."""
        error = self.error
        if error is None:
            return False
        return self.pages > 0 or isinstance(error, NotFound) or not surely_not_carried_out(error)


def _refused(call: dict[str, Any]) -> bool:
    """Whether the recorded attempt was surely refused, as `surely_not_carried_out` says
    of its error: an error status the service answers without acting. (A 2xx recorded
    with an error was a corrupt answer, which may have acted.)"""
    status = call.get("status")
    return isinstance(status, int) and status >= 400 and refused(status)


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
        replica: str | None = None,
        fence: LeaseFence | None = None,
        supervisor: Supervisor | None = None,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        check_tries: int = 5,
        senders: int = 4,
        housekeeping: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`policy_of(rule name)` is the batch policy of a rule in force. A batch whose
        call failed is looked at again after `retry_base` * 2**(sends-1) seconds, at most
        `retry_cap`, jittered; a refused call is made again the same way. The GETs that
        check a call's outcome are retried for as long as the service cannot answer, but
        after `check_tries` rounds of final answers (a 400) those dlqIds are `failed`.
        Every `housekeeping` seconds, batches and decided dlqIds this process does not
        hold (a store error came between two steps) are taken up: with `replica`, only
        those this replica holds or a replica gone left (daemon/runtime/replicas.py), and every
        attempt of a call waits for, and asks, `fence`."""
        self._store = store
        self._replica = replica
        self._fence = fence or LeaseFence(0.0, shared=False)
        self._client = client
        self._metrics = metrics
        self._policy_of = policy_of
        self._supervisor = supervisor or Supervisor(metrics)
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._check_tries = check_tries
        self._senders = asyncio.Semaphore(senders)
        self._housekeeping = housekeeping
        self._clock = clock
        self._wall_clock = wall_clock
        self._rand = rand
        self._groups: dict[Key, _Group] = {}
        self._held: set[str] = set()  # dlqIds in a group or in a batch of this process
        self._batches: set[int] = set()  # batches this process is sending or checking
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._back = asyncio.Event()  # set, and replaced, when the service is back
        self._take_up_soon = False
        self._stopping = False

    def add(self, pending: Sequence[Pending]) -> None:
        """Queue decided dlqIds for their batches."""
        now, wall = self._clock(), self._wall_clock()
        for item in pending:
            if item.dlq_id in self._held:
                continue
            policy = self._policy_of(item.rule)
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
        self._wakeup.set()

    def take_up_now(self) -> None:
        """Look for work nobody holds now, not at the next housekeeping: a replica is
        gone, and its batches and decided dlqIds are anyone's."""
        self._take_up_soon = True
        self._wakeup.set()

    def service_back(self) -> None:
        """The service answers again (a circuit closed): the batches waiting out a
        backoff for it go now."""
        self._back.set()
        self._back = asyncio.Event()

    async def _pause(self, seconds: float, *operations: str) -> None:
        """Sleep `seconds`, or less: until the service is back, or until the open circuit
        of one of `operations` (those the batch's next step calls, or failed on) lets a
        probe through, as this batch may be the only work that would make it: the
        service's return would go unseen until some backoff ran out."""
        until = self._clock() + seconds
        while (left := until - self._clock()) > 0:
            states = self._client.breaker_states()
            for operation in operations:
                if states.get(operation) == "open":
                    retry_at = self._client.retry_at(operation)
                    if retry_at is None:
                        return
                    left = min(left, retry_at - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._back.wait()
                    return

    @contextlib.asynccontextmanager
    async def running(self, drain_timeout: float = 10.0) -> AsyncIterator[None]:
        loop = self._supervisor.spawn("batcher", self._run)
        self._metrics.task_crashes.labels(BATCH_TASK)  # at 0 from now on, as the batcher's
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
            due = self._take_up_soon or self._clock() >= next_housekeeping
            if due and not self._stopping:
                self._take_up_soon = False
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
            self._metrics.task_crashes.labels(BATCH_TASK).inc()
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
            pending = await self._store.pending(self._replica)
            # Read last, and compared with `_batches` with no await in between: a batch
            # settled (and released) while an earlier read was out must not look orphaned.
            batches = await self._store.unsettled_batches(self._replica)
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
                work = self._again(record, record.dlq_ids, "its call never went out", (),
                                   sent=False)  # fmt: skip
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

    async def _flush(self, action: str, overrides: str, dlq_ids: list[str]) -> None:
        try:
            record = await self._store.open_batch(
                action, overrides, dlq_ids, self._wall_clock(), self._replica
            )
        except StoreUnavailable as exc:
            # Still decided in the store: housekeeping takes them up again.
            log.warning("batch not persisted; will try again", error=str(exc))
            self._held.difference_update(dlq_ids)
            return
        self._held.difference_update(set(dlq_ids) - set(record.dlq_ids if record else ()))
        if record is not None:
            self._batches.add(record.id)
            try:
                await self._send(record)
            except Exception:
                # Left unsettled in the store: housekeeping must see it as nobody's.
                self._batches.discard(record.id)
                raise

    async def _send(self, record: BatchRecord) -> None:
        overrides = Overrides.model_validate_json(record.overrides)
        calls: list[dict[str, Any]] = []
        refusals = 0
        while True:
            async with self._senders:
                if not await self._service_answers(record.action):
                    return  # stopping: the next start checks or re-queues the batch
                term = await self._lease_held()
                if term is None:
                    return
                # Marked before each attempt: a refused call made again later must still
                # be this replica's to make.
                if not await self._mark_sending(record):
                    return
                answer = await self._call(record, overrides, term)
            calls += answer.calls
            error = answer.error
            if error is not None and not self._fence.holds(term):
                self._let_go(record, error)
                return
            if error is None or answer.may_have_acted or is_final_for(error):
                break
            if isinstance(error, CircuitOpen):
                continue  # held back, not refused: _service_answers waits for the probe
            # Refused before the service acted: the same call again, later. Not a new
            # batch each time: a refusal that lasts must not grow the store.
            refusals += 1
            delay = backoff(refusals, self._retry_base, self._retry_cap, self._rand)
            log.warning("batch call refused; sending it again", batch=record.id,
                        error=str(error), in_seconds=round(delay, 3))  # fmt: skip
            await self._pause(delay, record.action)
        if error is None:
            await self._answered(record, answer.runs, calls)
        elif answer.may_have_acted:
            await self._check(record, f"the call failed: {error}", calls, answer.runs)
        else:
            await self._check(record, f"the service rejected the call: {error}", calls,
                              wait=False, rejected=True)  # fmt: skip

    async def _answered(
        self, record: BatchRecord, runs: list[dict[str, Any]], calls: list[dict[str, Any]]
    ) -> None:
        """Settle a batch the service answered. It recovers the named dlqIds still in the
        DLQ and passes over the others, and lists a new run for each it recovered, not
        which dlqId that run came from. So: a run for each, all `done`; no run, all
        `gone` (left the DLQ before the call, as a read would have found: with
        RECOVERYD_FETCH=needed none was made), but `done` for those an earlier batch's
        call may have carried (see below); some, all `done`, with the count in the
        batch's reason, as the answer cannot say which were passed over. No run after
        an earlier attempt that may have acted would say nothing (that attempt may have
        recovered them all, so they would be `done`); the client makes no such repeat
        of a bulk call, but the record keeps to what it can tell."""
        named = len(record.dlq_ids)
        if not runs and all(_refused(call) for call in calls[:-1]):
            # An earlier batch's call that may have acted on a dlqId (its answer lost) can
            # be carried out after its lookup found the dlqId still in the DLQ and sent it
            # again: that call recovered it, so it is `done`, as in `_check`.
            sends = await self._sends(record)
            if sends is None:
                return
            ours = [dlq_id for dlq_id in record.dlq_ids if sends.get(dlq_id, 0) > 0]
            others = [dlq_id for dlq_id in record.dlq_ids if dlq_id not in ours]
            reason = "not in the DLQ when the bulk call named it: the service recovered none"
            if ours:
                reason += f"; {len(ours)} of them an earlier call of ours may have recovered"
            await self._settle(record, sent=True, done=ours, gone=others, reason=reason,
                               calls=calls)  # fmt: skip
            log.info("batch found nothing to recover", batch=record.id, dlq_ids=named,
                     earlier_call=len(ours))  # fmt: skip
            return
        short = f"{len(runs)} of {named} recovered, the rest were not in the DLQ any more"
        await self._settle(record, sent=True, done=record.dlq_ids, runs=runs, calls=calls,
                           reason=short if 0 < len(runs) < named else None)  # fmt: skip
        self._metrics.batch_size.observe(named)
        self._metrics.recovered[cast(BulkAction, record.action)].inc(named)  # recoveries only
        log.info("batch sent", batch=record.id, action=record.action, dlq_ids=named,
                 runs=len(runs))  # fmt: skip

    async def _lease_held(self) -> int | None:
        """The fence's term once this replica's lease holds (at once, unless its
        heartbeat lapsed); None when the batcher stops meanwhile."""
        while (term := self._fence.term()) is None:
            if self._stopping:
                return None
            await self._fence.renewal(at_most=1.0)
        return term

    def _let_go(self, record: BatchRecord, error: ServiceError) -> None:
        """This replica's lease may have lapsed while the batch's call was under way:
        another replica may hold the batch now. It is neither sent again nor settled
        here; housekeeping takes it up again if the store says it is still this one's."""
        log.warning("lease lapsed during a batch's call; the batch is let go", batch=record.id,
                    error=str(error))  # fmt: skip
        self._release(record)
        self.take_up_now()

    async def _mark_sending(self, record: BatchRecord) -> bool:
        try:
            marked = await self._store.mark_sending(record.id, self._wall_clock(), self._replica)
        except StoreUnavailable as exc:
            log.warning("batch not marked as sending; will try again", batch=record.id,
                        error=str(exc))  # fmt: skip
            self._batches.discard(record.id)  # housekeeping puts it back in the queue
            return False
        if not marked:
            # Settled, or adopted by another replica while this one was thought gone.
            log.warning("batch no longer this replica's; its call is not made", batch=record.id)
            self._release(record)
        return marked

    async def _call(self, record: BatchRecord, overrides: Overrides, term: int) -> _Answer:
        """The batch's bulk call, every page of it, each attempt fenced in `term`."""
        runs: list[dict[str, Any]] = []
        pages = 0
        error: ServiceError | None = None
        with recording() as calls:
            try:
                action = cast(BulkAction, record.action)  # only recoveries are batched
                async for page in self._client.bulk_pages(
                    action,
                    dlq_ids=record.dlq_ids,
                    overrides=overrides,
                    fence=lambda: self._fence.holds(term),
                ):
                    pages += 1
                    runs += [run.model_dump(by_alias=True) for run in page.workflow_runs]
            except ServiceError as exc:
                error = exc
        return _Answer(runs, error, pages, list(calls))

    async def _service_answers(self, action: str) -> bool:
        """Wait while the client holds `action` back (its circuit is open): a call now
        would only be refused. False when the batcher stops meanwhile."""
        while (retry_at := self._client.retry_at(action)) is not None:
            if self._stopping:
                return False
            await self._pause(max(0.05, min(1.0, retry_at - self._clock())), action)
        return True

    async def _check(
        self,
        record: BatchRecord,
        reason: str,
        calls: Sequence[dict[str, Any]] = (),
        runs: Sequence[dict[str, Any]] = (),
        *,
        wait: bool = True,
        rejected: bool = False,
    ) -> None:
        """The call may or may not have been carried out: look each dlqId up (after the
        backoff, when `wait`), then settle the batch, keeping the `runs` answered. Lookups
        that fail are tried again, with a growing backoff, for as long as the service
        cannot answer them. `rejected`: the service refused the call without acting on it
        (see the module's docstring)."""
        sends = await self._sends(record)
        if sends is None:
            return
        looked_up = await self._look_up(record, max(sends.values(), default=0) + 1 if wait else 0)
        if looked_up is None:
            return
        lookups, error = looked_up
        gone = [dlq_id for dlq_id, found in lookups.items() if found is False]
        still = [dlq_id for dlq_id, found in lookups.items() if found is True]
        unknown = [dlq_id for dlq_id, found in lookups.items() if isinstance(found, ServiceError)]
        log.info("batch checked", batch=record.id, gone=len(gone), still_in_dlq=len(still),
                 unknown=len(unknown), reason=reason)  # fmt: skip
        if unknown:
            reason = f"{reason}; its outcome cannot be checked: {error}"
        if not rejected:
            await self._again(record, still, reason, calls, runs=runs, done=gone,
                              failed=unknown, sent=True)  # fmt: skip
        elif gone:
            # Refused for naming them: recovered by an earlier call whose answer was
            # lost, or taken out of the DLQ by someone else.
            ours = [dlq_id for dlq_id in gone if sends.get(dlq_id, 0) > 0]
            others = [dlq_id for dlq_id in gone if dlq_id not in ours]
            reason = f"{reason}; {len(gone)} of its dlqIds were no longer in the DLQ"
            await self._again(record, still, reason, calls, done=ours, gone=others,
                              failed=unknown, sent=False)  # fmt: skip
        else:
            log.error("batch rejected", batch=record.id, reason=reason)
            await self._settle(record, sent=True, failed=record.dlq_ids, reason=reason, calls=calls)

    async def _look_up(
        self, record: BatchRecord, attempt: int
    ) -> tuple[dict[str, bool | ServiceError], ServiceError | None] | None:
        """Whether each of the batch's dlqIds is in the DLQ (or the error that keeps the
        service from saying), and the first such error; looked up after the backoff of
        `attempt` (at once for 0) and again, each time after a longer one, while the
        service cannot answer. None when the batcher stops meanwhile."""
        final_rounds = 0
        # A batch makes one call, never repeated once it may have reached the service, so
        # a few failed calls open no circuit whose closing would end this wait: the first
        # round's reads are the probe, as soon as an open circuit would have made one.
        delay = 0.0
        if attempt:
            delay = backoff(attempt, self._retry_base, self._retry_cap, self._rand)
            delay = min(delay, self._client.breakers.probe_interval)
        while True:
            # Only the reads' circuit: the bulk call's is probed by the next send.
            await self._pause(delay, "get_dlq_message")
            attempt += 1
            delay = backoff(attempt, self._retry_base, self._retry_cap, self._rand)
            if not await self._service_answers("get_dlq_message"):
                self._batches.discard(record.id)
                return None
            lookups = dict(zip(record.dlq_ids, await asyncio.gather(
                *(self._in_dlq(dlq_id) for dlq_id in record.dlq_ids)), strict=True))  # fmt: skip
            errors = [found for found in lookups.values() if isinstance(found, ServiceError)]
            if not errors:
                return lookups, None
            if all(is_final_for(error) for error in errors):
                final_rounds += 1
                if final_rounds >= self._check_tries:
                    return lookups, errors[0]  # the service keeps saying no: with why
            if self._stopping:  # checked again at the next start
                self._batches.discard(record.id)
                return None
            log.warning("batch not checked; will try again", batch=record.id, error=str(errors[0]))

    async def _in_dlq(self, dlq_id: str) -> bool | ServiceError:
        """Whether `dlq_id` is still in the DLQ; the error when the service does not say."""
        try:
            await self._client.get_dlq_message(dlq_id)
        except NotFound:
            return False
        except InvalidResponse:
            return True  # answered 200 with a body not as the spec says: it is there
        except ServiceError as exc:
            return exc
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
        failed: Sequence[str] = (),
        gone: Sequence[str] = (),
        runs: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Settle the batch with `done` recovered (`runs` made), `failed` given up, `gone`
        and `dlq_ids` decided again, then queue those for a later batch under their
        rules' policies (read back from the store, so they hold across a restart)."""
        queued = await self._settle(
            record, sent=sent, done=done, again=dlq_ids, failed=failed, gone=gone,
            failed_as="check_refused", reason=reason, runs=runs, calls=calls,
        )  # fmt: skip
        self.add(queued)

    async def _sends(self, record: BatchRecord) -> dict[str, int] | None:
        """How many calls may have carried each of the batch's dlqIds; None when the store
        cannot say, and the batch is left for housekeeping."""
        try:
            return await self._store.sends(list(record.dlq_ids))
        except StoreUnavailable:
            self._batches.discard(record.id)
            return None

    async def _settle(
        self,
        record: BatchRecord,
        *,
        sent: bool,
        done: Sequence[str] = (),
        again: Sequence[str] = (),
        failed: Sequence[str] = (),
        failed_as: FailedReason = "call_rejected",
        gone: Sequence[str] = (),
        reason: str | None = None,
        runs: Sequence[dict[str, Any]] = (),
        calls: Sequence[dict[str, Any]] = (),
    ) -> list[Pending]:
        """Record the batch's outcome, counting the dlqIds it made `failed` as `failed_as`;
        the dlqIds decided again, to queue. Nothing when the store cannot take it: the
        batch stays unsettled, and housekeeping checks it with GETs, so nothing is lost."""
        try:
            settled = await self._store.settle_batch(
                record.id,
                done=done,
                again=again,
                failed=failed,
                gone=gone,
                reason=reason,
                runs=runs,
                calls=calls,
                sent=sent,
                now=self._wall_clock(),
            )
        except StoreUnavailable as exc:
            log.warning("batch outcome not recorded", batch=record.id, error=str(exc))
            self._batches.discard(record.id)
            return []
        finally:
            self._release(record)
        self._metrics.count_failed(failed_as, (rule for _, rule in settled.failed))
        return settled.decided
