"""Checking a batch whose call may or may not have acted: each dlqId looked up, then settled.

Nothing is sent again blind (ARCHITECTURE.md, exactly once): each of the batch's
dlqIds is looked up with a GET, retried with backoff for as long as the service cannot
answer; one that left the DLQ was recovered (`done`), one still there goes out again.
A service that is down never makes a dlqId `failed`. A call the service rejected may
have named dlqIds no longer in the DLQ (docs/pipeline.md, Batches): one gone is `done`
when an earlier call of ours may have recovered it, else `gone`, and only when none is
gone are the dlqIds `failed`. It uses the service client's reads, the ledger and the
waits.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from daemon.pipeline.failures import backoff, is_final_for
from daemon.pipeline.ledger import Ledger
from daemon.pipeline.waits import ServiceWaits
from daemon.store.records import BatchRecord, Pending
from daemon.upstream import InvalidResponse, NotFound, ServiceClient, ServiceError

log = structlog.get_logger(__name__)


class Checker:
    def __init__(
        self,
        client: ServiceClient,
        ledger: Ledger,
        waits: ServiceWaits,
        *,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        check_tries: int = 5,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """The GETs that check a call's outcome are retried after `retry_base` *
        2**(tries-1) seconds, at most `retry_cap`, jittered, for as long as the service
        cannot answer, but after `check_tries` rounds of final answers (a 400) those
        dlqIds are `failed`."""
        self._client = client
        self._ledger = ledger
        self._waits = waits
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._check_tries = check_tries
        self._rand = rand

    async def check(
        self,
        record: BatchRecord,
        reason: str,
        calls: Sequence[dict[str, Any]] = (),
        runs: Sequence[dict[str, Any]] = (),
        *,
        wait: bool = True,
        rejected: bool = False,
    ) -> list[Pending]:
        """The call may or may not have been carried out: look each dlqId up (after the
        backoff, when `wait`), then settle the batch, keeping the `runs` answered; the
        dlqIds to queue again. Lookups that fail are tried again, with a growing backoff,
        for as long as the service cannot answer them. `rejected`: the service refused
        the call without acting on it (see the module's docstring)."""
        sends = await self._ledger.sends(record)
        if sends is None:
            return []
        looked_up = await self._look_up(record, max(sends.values(), default=0) + 1 if wait else 0)
        if looked_up is None:
            return []
        lookups, error = looked_up
        gone = [dlq_id for dlq_id, found in lookups.items() if found is False]
        still = [dlq_id for dlq_id, found in lookups.items() if found is True]
        unknown = [dlq_id for dlq_id, found in lookups.items() if isinstance(found, ServiceError)]
        log.info("batch checked", batch=record.id, gone=len(gone), still_in_dlq=len(still),
                 unknown=len(unknown), reason=reason)  # fmt: skip
        if unknown:
            reason = f"{reason}; its outcome cannot be checked: {error}"
        if not rejected:
            return await self._ledger.again(record, still, reason, calls, runs=runs, done=gone,
                                            failed=unknown, sent=True)  # fmt: skip
        if gone:
            # Refused for naming them: recovered by an earlier call whose answer was
            # lost, or taken out of the DLQ by someone else.
            ours = [dlq_id for dlq_id in gone if sends.get(dlq_id, 0) > 0]
            others = [dlq_id for dlq_id in gone if dlq_id not in ours]
            reason = f"{reason}; {len(gone)} of its dlqIds were no longer in the DLQ"
            return await self._ledger.again(record, still, reason, calls, done=ours,
                                            gone=others, failed=unknown, sent=False)  # fmt: skip
        log.error("batch rejected", batch=record.id, reason=reason)
        await self._ledger.settle(record, sent=True, failed=record.dlq_ids, reason=reason,
                                  calls=calls)  # fmt: skip
        return []

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
            await self._waits.pause(delay, "get_dlq_message")
            attempt += 1
            delay = backoff(attempt, self._retry_base, self._retry_cap, self._rand)
            if not await self._waits.answers("get_dlq_message"):
                self._ledger.batches.discard(record.id)
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
            if self._waits.stopping:  # checked again at the next start
                self._ledger.batches.discard(record.id)
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
