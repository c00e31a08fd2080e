"""Sending a batch: its bulk call, made again while refused, fenced, and what the answer means.

The batch is marked as sending right before each attempt and settled after it, each
step committed before the next (ARCHITECTURE.md, exactly once). What a failed call
becomes depends on what the service may have done (docs/pipeline.md, Batches):

* refused (429, 401/403, connection refused, circuit open): surely not carried out; the
  same batch's call is made again after a growing backoff (at most `retry_cap`), or
  once the circuit lets calls through again, and a refused call is not counted as a send;
* rejected (another 4xx but 404): not carried out, maybe because it named dlqIds no
  longer in the DLQ; the checker looks them up (checking.py);
* unknown (a 5xx, a 404, a lost or corrupt answer, any attempt or page of the call that
  may have acted): nothing is sent again blind (the client repeats a bulk call only when
  it surely never reached the service); the checker finds out. The runs of any page
  answered before the failure are kept in the batch's record.

On a shared store each attempt also asks the replica's lease fence
(daemon/runtime/replicas.py): a replica whose lease may have lapsed sends nothing more
for its batches; a call it could not finish is let go, unsettled, for whoever holds the
batch now to check. It uses the service client's bulk call, the fence, the ledger and
the waits.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

import structlog

from daemon.metrics import Metrics
from daemon.pipeline.calls import recording
from daemon.pipeline.failures import backoff, is_final_for
from daemon.pipeline.ledger import Ledger
from daemon.pipeline.waits import ServiceWaits
from daemon.runtime.replicas import LeaseFence
from daemon.store import Store, StoreUnavailable
from daemon.store.records import BatchRecord
from daemon.upstream import (
    BulkAction,
    CircuitOpen,
    NotFound,
    Overrides,
    ServiceClient,
    ServiceError,
    refused,
    surely_not_carried_out,
)

log = structlog.get_logger(__name__)


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


@dataclass(frozen=True)
class Unsure:
    """A call that failed, whose outcome the checker finds out (checking.py)."""

    reason: str
    calls: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    rejected: bool  # refused without acting, maybe for naming dlqIds gone from the DLQ


LET_GO: Literal["let go"] = "let go"  # the lease may have lapsed: the batch is not ours now


def _refused(call: dict[str, Any]) -> bool:
    """Whether the recorded attempt was surely refused, as `surely_not_carried_out` says
    of its error: an error status the service answers without acting. (A 2xx recorded
    with an error was a corrupt answer, which may have acted.)"""
    status = call.get("status")
    return isinstance(status, int) and status >= 400 and refused(status)


class Sender:
    def __init__(
        self,
        store: Store,
        client: ServiceClient,
        metrics: Metrics,
        ledger: Ledger,
        waits: ServiceWaits,
        *,
        replica: str | None = None,
        fence: LeaseFence | None = None,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        senders: int = 4,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """At most `senders` calls go out at a time. A refused call is made again after
        `retry_base` * 2**(refusals-1) seconds, at most `retry_cap`, jittered. With
        `replica`, every attempt of a call waits for, and asks, `fence`."""
        self._store = store
        self._client = client
        self._metrics = metrics
        self._ledger = ledger
        self._waits = waits
        self._replica = replica
        self._fence = fence or LeaseFence(0.0, shared=False)
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._senders = asyncio.Semaphore(senders)
        self._wall_clock = wall_clock
        self._rand = rand

    async def send(self, record: BatchRecord) -> Unsure | Literal["let go"] | None:
        """Make the batch's call and settle it when the answer says what happened; what
        the checker must find out when it does not, LET_GO when the lease may have lapsed
        meanwhile, None when settled or left for the next start or housekeeping."""
        overrides = Overrides.model_validate_json(record.overrides)
        calls: list[dict[str, Any]] = []
        refusals = 0
        while True:
            async with self._senders:
                if not await self._waits.answers(record.action):
                    return None  # stopping: the next start checks or re-queues the batch
                term = await self._lease_held()
                if term is None:
                    return None
                # Marked before each attempt: a refused call made again later must still
                # be this replica's to make.
                if not await self._mark_sending(record):
                    return None
                answer = await self._call(record, overrides, term)
            calls += answer.calls
            error = answer.error
            if error is not None and not self._fence.holds(term):
                self._let_go(record, error)
                return LET_GO
            if error is None or answer.may_have_acted or is_final_for(error):
                break
            if isinstance(error, CircuitOpen):
                continue  # held back, not refused: `answers` waits for the probe
            # Refused before the service acted: the same call again, later. Not a new
            # batch each time: a refusal that lasts must not grow the store.
            refusals += 1
            delay = backoff(refusals, self._retry_base, self._retry_cap, self._rand)
            log.warning("batch call refused; sending it again", batch=record.id,
                        error=str(error), in_seconds=round(delay, 3))  # fmt: skip
            await self._waits.pause(delay, record.action)
        if error is None:
            await self._answered(record, answer.runs, calls)
            return None
        if answer.may_have_acted:
            return Unsure(f"the call failed: {error}", calls, answer.runs, rejected=False)
        return Unsure(f"the service rejected the call: {error}", calls, [], rejected=True)

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
            # again: that call recovered it, so it is `done`, as the checker counts it.
            sends = await self._ledger.sends(record)
            if sends is None:
                return
            ours = [dlq_id for dlq_id in record.dlq_ids if sends.get(dlq_id, 0) > 0]
            others = [dlq_id for dlq_id in record.dlq_ids if dlq_id not in ours]
            reason = "not in the DLQ when the bulk call named it: the service recovered none"
            if ours:
                reason += f"; {len(ours)} of them an earlier call of ours may have recovered"
            await self._ledger.settle(record, sent=True, done=ours, gone=others, reason=reason,
                                      calls=calls)  # fmt: skip
            log.info("batch found nothing to recover", batch=record.id, dlq_ids=named,
                     earlier_call=len(ours))  # fmt: skip
            return
        short = f"{len(runs)} of {named} recovered, the rest were not in the DLQ any more"
        await self._ledger.settle(record, sent=True, done=record.dlq_ids, runs=runs, calls=calls,
                                  reason=short if 0 < len(runs) < named else None)  # fmt: skip
        self._metrics.batch_size.observe(named)
        self._metrics.recovered[cast(BulkAction, record.action)].inc(named)  # recoveries only
        log.info("batch sent", batch=record.id, action=record.action, dlq_ids=named,
                 runs=len(runs))  # fmt: skip

    async def _lease_held(self) -> int | None:
        """The fence's term once this replica's lease holds (at once, unless its
        heartbeat lapsed); None when the batcher stops meanwhile."""
        while (term := self._fence.term()) is None:
            if self._waits.stopping:
                return None
            await self._fence.renewal(at_most=1.0)
        return term

    def _let_go(self, record: BatchRecord, error: ServiceError) -> None:
        """This replica's lease may have lapsed while the batch's call was under way:
        another replica may hold the batch now. It is neither sent again nor settled
        here; housekeeping takes it up again if the store says it is still this one's."""
        log.warning("lease lapsed during a batch's call; the batch is let go", batch=record.id,
                    error=str(error))  # fmt: skip
        self._ledger.release(record)

    async def _mark_sending(self, record: BatchRecord) -> bool:
        try:
            marked = await self._store.mark_sending(record.id, self._wall_clock(), self._replica)
        except StoreUnavailable as exc:
            log.warning("batch not marked as sending; will try again", batch=record.id,
                        error=str(exc))  # fmt: skip
            self._ledger.batches.discard(record.id)  # housekeeping puts it back in the queue
            return False
        if not marked:
            # Settled, or adopted by another replica while this one was thought gone.
            log.warning("batch no longer this replica's; its call is not made", batch=record.id)
            self._ledger.release(record)
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
