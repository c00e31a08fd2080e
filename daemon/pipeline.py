"""Decide: each accepted callback's DLQ message, fetched and put to the rules in force.

The first stage of the recovery pipeline. Acting on a decision (batched resume and
restart, endpoint removal, notify) and the persisted per-dlqId states come with the
pipeline issue; until then a decision is recorded in the log and the metrics only,
and callbacks wait here in memory, not in the store's inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog

from daemon.metrics import Metrics
from daemon.rules import Decision, facts
from daemon.rules.live import LiveRules
from daemon.upstream import NotFound, ServiceClient, ServiceError

log = structlog.get_logger(__name__)


class Decider:
    def __init__(
        self,
        client: ServiceClient,
        rules: LiveRules,
        metrics: Metrics,
        *,
        workers: int = 4,
        capacity: int = 10_000,
    ) -> None:
        self._client = client
        self._rules = rules
        self._metrics = metrics
        self._workers = workers
        self._queue: asyncio.Queue[str] = asyncio.Queue(capacity)
        self._full = False

    def submit(self, dlq_id: str) -> None:
        """Queue a stored callback's dlqId for a decision."""
        try:
            self._queue.put_nowait(dlq_id)
        except asyncio.QueueFull:
            if not self._full:  # once per episode: a backlog must not flood the log too
                log.warning("decision queue full; new dlqIds stay in the store undecided")
            self._full = True
        else:
            self._full = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Decider]:
        tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]
        try:
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            dlq_id = await self._queue.get()
            await self.decide(dlq_id)

    async def decide(self, dlq_id: str) -> Decision | None:
        """The decision for `dlq_id`; None when its message cannot be read."""
        try:
            message = await self._client.get_dlq_message(dlq_id)
        except NotFound:
            log.info("dlq message already gone", dlq_id=dlq_id)
            return None
        except ServiceError as exc:
            log.warning("dlq message not fetched", dlq_id=dlq_id, reason=str(exc))
            return None
        ruleset = self._rules.current
        wire = message.model_dump(by_alias=True, exclude_none=True)
        decision = ruleset.decide(facts(wire, self._client.header_prefix))
        for rule in decision.matched:
            self._metrics.decisions.labels(rule.name, rule.action).inc()
        if not decision.matched:
            self._metrics.decisions.labels("", "none").inc()
        final = decision.rule
        log.info(
            "decided",
            dlq_id=dlq_id,
            rule=final.name if final else None,
            action=final.action if final else None,
            matched=[rule.name for rule in decision.matched],
            rules_sha256=ruleset.digest[:12],
        )
        return decision
