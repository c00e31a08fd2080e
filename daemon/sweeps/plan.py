"""What one run of a sweep does, fixed when it starts; and whether a scheduled run was
missed. Pure: the time is passed in.

The filter is resolved once per run: `fromDate: -24h` becomes the Unix time in ms 24
hours before the run started, and every page of the run uses that same filter (the
service's cursor walks the selection of one filter).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.triggers.interval import IntervalTrigger

from daemon.foundation.durations import parse_duration
from daemon.foundation.schedule import parse_schedule
from daemon.rules.model import SweepFilter, SweepSpec
from daemon.upstream import BulkAction, BulkFilter, Overrides


@dataclass(frozen=True)
class Plan:
    """One run of a sweep: the call it makes (action, filter, overrides), how many runs
    at most, and whether it only selects (a dry run lists, and acts on nothing)."""

    sweep: str
    action: BulkAction
    filter: BulkFilter
    overrides: Overrides | None
    max_per_run: int
    dry_run: bool

    def filter_json(self) -> dict[str, Any]:
        """The filter as the service is sent it (camelCase, dates in ms)."""
        return self.filter.model_dump(by_alias=True, exclude_defaults=True, mode="json")

    def overrides_json(self) -> dict[str, Any] | None:
        if self.overrides is None:
            return None
        return self.overrides.model_dump(by_alias=True, exclude_defaults=True, mode="json")


def plan(spec: SweepSpec, *, now: float, dry_run: bool = False) -> Plan:
    """The run of `spec` starting at `now` (Unix seconds). `dry_run` is what the daemon
    and the rules file say (RECOVERYD_DRY_RUN, `defaults.dryRun`); the sweep's own
    `dryRun` adds to it, never takes it away."""
    return Plan(
        sweep=spec.name,
        action=spec.action,
        filter=bulk_filter(spec.filter, now),
        overrides=spec.overrides,
        max_per_run=spec.max_per_run,
        dry_run=dry_run or spec.dry_run,
    )


def bulk_filter(spec: SweepFilter, now: float) -> BulkFilter:
    """The sweep's filter as the bulk calls take it, relative dates resolved at `now`."""
    now_ms = int(now * 1000)
    return BulkFilter(
        label=spec.label,
        from_date=instant(spec.from_date, now_ms),
        to_date=instant(spec.to_date, now_ms),
        workflow_url=spec.workflow_url,
        workflow_run_id=spec.workflow_run_id,
        workflow_created_at=spec.workflow_created_at,
        failure_function_state=spec.failure_function_state,
        caller_ip=spec.caller_ip,
        flow_control_key=spec.flow_control_key,
    )


def instant(value: int | str | None, now_ms: int) -> int | None:
    """A Unix time in ms as written (`1700000000000`), or `-24h` before `now_ms`."""
    if value is None or isinstance(value, int):
        return value
    return now_ms - int(parse_duration(value.removeprefix("-")) * 1000)


def fire_missed(schedule: str, last_started: float, now: float) -> bool:
    """Whether `schedule` fired between a run that started at `last_started` and `now`
    (both Unix seconds): a run the daemon missed while it was not running."""
    trigger = parse_schedule(schedule)
    if isinstance(trigger, IntervalTrigger):
        return last_started + float(trigger.interval.total_seconds()) <= now
    # A second past the start: the run that began on a fire time is not that fire missed.
    after = datetime.fromtimestamp(last_started + 1, UTC)
    fire: datetime | None = trigger.get_next_fire_time(None, after)
    return fire is not None and fire.timestamp() <= now
