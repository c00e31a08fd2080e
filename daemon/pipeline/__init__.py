"""The recovery pipeline: callbacks in the store's inbox become recovered workflow runs.

    inbox (received) -> fetch.Fetcher: lease, GET the DLQ message, decide (decide.py)
                     -> batcher.Batcher: form (forming.py), persist and settle
                        (ledger.py), bulk resume/restart (sending.py), check an
                        unknown outcome (checking.py), take up what nobody holds
                        (housekeeping.py)

Every step is a state of the dlqId in the store (`daemon.store.records`), committed
before the side effect that follows it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from daemon.metrics import Metrics
from daemon.notify.delivery import NotifyTiming
from daemon.pipeline.batcher import Batcher
from daemon.pipeline.checking import Checker
from daemon.pipeline.fetch import Fetcher
from daemon.pipeline.forming import Forming
from daemon.pipeline.housekeeping import Housekeeping
from daemon.pipeline.ledger import Ledger
from daemon.pipeline.sending import Sender
from daemon.pipeline.waits import ServiceWaits
from daemon.rules import BatchPolicy
from daemon.rules.live import LiveRules
from daemon.rules.shadow import ShadowRules
from daemon.runtime.replicas import LeaseFence
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store
from daemon.upstream import ServiceClient


@dataclass(frozen=True)
class Tuning:
    """The pipeline's knobs; the defaults suit production, tests make them short."""

    workers: int = 4
    chunk: int = 25
    lease: float = 300.0
    fetch_tries: int = 5  # answers final for a dlqId (a 400...) before it is `failed`
    retry_base: float = 5.0  # seconds before a failed fetch or batch is looked at again
    # The longest backoff. One that waits for the service ends when it is back (a circuit
    # closes): only a dlqId's own trouble (a 400) waits it out.
    retry_cap: float = 60.0
    idle_poll: float = 1.0
    housekeeping: float = 60.0
    drain_timeout: float = 10.0
    notify: NotifyTiming = field(default_factory=NotifyTiming)  # the notifier's (app.py)


class Pipeline:
    def __init__(
        self,
        store: Store,
        client: ServiceClient,
        rules: LiveRules,
        metrics: Metrics,
        *,
        dry_run: bool = False,
        fetch: Literal["always", "needed"] = "always",
        replica: str | None = None,
        fence: LeaseFence | None = None,
        tuning: Tuning | None = None,
        supervisor: Supervisor | None = None,
        shadow: ShadowRules | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        tuning = tuning or Tuning()
        self._tuning = tuning
        supervisor = supervisor or Supervisor(metrics)
        self.batcher = _batcher(
            store,
            client,
            metrics,
            lambda name: _policy(rules, name),
            replica=replica,
            fence=fence,
            supervisor=supervisor,
            tuning=tuning,
            wall_clock=wall_clock,
        )
        self.fetcher = Fetcher(
            store,
            client,
            rules,
            metrics,
            self.batcher.add,
            replica=replica,
            supervisor=supervisor,
            dry_run=dry_run,
            fetch=fetch,
            shadow=shadow,
            workers=tuning.workers,
            chunk=tuning.chunk,
            lease=tuning.lease,
            max_tries=tuning.fetch_tries,
            retry_base=tuning.retry_base,
            retry_cap=tuning.retry_cap,
            idle_poll=tuning.idle_poll,
            wall_clock=wall_clock,
        )

    def wake(self, dlq_id: str | None = None) -> None:
        """A callback was stored (the receiver's `on_accepted`)."""
        self.fetcher.wake()

    def breaker_changed(self, operation: str, state: str) -> None:
        """A circuit of the service client changed (its `on_breaker_change`). Closed: a
        probe found the service back, and the work that waited for it is due now, in
        order of arrival, paced by the rate limiter. The backoff was the service's, not
        each dlqId's."""
        if state == "closed":
            self.service_back()

    def service_back(self) -> None:
        """The service takes calls again (a circuit closed, a token lockout ended): the
        work that waited for it is due now, not at the end of its backoffs."""
        self.fetcher.service_back()
        self.batcher.service_back()

    def replicas_gone(self, gone: list[str]) -> None:
        """Replicas were found gone: their leases and batches are anyone's now."""
        self.fetcher.wake()
        self.batcher.take_up_now()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Pipeline]:
        """Both stages at work for the block; on exit, work under way is drained."""
        drain = self._tuning.drain_timeout
        async with self.batcher.running(drain), self.fetcher.running(drain):
            yield self


def _batcher(
    store: Store,
    client: ServiceClient,
    metrics: Metrics,
    policy_of: Callable[[str], BatchPolicy],
    *,
    replica: str | None,
    fence: LeaseFence | None,
    supervisor: Supervisor,
    tuning: Tuning,
    wall_clock: Callable[[], float],
) -> Batcher:
    """The batcher and its collaborators, one job each (batcher.py says which)."""
    base, cap = tuning.retry_base, tuning.retry_cap
    waits = ServiceWaits(client)
    ledger = Ledger(store, metrics, replica=replica, wall_clock=wall_clock)
    checker = Checker(client, ledger, waits, retry_base=base, retry_cap=cap)
    sender = Sender(store, client, metrics, ledger, waits, replica=replica, fence=fence,
                    retry_base=base, retry_cap=cap, wall_clock=wall_clock)  # fmt: skip
    return Batcher(
        Forming(policy_of),
        ledger,
        sender,
        checker,
        Housekeeping(store, ledger, checker, replica=replica),
        waits,
        metrics,
        supervisor=supervisor,
        housekeeping_every=tuning.housekeeping,
        wall_clock=wall_clock,
    )


def _policy(rules: LiveRules, name: str) -> BatchPolicy:
    rule = rules.current.rule(name)
    if rule is not None and rule.batch is not None:
        return rule.batch
    return rules.current.default_batch


__all__ = ["Pipeline", "Tuning"]
