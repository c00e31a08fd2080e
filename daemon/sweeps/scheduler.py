"""The sweeps of the rules in force, each run on its schedule, one run at a time.

APScheduler keeps the time (cron in UTC, or an interval, `daemon/foundation/schedule.py`); its job
only wakes the sweep's own task, which runs under the supervisor and carries out one
run at a time. A schedule that fires while a run is under way is skipped, never queued
behind it. A rules reload reschedules: a new sweep is scheduled, a removed one stops
(a run under way ends at the end of its page), a changed schedule takes effect; the
rest of a sweep (filter, action, overrides, maxPerRun) is read when each run starts.

At start, a run recorded as under way is closed as `interrupted`: its process is gone
(one daemon to a store). A sweep whose last run was interrupted, or whose schedule
fired while recoveryd was not running, runs once at start; the entries an interrupted
run did recover have left the DLQ, so the new run picks up where it stopped without
recovering any of them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from daemon.foundation.schedule import parse_schedule
from daemon.metrics import Metrics
from daemon.rules.live import LiveRules
from daemon.rules.model import SweepSpec
from daemon.rules.ruleset import Ruleset
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.sweeps.plan import fire_missed, plan
from daemon.sweeps.run import SweepRunner

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class SweepTiming:
    """The sweeps' waits; the defaults suit production, tests make them short."""

    shutdown_wait: float = 20.0  # how long a stop waits for runs to reach a page's end
    misfire_grace: int = 300  # seconds: a fire this late (a busy loop) still runs


@dataclass
class _Sweep:
    """A sweep the daemon has scheduled: its wake-up, and whether a run is under way.
    A sweep that leaves the rules is `retired`: unscheduled, its task idle."""

    name: str
    schedule: str
    wanted: asyncio.Event = field(default_factory=asyncio.Event)
    running: bool = False
    retired: bool = False
    task: asyncio.Task[None] | None = None
    caught_up: bool = False


