"""Fetch and decide: workers lease received dlqIds, read each DLQ message and decide it.

A worker leases a chunk of received dlqIds from the store, fetches their messages
concurrently (the shared rate limiter paces them), decides each by the rules in force
and settles the whole chunk in one commit; the decided ones go to the batcher. A lease
expires, so a chunk held by a worker that died is taken again; settling checks the
lease is still held, so a slow worker cannot overwrite another's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Literal

import structlog

from daemon.foundation.words import counted
from daemon.metrics import DecisionSource, Metrics
from daemon.pipeline.calls import recording
from daemon.pipeline.decide import outcome_of, reads
from daemon.pipeline.failures import backoff, is_final_for
from daemon.rules import Decision, Ruleset, facts
from daemon.rules.callback import message_of, told
from daemon.rules.conditions import Facts
from daemon.rules.fields import kept
from daemon.rules.live import LiveRules
from daemon.rules.shadow import ShadowRules, shadow_text
from daemon.runtime.replicas import replica_id
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.store.backoff import StoreBackoff
from daemon.store.records import Claimed, Outcome, Pending
from daemon.upstream import NotFound, ServiceClient, ServiceError

log = structlog.get_logger(__name__)
_OPERATION = "get_dlq_message"


class Fetcher:
    def __init__(
        self,
        store: Store,
        client: ServiceClient,
        rules: LiveRules,
        metrics: Metrics,
        on_decided: Callable[[list[Pending]], None],
        *,
        replica: str | None = None,
        supervisor: Supervisor | None = None,
        dry_run: bool = False,
        fetch: Literal["always", "needed"] = "always",
        shadow: ShadowRules | None = None,
        workers: int = 4,
        chunk: int = 25,
        lease: float = 300.0,
        max_tries: int = 5,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        idle_poll: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`lease` outlasts the client's retries of one fetch. A failed fetch is tried
        again after `retry_base` * 2**(tries-1) seconds, jittered, at most `retry_cap`.
        Only answers that are final for the dlqId (a 4xx but 401/403/404/408/429) end it
        `failed`, at the `max_tries`'th of them; a service or network that is down never
        does, nor do the tries it failed count towards those, and its return
        (`service_back`) makes the dlqIds that wait for it due at once. Idle workers look
        again every `idle_poll` seconds (retries come due) or as soon as `wake` says a
        callback arrived. `fetch` is RECOVERYD_FETCH: with "needed", a signed callback that
        tells what the rules read is decided without a GET. `shadow` decides each dlqId
        too, its decision recorded and counted, never acted on. The leases are `replica`'s
        (daemon/runtime/replicas.py), and its decided dlqIds with them."""
        self._store = store
        self._client = client
        self._rules = rules
        self._metrics = metrics
        self._on_decided = on_decided
        self._supervisor = supervisor or Supervisor(metrics)
        self._dry_run = dry_run
        self._from_callbacks = fetch == "needed"
        self._shadow = shadow
        self._workers = workers
        self._chunk = chunk
        self._lease = lease
        self._max_tries = max_tries
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._idle_poll = idle_poll
        self._wall_clock = wall_clock
        self._clock = clock
        self._rand = rand
        self._owner = replica or replica_id()
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._backs = 0  # times the service came back
        # The dlqIds waiting for the service are to be made due: at start too, as it may
        # have come back while no daemon was running to see its breakers close.
        self._retry_now = True

    def wake(self) -> None:
        """A callback was stored: idle workers look now rather than at their next poll."""
        self._wakeup.set()

    def service_back(self) -> None:
        """The service answers again (a circuit closed): the dlqIds whose fetch waits for
        it are due now, not at the end of their backoffs."""
        self._backs += 1
        self._retry_now = True
        self._wakeup.set()

    @contextlib.asynccontextmanager
    async def running(self, drain_timeout: float = 10.0) -> AsyncIterator[None]:
        tasks = [
            self._supervisor.spawn(f"fetch-{number}", self._work)
            for number in range(1, self._workers + 1)
        ]
        try:
            yield
        finally:
            # Let the chunks under way settle; a lease left behind is released at start.
            self._stopping = True
            self._wakeup.set()
            _, late = await asyncio.wait(tasks, timeout=drain_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self) -> None:
        backoff = StoreBackoff("fetch stage")
        while not self._stopping:
            await self._wait_for_the_service()
            try:
                if self._retry_now:
                    await self._make_due()
                busy = await self._one_chunk()
            except StoreUnavailable as exc:
                await backoff.pause(exc)
                continue
            backoff.reset()
            if not busy and not await self._probe_with_a_waiting_one():
                await self._idle(self._idle_poll)

    async def _wait_for_the_service(self) -> None:
        """While the service keeps failing reads (the client's circuit is open), claim
        nothing: each claim would only move dlqIds into backoff. Wait for the probe."""
        while not self._stopping:
            retry_at = self._client.retry_at(_OPERATION)
            if retry_at is None:
                return
            await self._idle(max(0.05, retry_at - self._clock()))

    async def _probe_with_a_waiting_one(self) -> bool:
        """The circuit lets a probe through but nothing is due to make it with: make the
        dlqId that waits for the service and is due soonest due now, or the service's
        return would go unseen until some backoff ran out. Whether there was one."""
        probe_due = self._client.retry_at(_OPERATION) is None
        if not probe_due or self._client.breaker_states().get(_OPERATION) != "open":
            return False
        try:
            return await self._store.retry_now(self._wall_clock(), limit=1) > 0
        except StoreUnavailable:
            return False

    async def _idle(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wakeup.wait()
        self._wakeup.clear()

    async def _make_due(self) -> None:
        """Make the dlqIds waiting for the service due (one worker does, for all), then
        wake the others to claim them."""
        self._retry_now = False
        try:
            due = await self._store.retry_now(self._wall_clock())
        except StoreUnavailable:
            self._retry_now = True
            raise
        if due:
            log.info("the service is back: the dlqIds waiting for it are due now", dlq_ids=due)
        self._wakeup.set()

    async def _one_chunk(self) -> bool:
        """Lease, fetch, decide and settle one chunk; False when there was nothing to do."""
        backs = self._backs
        # The bodies only when they may be decided from: 25 of a kilobyte or so a claim.
        claimed = await self._store.claim(
            self._owner, self._chunk, self._lease, self._wall_clock(), bodies=self._from_callbacks
        )
        if not claimed:
            return False
        outcomes = await asyncio.gather(*(self._fetch(item) for item in claimed))
        settled = await self._store.settle(self._owner, list(outcomes), self._wall_clock())
        self._metrics.count_failed("fetch_refused", (rule for _, rule in settled.failed))
        if self._backs != backs:
            # The service came back while these were out (this chunk's first fetch may be
            # the probe that found it): those refused meanwhile wait for it no longer.
            self._retry_now = True
        for dlq_id, rule in settled.over_budget:
            self._metrics.budget_exhausted.labels(rule).inc()
            log.info("budget spent; not recovered", dlq_id=dlq_id, rule=rule)
        for outcome in outcomes:  # remove-endpoint: counted by the settle just committed
            if outcome.endpoint_failure is not None:
                self._metrics.endpoint_failures.labels(outcome.endpoint_failure.url_group).inc()
        if settled.decided:
            self._on_decided(settled.decided)
        return True

    async def _fetch(self, claimed: Claimed) -> Outcome:
        dlq_id = claimed.dlq_id
        if self._from_callbacks and claimed.signed_callback is not None:
            outcome = self._from_callback(dlq_id, claimed.signed_callback)
            if outcome is not None:
                return outcome
        with recording() as calls:
            try:
                message = await self._client.get_dlq_message(dlq_id)
            except NotFound:
                log.info("dlq message already gone", dlq_id=dlq_id)
                return Outcome(dlq_id, "gone", reason="not in the DLQ", calls=tuple(calls))
            except ServiceError as exc:
                return self._fetch_failed(claimed, exc, tuple(calls))
        ruleset = self._rules.current
        known = facts(
            message.model_dump(by_alias=True, exclude_none=True), self._client.header_prefix
        )
        return self._decided(dlq_id, ruleset, known, ruleset.decide(known), tuple(calls))

    def _from_callback(self, dlq_id: str, body: bytes) -> Outcome | None:
        """The outcome decided from the signed callback alone, or None when it does not
        tell every field the decision and its action read (rules/callback.py): then the
        DLQ message is read, as with RECOVERYD_FETCH=always."""
        try:
            callback = json.loads(body)
        except ValueError:  # checked when it came in: only a store's damage gets here
            return None
        if not isinstance(callback, dict):
            return None
        ruleset = self._rules.current
        known = facts(message_of(callback), self._client.header_prefix)
        decision = ruleset.decide(known)
        missing = reads(decision, ruleset) - told(callback)
        if missing:
            log.debug("the callback lacks fields the rules read; reading the DLQ message",
                      dlq_id=dlq_id, missing=sorted(missing))  # fmt: skip
            return None
        return self._decided(dlq_id, ruleset, known, decision, (), source="callback")

    def _decided(
        self,
        dlq_id: str,
        ruleset: Ruleset,
        known: Facts,
        decision: Decision,
        calls: tuple[dict[str, object], ...],
        source: DecisionSource = "message",
    ) -> Outcome:
        """Count and log `decision`, made from `source`; its outcome."""
        self._metrics.decided_from[source].inc()
        for rule in decision.matched:
            self._metrics.decisions.labels(rule.name, rule.action).inc()
        if not decision.matched:
            self._metrics.decisions.labels("", "none").inc()
        outcome = outcome_of(
            dlq_id,
            decision,
            ruleset,
            known,
            dry_run=self._dry_run,
            header_prefix=self._client.header_prefix,
            now=self._wall_clock(),
            calls=calls,
        )
        # Kept with the decision, so that a candidate can be replayed on it (rules/replay).
        kept_facts = kept(known, ruleset.reads_all)
        shadow = self._shadow_decision(decision, known)
        outcome = dataclasses.replace(outcome, facts=kept_facts, shadow=shadow)
        log.info(
            "decided",
            dlq_id=dlq_id,
            source=source,
            rule=outcome.rule,
            action=outcome.action,
            state=outcome.state,
            matched=list(outcome.matched),
            rules_sha256=ruleset.digest[:12],
        )
        return outcome

    def _shadow_decision(self, live: Decision, known: Facts) -> str | None:
        """The shadow's decision as shadow_text (None with no shadow loaded), counted when
        it differs from the live one. Only recorded: nothing here acts on it."""
        if self._shadow is None or (shadow := self._shadow.current) is None:
            return None
        decision = shadow.decide(known)
        text = shadow_text(decision)
        if text != shadow_text(live):
            live_rule, shadow_rule = live.rule, decision.rule
            self._metrics.shadow_disagreements.labels(
                live_rule.name if live_rule else "", shadow_rule.name if shadow_rule else ""
            ).inc()
        return text

    def _fetch_failed(
        self, claimed: Claimed, error: ServiceError, calls: tuple[dict[str, object], ...]
    ) -> Outcome:
        reason = f"fetching the DLQ message failed: {error}"
        # Only final answers count towards `failed`: the tries an outage spent do not.
        refused = is_final_for(error)
        refusals = claimed.refusals + refused
        if refused and refusals >= self._max_tries:
            log.error("dlq message not fetched; giving up", dlq_id=claimed.dlq_id, reason=reason)
            answers = counted(refusals, "final answer")
            why = f"{reason} ({answers} in {counted(claimed.tries, 'try', 'tries')})"
            return Outcome(claimed.dlq_id, "failed", reason=why, refused=True, calls=calls)
        delay = backoff(claimed.tries, self._retry_base, self._retry_cap, self._rand)
        # An outage fails thousands at once: the log's repeat filter folds these lines
        # into one a minute with a count (daemon/foundation/logs.py).
        log.warning("dlq message not fetched; will try again", dlq_id=claimed.dlq_id,
                    reason=reason, in_seconds=round(delay, 3))  # fmt: skip
        return Outcome(
            claimed.dlq_id,
            "received",
            reason=reason,
            retry_at=self._wall_clock() + delay,
            refused=refused,
            waits_for_service=not refused,
            calls=calls,
        )
