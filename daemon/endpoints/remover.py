"""The remover: each removal recorded by a threshold is carried out, exactly once.

For a `pending` removal: read the group (QStash's get URL Group), judge (verdict.py),
record the intent with the endpoint's name and url as read (`removing`, counted against
RECOVERYD_MAX_REMOVALS_PER_HOUR, or `capped`), then DELETE and record the outcome.
The intent is committed before the DELETE goes out, so whatever comes in between (a
crash, a lost answer, a refusal) leaves a `removing` record, and every later look at a
`removing` removal starts by reading the group again: an endpoint no longer there was
removed (and the record keeps what is needed to restore it); one still there is removed
now. A DELETE is never sent for an endpoint the last read did not find.

A group read that fails in a way a later try may not (the service down, 429, a refused
token) is tried again with a growing backoff, `read_tries` times for a `pending`
removal before it ends `read_failed` (nothing removed, and why), for as long as it
takes for a `removing` one, whose outcome must be known. A 404 says the group is gone.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import structlog

from daemon.endpoints.verdict import Verdict, find, judge
from daemon.metrics import Metrics
from daemon.pipeline.calls import recording
from daemon.pipeline.failures import backoff, is_final_for
from daemon.store import Store, StoreUnavailable
from daemon.store.backoff import StoreBackoff
from daemon.store.removals import Removal, RemovalResult
from daemon.upstream import (
    CircuitOpen,
    NotFound,
    ServiceClient,
    ServiceError,
    URLGroup,
    surely_not_carried_out,
)

log = structlog.get_logger(__name__)


class Remover:
    def __init__(
        self,
        store: Store,
        client: ServiceClient,
        metrics: Metrics,
        *,
        max_per_hour: int,
        read_tries: int = 5,
        retry_base: float = 5.0,
        retry_cap: float = 60.0,
        idle_poll: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`max_per_hour` is RECOVERYD_MAX_REMOVALS_PER_HOUR (0: none). A step that must
        wait is tried again after `retry_base` * 2**(tries-1) seconds, jittered, at most
        `retry_cap`. New removals are looked for every `idle_poll` seconds."""
        self._store = store
        self._client = client
        self._metrics = metrics
        self._max_per_hour = max_per_hour
        self._read_tries = read_tries
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._idle_poll = idle_poll
        self._wall_clock = wall_clock
        self._rand = rand

    async def run(self) -> None:
        """Carry out due removals for ever (the supervisor restarts it after a crash: its
        state is all in the store)."""
        backoff = StoreBackoff("endpoint removals")
        while True:
            try:
                for removal in await self._store.removals_due(self._wall_clock()):
                    await self.carry_out(removal)
            except StoreUnavailable as exc:
                await backoff.pause(exc)
                continue
            backoff.reset()
            await asyncio.sleep(self._idle_poll)

    async def carry_out(self, removal: Removal) -> None:
        """Take `removal` one step or more towards its end; StoreUnavailable leaves it as
        the store last recorded it, to be taken up again."""
        with recording() as calls:
            if removal.state == "pending":
                group = await self._read(removal, calls)
                if group is None:
                    return
                verdict = judge(group, removal)
                if verdict.result != "remove":
                    await self._finish(removal, verdict.result, verdict.reason, calls)
                    return
                intended = await self._store.intend_removal(
                    removal.id, name=verdict.name, url=verdict.url,
                    max_per_hour=self._max_per_hour, calls=list(calls), now=self._wall_clock(),
                )  # fmt: skip
                calls.clear()  # recorded with the intent
                if intended is None or intended.state != "removing":
                    if intended is not None and intended.state == "capped":
                        self._ended(intended, "capped", intended.reason or "")
                    return
                await self._delete(intended, verdict, calls)
            else:
                await self._resume(removal, calls)

    async def _resume(self, removal: Removal, calls: list[dict[str, Any]]) -> None:
        """A `removing` removal whose DELETE may or may not have been carried out: the
        group says which, and the DELETE goes out only if the endpoint is still there."""
        group = await self._read(removal, calls)
        if group is None:
            return
        if find(group.endpoints, removal) is None:
            reason = (
                f"removed endpoint {removal.shown} from URL Group {removal.url_group} (not in "
                "the group when read again after its DELETE was interrupted)"
            )
            await self._finish(removal, "removed", reason, calls)
            return
        verdict = judge(group, removal)
        if verdict.result != "remove":  # the group changed meanwhile
            await self._finish(removal, verdict.result, verdict.reason, calls)
            return
        await self._delete(removal, verdict, calls)

    async def _read(self, removal: Removal, calls: list[dict[str, Any]]) -> URLGroup | None:
        """The group, or None when the removal ended or must wait (recorded either way)."""
        try:
            return await self._client.get_url_group(removal.url_group)
        except NotFound:
            return URLGroup(name=removal.url_group)  # no group: no endpoint in it
        except CircuitOpen as exc:  # held back, not tried: wait for the probe
            problem = f"reading URL Group {removal.url_group} waits: {exc}"
            await self._defer(removal, problem, calls, tried=False)
            return None
        except ServiceError as exc:
            problem = f"reading URL Group {removal.url_group} failed: {exc}"
            retrying = not is_final_for(exc) and removal.tries + 1 < self._read_tries
            if removal.state == "removing" or retrying:
                await self._defer(removal, problem, calls)
            else:
                await self._finish(removal, "read_failed", f"{problem}; nothing removed", calls)
            return None

    async def _delete(
        self, removal: Removal, verdict: Verdict, calls: list[dict[str, Any]]
    ) -> None:
        assert verdict.ref is not None
        log.info("removing endpoint", removal=removal.id, url_group=removal.url_group,
                 endpoint=removal.shown, rule=removal.rule)  # fmt: skip
        try:
            await self._client.remove_endpoints(removal.url_group, [verdict.ref])
        except ServiceError as exc:
            if isinstance(exc, NotFound) or not surely_not_carried_out(exc):
                # It may have been carried out (a 5xx, a lost answer; a 404 after a retry
                # of one that was): the next look reads the group before anything else.
                problem = f"the DELETE's outcome is unknown ({exc}); the group is read again"
                await self._defer(removal, problem, calls)
            elif is_final_for(exc):
                reason = f"the service refused to remove endpoint {removal.shown}: {exc}"
                await self._finish(removal, "failed", reason, calls)
            else:  # refused before it acted, for now (429, an open circuit, a lockout)
                await self._defer(removal, f"the DELETE was refused for now: {exc}", calls)
            return
        await self._finish(removal, "removed", verdict.reason, calls)

    async def _defer(
        self, removal: Removal, problem: str, calls: list[dict[str, Any]], *, tried: bool = True
    ) -> None:
        delay = backoff(removal.tries + 1, self._retry_base, self._retry_cap, self._rand)
        now = self._wall_clock()
        log.warning("endpoint removal must wait", removal=removal.id, state=removal.state,
                    url_group=removal.url_group, problem=problem,
                    in_seconds=round(delay, 3))  # fmt: skip
        await self._store.defer_removal(
            removal.id, reason=f"{problem}; trying again", retry_at=now + delay, tried=tried,
            calls=list(calls), now=now,
        )  # fmt: skip

    async def _finish(
        self,
        removal: Removal,
        result: RemovalResult,
        reason: str,
        calls: list[dict[str, Any]],
    ) -> None:
        ended = await self._store.finish_removal(
            removal.id, result, reason, calls=list(calls), now=self._wall_clock()
        )
        if ended:
            self._ended(removal, result, reason)

    def _ended(self, removal: Removal, result: RemovalResult, reason: str) -> None:
        self._metrics.endpoint_removals[result].inc()
        event = "endpoint removed" if result == "removed" else "endpoint not removed"
        log.info(event, removal=removal.id, result=result, url_group=removal.url_group,
                 endpoint=removal.shown, rule=removal.rule, reason=reason)  # fmt: skip
