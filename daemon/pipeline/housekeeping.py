"""Housekeeping: the batches and decided dlqIds that no task of this process holds, taken up.

At start that is everything a previous run left; later, what a store error stranded
or a replica gone left (daemon/runtime/replicas.py). A batch found unsettled whose
call was never marked as sending goes straight back to its queue: its call surely
never left; one that was marked is checked (ARCHITECTURE.md, exactly once). It uses
the store, the ledger and the checker.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from daemon.pipeline.checking import Checker
from daemon.pipeline.ledger import Ledger
from daemon.store import Store, StoreUnavailable
from daemon.store.records import BatchRecord, Pending

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Orphans:
    """What nobody held: batches to resume (adopted now) and decided dlqIds to queue."""

    batches: list[BatchRecord]
    pending: list[Pending]


class Housekeeping:
    def __init__(
        self, store: Store, ledger: Ledger, checker: Checker, *, replica: str | None = None
    ) -> None:
        """With `replica`, only what this replica holds or a replica gone left."""
        self._store = store
        self._ledger = ledger
        self._checker = checker
        self._replica = replica

    async def orphans(self) -> Orphans | None:
        """Unsettled batches and decided dlqIds that no task of this process holds, the
        batches adopted; None when the store cannot say."""
        try:
            pending = await self._store.pending(self._replica)
            # Read last, and compared with the ledger's batches with no await in between:
            # a batch settled (and released) while an earlier read was out must not look
            # orphaned.
            batches = await self._store.unsettled_batches(self._replica)
        except StoreUnavailable as exc:
            log.warning("batcher: store unavailable", error=str(exc))
            return None
        orphans = [record for record in batches if record.id not in self._ledger.batches]
        for record in orphans:
            self._ledger.adopt(record)
        return Orphans(orphans, pending)

    def resume(self, record: BatchRecord) -> Coroutine[Any, Any, list[Pending]]:
        """The work that carries an orphaned batch on from where it was left, to run in a
        task of its own; it comes to the dlqIds to queue again."""
        if record.sent_at is None:
            log.info("a batch whose call never went out goes back to its queue",
                     batch=record.id, dlq_ids=len(record.dlq_ids))  # fmt: skip
            return self._ledger.again(record, record.dlq_ids, "its call never went out", (),
                                      sent=False)  # fmt: skip
        log.info("checking a batch whose call was not settled", batch=record.id,
                 dlq_ids=len(record.dlq_ids))  # fmt: skip
        return self._checker.check(record, "the call's outcome was not recorded", wait=False)
