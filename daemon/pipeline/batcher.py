"""Batch and send: decided dlqIds go out in bulk resume/restart calls, each exactly once.

dlqIds decided for the same action and the same overrides share a batch (PRODUCT.md
4.4). A batch is flushed when it holds `maxSize` dlqIds or `maxWait` after its first;
at most 50 go in one call. The batch is persisted (its dlqIds `batched`) before the
call goes out, and settled after it. When a call's outcome is unknown (a 5xx, a lost
answer, a crash), nothing is sent again blind: each dlqId is looked up with a GET
first. One that left the DLQ was recovered (`done`); one still there goes out again,
up to `max_sends` times in all, then it is `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, cast

import structlog

from daemon.metrics import Metrics
from daemon.pipeline.calls import recording
from daemon.rules import BatchPolicy
from daemon.store import Store, StoreUnavailable
from daemon.store.records import BatchRecord, Pending
from daemon.upstream import (
    MAX_BULK,
    BulkAction,
    NotFound,
    Overrides,
    RateLimited,
    ResponseError,
    ServerError,
    ServiceClient,
    ServiceError,
    TransportError,
    Unauthorized,
)

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
        max_sends: int = 3,
        retry_base: float = 5.0,
        senders: int = 4,
        housekeeping: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`policy_of(rule name)` is the batch policy of a rule in force. A batch whose
        call failed is looked at again after `retry_base` * 2**(sends-1) seconds. Every
        `housekeeping` seconds, batches and decided dlqIds this process does not hold
        (a store error came between two steps) are taken up again."""
        self._store = store
        self._client = client
        self._metrics = metrics
        self._policy_of = policy_of
        self._max_sends = max_sends
        self._retry_base = retry_base
        self._senders = asyncio.Semaphore(senders)
        self._housekeeping = housekeeping
        self._clock = clock
        self._wall_clock = wall_clock
        self._groups: dict[Key, _Group] = {}
        self._held: set[str] = set()  # dlqIds in a group or in a batch of this process
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

    @contextlib.asynccontextmanager
    async def running(self, drain_timeout: float = 10.0) -> AsyncIterator[None]:
        loop = asyncio.create_task(self._run(), name="recoveryd-batcher")
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
                    self._spawn(self._flush(group.action, group.overrides, dlq_ids))
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

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
            if record.id not in self._batches:
                log.info("checking a batch whose call was not settled", batch=record.id,
                         dlq_ids=len(record.dlq_ids))  # fmt: skip
                self._adopt(record)
                self._spawn(self._check(record, "the call's outcome was not recorded", wait=False))
        self.add(pending)

    def _adopt(self, record: BatchRecord) -> None:
        self._batches.add(record.id)
        self._held.update(record.dlq_ids)

    def _release(self, record: BatchRecord) -> None:
        self._batches.discard(record.id)
        self._held.difference_update(record.dlq_ids)

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
            await self._settle(record, done=record.dlq_ids, runs=runs, calls=calls)
            self._metrics.batch_size.observe(len(record.dlq_ids))
            self._metrics.recovered.labels(record.action).inc(len(record.dlq_ids))
            log.info(
                "batch sent",
                batch=record.id,
                action=record.action,
                dlq_ids=len(record.dlq_ids),
                runs=len(runs),
            )
        elif _refused(error):
            await self._again(
                record, record.dlq_ids, f"the service refused the call: {error}", calls
            )
        elif isinstance(error, ResponseError) and not isinstance(error, ServerError):
            reason = f"the service rejected the call: {error}"
            log.error("batch rejected", batch=record.id, reason=reason)
            await self._settle(record, failed=record.dlq_ids, reason=reason, calls=calls)
        else:
            await self._check(record, f"the call failed: {error}", calls)

    async def _check(
        self,
        record: BatchRecord,
        reason: str,
        calls: Sequence[dict[str, Any]] = (),
        *,
        wait: bool = True,
    ) -> None:
        """The call may or may not have been carried out: look each dlqId up (after the
        backoff, when `wait`), then settle the batch. If the lookups fail too, the batch
        stays for the next housekeeping."""
        sends = await self._sends(record)
        if sends is None:
            return
        if wait:
            await asyncio.sleep(self._delay(sends))
        lookups = await asyncio.gather(*(self._in_dlq(dlq_id) for dlq_id in record.dlq_ids))
        if None in lookups:
            log.warning("batch not checked; will try again", batch=record.id)
            self._batches.discard(record.id)  # housekeeping adopts it again
            return
        gone = [dlq_id for dlq_id, there in zip(record.dlq_ids, lookups, strict=True) if not there]
        still = [dlq_id for dlq_id, there in zip(record.dlq_ids, lookups, strict=True) if there]
        log.info("batch checked", batch=record.id, gone=len(gone), still_in_dlq=len(still),
                 reason=reason)  # fmt: skip
        await self._again(record, still, reason, calls, done=gone, sends=sends, wait=False)

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
        done: Sequence[str] = (),
        sends: dict[str, int] | None = None,
        wait: bool = True,
    ) -> None:
        """Send `dlq_ids` again in a later batch, those not sent `max_sends` times yet.
        `sends` is the batch's count of sends per dlqId, when the caller has read it."""
        sends = sends if sends is not None else await self._sends(record)
        if sends is None:
            return
        if wait:
            await asyncio.sleep(self._delay(sends))
        again = [dlq_id for dlq_id in dlq_ids if sends.get(dlq_id, 0) < self._max_sends]
        failed = [dlq_id for dlq_id in dlq_ids if sends.get(dlq_id, 0) >= self._max_sends]
        if failed:
            reason = f"{reason}; sent {self._max_sends} times and still in the DLQ"
        settled = await self._settle(
            record, done=done, again=again, failed=failed, reason=reason, calls=calls
        )
        if settled and again:
            now = self._wall_clock()
            self.add(
                [Pending(dlq_id, record.action, record.overrides, "", now) for dlq_id in again]
            )

    async def _sends(self, record: BatchRecord) -> dict[str, int] | None:
        """How many times each of the batch's dlqIds was sent; None when the store cannot
        say, and the batch is left for housekeeping."""
        try:
            return await self._store.sends(list(record.dlq_ids))
        except StoreUnavailable:
            self._batches.discard(record.id)
            return None

    def _delay(self, sends: dict[str, int]) -> float:
        """Backoff before a batch is looked at again: longer each time it was sent."""
        return float(self._retry_base * 2 ** max(0, max(sends.values(), default=1) - 1))

    async def _settle(
        self,
        record: BatchRecord,
        *,
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


def _refused(error: ServiceError) -> bool:
    """The service surely did nothing: it refused the call, or never received it."""
    if isinstance(error, TransportError):
        return not error.request_sent
    return isinstance(error, RateLimited | Unauthorized)
