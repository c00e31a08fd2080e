"""A batch's record in the store (opened, its sends, settled) and what this process holds.

Each step is committed before the side effect that follows it, and a step the store
cannot take leaves the batch unsettled for housekeeping to check: nothing is lost and
nothing is sent twice (ARCHITECTURE.md, exactly once). The dlqIds and batches held
here are those a task of this process works on, which housekeeping must not take up.
It uses the store and the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from daemon.metrics import FailedReason, Metrics
from daemon.store import Store, StoreUnavailable
from daemon.store.records import BatchRecord, Pending

log = structlog.get_logger(__name__)


class Ledger:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        replica: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._replica = replica
        self._wall_clock = wall_clock
        self.held: set[str] = set()  # dlqIds in a group or in a batch of this process
        self.batches: set[int] = set()  # batches this process is sending or checking

    def adopt(self, record: BatchRecord) -> None:
        self.batches.add(record.id)
        self.held.update(record.dlq_ids)

    def release(self, record: BatchRecord) -> None:
        self.batches.discard(record.id)
        self.held.difference_update(record.dlq_ids)

    async def open(self, action: str, overrides: str, dlq_ids: list[str]) -> BatchRecord | None:
        """Persist a batch formed of `dlq_ids` (those of them still decided and this
        replica's), held from now on; None when none is, or the store cannot take it (they
        stay decided in the store: housekeeping takes them up again)."""
        try:
            record = await self._store.open_batch(
                action, overrides, dlq_ids, self._wall_clock(), self._replica
            )
        except StoreUnavailable as exc:
            log.warning("batch not persisted; will try again", error=str(exc))
            self.held.difference_update(dlq_ids)
            return None
        self.held.difference_update(set(dlq_ids) - set(record.dlq_ids if record else ()))
        if record is not None:
            self.batches.add(record.id)
        return record

    async def sends(self, record: BatchRecord) -> dict[str, int] | None:
        """How many calls may have carried each of the batch's dlqIds; None when the store
        cannot say, and the batch is left for housekeeping."""
        try:
            return await self._store.sends(list(record.dlq_ids))
        except StoreUnavailable:
            self.batches.discard(record.id)
            return None

    async def again(
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
    ) -> list[Pending]:
        """Settle the batch with `done` recovered (`runs` made), `failed` given up, `gone`
        and `dlq_ids` decided again; those to queue for a later batch under their rules'
        policies (read back from the store, so they hold across a restart)."""
        return await self.settle(
            record, sent=sent, done=done, again=dlq_ids, failed=failed, gone=gone,
            failed_as="check_refused", reason=reason, runs=runs, calls=calls,
        )  # fmt: skip

    async def settle(
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
            self.batches.discard(record.id)
            return []
        finally:
            self.release(record)
        self._metrics.count_failed(failed_as, (rule for _, rule in settled.failed))
        return settled.decided