class Sweeper:
    def __init__(
        self,
        rules: LiveRules,
        runner: SweepRunner,
        store: Store,
        metrics: Metrics,
        supervisor: Supervisor,
        *,
        dry_run: bool = False,
        timing: SweepTiming | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._rules = rules
        self._runner = runner
        self._store = store
        self._metrics = metrics
        self._supervisor = supervisor
        self._dry_run = dry_run  # RECOVERYD_DRY_RUN
        self._timing = timing or SweepTiming()
        self._wall_clock = wall_clock
        self._sweeps: dict[str, _Sweep] = {}
        self._scheduler: AsyncIOScheduler | None = None
        self._stopping = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Sweeper]:
        """Schedule the sweeps of the rules in force, and follow reloads, for the block;
        at its end, runs under way stop at the end of their page (within a deadline).
        Run again when this replica takes the singleton jobs again (leadership.py)."""
        self._stopping = False
        self._sweeps = {}
        with contextlib.suppress(StoreUnavailable):  # else each sweep's task does it
            await self._close_interrupted(None)
            for name, at in (await self._store.last_sweep_successes()).items():
                if any(spec.name == name for spec in self._rules.current.sweeps):
                    self._metrics.sweep_last_success.labels(name).set(at)
        self._scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
        self._scheduler.start()
        self._apply(self._rules.current)
        self._rules.subscribe(self._apply)
        try:
            yield self
        finally:
            self._rules.unsubscribe(self._apply)
            self._scheduler.shutdown(wait=False)
            await self._stop()

    async def _stop(self) -> None:
        self._stopping = True
        for sweep in self._sweeps.values():
            sweep.wanted.set()
        tasks = [sweep.task for sweep in self._sweeps.values() if sweep.task is not None]
        # Only a run under way is worth waiting for: it ends at the end of its page, and
        # cancelled inside a call it would leave that page's outcome unknown.
        busy = [sweep.task for sweep in self._sweeps.values() if sweep.running and sweep.task]
        if busy:
            await asyncio.wait(busy, timeout=self._timing.shutdown_wait)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- following the rules --------------------------------------------------------------

    def _apply(self, ruleset: Ruleset) -> None:
        """Schedule the sweeps of `ruleset`: new ones added, removed ones retired, changed
        schedules rescheduled."""
        scheduler = self._scheduler
        assert scheduler is not None
        wanted = {spec.name: spec for spec in ruleset.sweeps}
        for known in self._sweeps.values():
            if known.name not in wanted and not known.retired:
                known.retired = True
                scheduler.remove_job(known.name)
                with contextlib.suppress(KeyError):  # no success yet: no such series
                    self._metrics.sweep_last_success.remove(known.name)
                log.info("sweep removed from the rules; unscheduled", sweep=known.name,
                         running=known.running)  # fmt: skip
        for name, spec in wanted.items():
            sweep = self._sweeps.get(name)
            if sweep is None:
                sweep = self._sweeps[name] = _Sweep(name, spec.schedule)
                sweep.task = self._supervisor.spawn(
                    f"sweep-{name}", functools.partial(self._loop, sweep)
                )
            elif not sweep.retired and sweep.schedule == spec.schedule:
                continue
            sweep.retired = False
            sweep.schedule = spec.schedule
            scheduler.add_job(
                self._fire,
                parse_schedule(spec.schedule),
                args=[name],
                id=name,
                name=f"sweep {name}",
                replace_existing=True,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=self._timing.misfire_grace,
            )
            log.info("sweep scheduled", sweep=name, schedule=spec.schedule,
                     next_run_at=self._next_run_at(name))  # fmt: skip

    async def _fire(self, name: str) -> None:
        """The schedule says run: wake the sweep's task, unless a run is under way."""
        sweep = self._sweeps.get(name)
        if sweep is None or sweep.retired:
            return
        if sweep.running:
            log.warning("sweep still running at its next scheduled time; this one is skipped",
                        sweep=name)  # fmt: skip
            return
        sweep.wanted.set()

    # -- each sweep's task ------------------------------------------------------------------

    async def _loop(self, sweep: _Sweep) -> None:
        """One run at a time, each when woken; until the daemon stops."""
        if not sweep.caught_up:
            await self._catch_up(sweep)
            sweep.caught_up = True
        while True:
            await sweep.wanted.wait()
            sweep.wanted.clear()
            if self._stopping:
                return
            if not sweep.retired:
                await self._run_once(sweep)

    async def _catch_up(self, sweep: _Sweep) -> None:
        """Run now when the last run was cut short or a scheduled run was missed."""
        last = await self._store.sweep_runs(sweep.name, 1)
        if not last:
            return
        run = last[0]
        if run.under_way or run.result == "interrupted":
            why = "its last run was cut short"
        elif fire_missed(sweep.schedule, run.started_at, self._wall_clock()):
            why = "its schedule fired while recoveryd was not running"
        else:
            return
        log.info("sweep runs now: " + why, sweep=sweep.name, last_run=run.id)
        sweep.wanted.set()

    async def _run_once(self, sweep: _Sweep) -> None:
        spec = _spec(self._rules.current, sweep.name)
        if spec is None:
            return
        sweep.running = True
        try:
            # This task is the sweep's only runner: a run still recorded as under way was
            # left so by a store that failed mid-run.
            await self._close_interrupted(sweep.name)
            dry_run = self._dry_run or self._rules.current.dry_run
            record = await self._runner.run(
                plan(spec, now=self._wall_clock(), dry_run=dry_run),
                stopping=lambda: self._stopping or sweep.retired,
            )
            if record is None:
                log.warning("sweep run not started: another is recorded as under way",
                            sweep=sweep.name)  # fmt: skip
        except StoreUnavailable as exc:
            log.error("sweep run could not be recorded; the next scheduled run tries again",
                      sweep=sweep.name, error=str(exc))  # fmt: skip
        finally:
            sweep.running = False

    async def _close_interrupted(self, sweep: str | None) -> None:
        for run in await self._store.close_interrupted_sweep_runs(self._wall_clock(), sweep):
            self._metrics.sweep_runs.labels(run.sweep, "interrupted").inc()
            log.warning("sweep run closed as interrupted", sweep=run.sweep, run=run.id,
                        error=run.error)  # fmt: skip

    # -- what the admin API shows ----------------------------------------------------------

    def _running(self, name: str) -> bool:
        sweep = self._sweeps.get(name)
        return sweep is not None and sweep.running

    def _next_run_at(self, name: str) -> float | None:
        job = self._scheduler.get_job(name) if self._scheduler is not None else None
        next_run = job.next_run_time if job is not None else None
        return next_run.timestamp() if next_run is not None else None

    async def describe(self, runs: int) -> list[dict[str, Any]]:
        """Each sweep in force: its spec, next run time, whether a run is under way, and
        its latest `runs` runs (newest first)."""
        ruleset = self._rules.current
        answer = []
        for spec in ruleset.sweeps:
            answer.append({
                "name": spec.name,
                "schedule": spec.schedule,
                "action": spec.action,
                "filter": spec.filter.model_dump(by_alias=True, exclude_defaults=True,
                                                 mode="json"),
                "overrides": spec.overrides.model_dump(by_alias=True, exclude_defaults=True,
                                                       mode="json") if spec.overrides else None,
                "maxPerRun": spec.max_per_run,
                "dryRun": self._dry_run or ruleset.dry_run or spec.dry_run,
                "nextRunAt": self._next_run_at(spec.name),
                "running": self._running(spec.name),
                "lastRuns": [run.to_json() for run in
                             await self._store.sweep_runs(spec.name, runs)],
            })  # fmt: skip
        return answer

    async def status(self) -> dict[str, Any]:
        """The `sweeps` part of `/api/v1/status`: how many, which run now, each last run."""
        names = [spec.name for spec in self._rules.current.sweeps]
        last = {}
        for name in names:
            found = await self._store.sweep_runs(name, 1)
            last[name] = found[0].to_json(pages=False) if found else None
        return {
            "sweeps": {
                "scheduled": len(names),
                "running": [name for name in names if self._running(name)],
                "lastRuns": last,
            }
        }


def _spec(ruleset: Ruleset, name: str) -> SweepSpec | None:
    return next((spec for spec in ruleset.sweeps if spec.name == name), None)
