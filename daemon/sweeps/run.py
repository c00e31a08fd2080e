"""One run of a sweep: bulk resume or restart by filter, page by page, each page recorded.

The run is recorded before its first call. Each page is marked as being sent before its
call goes out and settled with the runs the service made right after, so the store
always says how far a run got. A page goes out with `count` (at most 50, and never
more than `maxPerRun` leaves) and the cursor of the page before; the run ends when the
service says nothing is left, at `maxPerRun`, or at the first page that fails:

* refused (surely not carried out: a 4xx but 408, a refused connection, an open
  circuit): the run ends `failure`; the next scheduled run tries again;
* answer lost (a 5xx, a timeout, a dropped or unreadable answer): the run ends
  `unknown` and the page is NOT sent again. A bulk call by filter is not idempotent: a
  repeat would act on the next matching runs while the first call's runs went
  unreported. Nothing is lost either: the entries the service did process have left
  the DLQ, and the ones it did not are still there for the next run.

A dry run lists what the filter selects (QStash's listing of failed workflow runs, the
same filters) and records it, calling nothing that changes state.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from daemon.metrics import Metrics
from daemon.store import Store
from daemon.store.sweep_records import SweepResult, SweepRun
from daemon.sweeps.plan import Plan
from daemon.upstream import (
    MAX_BULK,
    FailedWorkflowRun,
    ServiceClient,
    ServiceError,
    surely_not_carried_out,
)
from daemon.upstream.client import MAX_LISTED

log = structlog.get_logger(__name__)

Stopping = Callable[[], bool]


@dataclass(frozen=True)
class ListedPage:
    """One page of a listing: what was asked for and what came back."""

    number: int
    cursor: str | None
    count: int
    messages: tuple[FailedWorkflowRun, ...]
    next_cursor: str


async def listed_pages(client: ServiceClient, plan: Plan) -> AsyncGenerator[ListedPage, None]:
    """The failed workflow runs `plan`'s filter selects now, page by page, at most
    `maxPerRun` in all: what the run would recover. Changes nothing."""
    cursor: str | None = None
    selected = 0
    number = 0
    while selected < plan.max_per_run:
        number += 1
        count = min(MAX_LISTED, plan.max_per_run - selected)
        answer = await client.list_workflow_dlq(plan.filter, cursor=cursor, count=count)
        messages = answer.messages[:count]
        selected += len(messages)
        yield ListedPage(number, cursor, count, messages, answer.cursor)
        if answer.done:
            return
        if answer.cursor == cursor:  # a service bug would otherwise loop forever
            raise ServiceError("list_workflow_dlq: the service returned the same cursor twice")
        cursor = answer.cursor


def selected_entry(message: FailedWorkflowRun) -> dict[str, Any]:
    """What a dry run records of an entry it would recover."""
    return {
        "dlqId": message.dlq_id,
        "workflowRunId": message.workflow_run_id,
        "url": message.url,
        "createdAt": message.created_at,
    }


class SweepRunner:
    """Carries out runs of sweeps through the service client (so the rate limiter shared
    with the pipeline and the circuit breakers apply) and records them in the store."""

    def __init__(
        self,
        client: ServiceClient,
        store: Store,
        metrics: Metrics,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._store = store
        self._metrics = metrics
        self._wall_clock = wall_clock

    async def run(self, plan: Plan, stopping: Stopping = lambda: False) -> SweepRun | None:
        """Carry out `plan`, recorded; its record once it has ended, None when another
        run of the sweep is recorded as under way. `stopping()` is asked between pages: a
        true answer ends the run `interrupted` there. StoreUnavailable when the store
        cannot record it (the run stays under way there until closed as interrupted)."""
        run_id = await self._store.begin_sweep_run(
            plan.sweep,
            action=plan.action,
            dry_run=plan.dry_run,
            filter=plan.filter_json(),
            overrides=plan.overrides_json(),
            max_per_run=plan.max_per_run,
            now=self._wall_clock(),
        )
        if run_id is None:
            return None
        log.info("sweep run started", sweep=plan.sweep, run=run_id, action=plan.action,
                 dry_run=plan.dry_run, filter=plan.filter_json())  # fmt: skip
        if plan.dry_run:
            result, error = await self._select(run_id, plan, stopping)
        else:
            result, error = await self._recover(run_id, plan, stopping)
        finished = self._wall_clock()
        await self._store.finish_sweep_run(run_id, result, error, finished)
        self._metrics.sweep_runs.labels(plan.sweep, result).inc()
        if result == "success":
            self._metrics.sweep_last_success.labels(plan.sweep).set(finished)
        [record] = [run for run in await self._store.sweep_runs(plan.sweep, 1) if run.id == run_id]
        event = log.info if result in ("success", "dry-run") else log.warning
        event("sweep run ended", sweep=plan.sweep, run=run_id, result=result, error=error,
              pages=record.pages, workflows=record.workflows)  # fmt: skip
        return record

    async def _recover(self, run_id: int, plan: Plan, stopping: Stopping) -> _Ending:
        cursor: str | None = None
        recovered = 0
        page = 0
        while recovered < plan.max_per_run:
            if stopping():
                return "interrupted", _stopped(page)
            page += 1
            count = min(MAX_BULK, plan.max_per_run - recovered)
            await self._store.begin_sweep_page(
                run_id, page, count=count, cursor=cursor, now=self._wall_clock()
            )
            try:
                answer = await self._client.bulk(
                    plan.action, filter=plan.filter, overrides=plan.overrides, cursor=cursor,
                    count=count,
                )  # fmt: skip
            except ServiceError as exc:
                return await self._failed(run_id, page, count, exc)
            runs = [
                {"workflowRunId": run.workflow_run_id, "workflowCreatedAt": run.workflow_created_at}
                for run in answer.workflow_runs
            ]
            await self._store.settle_sweep_page(
                run_id, page, outcome="done", items=runs, next_cursor=answer.cursor,
                now=self._wall_clock(),
            )  # fmt: skip
            self._metrics.sweep_recovered.labels(plan.sweep, plan.action).inc(len(runs))
            recovered += len(runs)
            if answer.done:
                break
            if answer.cursor == cursor:  # a service bug would otherwise loop forever
                return "failure", f"page {page}: the service returned the same cursor twice"
            cursor = answer.cursor
        return "success", None

    async def _failed(self, run_id: int, page: int, count: int, exc: ServiceError) -> _Ending:
        if surely_not_carried_out(exc):
            await self._store.settle_sweep_page(
                run_id, page, outcome="refused", error=str(exc), now=self._wall_clock()
            )
            return "failure", f"page {page} was refused, nothing done: {exc}"
        await self._store.settle_sweep_page(
            run_id, page, outcome="unknown", error=str(exc), now=self._wall_clock()
        )
        return "unknown", (
            f"page {page}'s answer was lost ({exc}): the service may have recovered up to "
            f"{count} runs that are not recorded here. The call is not repeated blind; those "
            "runs left the DLQ, so no run recovers them twice"
        )

    async def _select(self, run_id: int, plan: Plan, stopping: Stopping) -> _Ending:
        pages = listed_pages(self._client, plan)
        number = 0
        try:
            while not stopping():
                try:
                    page = await anext(pages)
                except StopAsyncIteration:
                    return "dry-run", None
                number = page.number
                # A read acts on nothing: recorded once answered, not marked before.
                now = self._wall_clock()
                await self._store.begin_sweep_page(
                    run_id, page.number, count=page.count, cursor=page.cursor, now=now
                )
                await self._store.settle_sweep_page(
                    run_id, page.number, outcome="listed", now=now, next_cursor=page.next_cursor,
                    items=[selected_entry(message) for message in page.messages],
                )  # fmt: skip
        except ServiceError as exc:
            return "failure", f"page {number + 1} of the listing failed: {exc}"
        finally:
            await pages.aclose()
        return "interrupted", _stopped(number)


_Ending = tuple[SweepResult, str | None]


def _stopped(page: int) -> str:
    where = f"after page {page}" if page else "before its first page"
    return f"stopped {where}: recoveryd is stopping or the sweep left the rules"
