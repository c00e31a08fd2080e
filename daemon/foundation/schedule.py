"""Schedules as users write them, a cron expression (UTC) or an interval, parsed in one place."""

from __future__ import annotations

from datetime import UTC

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from daemon.foundation.durations import parse_duration


def parse_schedule(text: str) -> BaseTrigger:
    """An APScheduler trigger for `text`: an interval (`10m`, `24h`) or a five-field cron
    expression read in UTC (`0 3 * * 0`); a ValueError that shows both forms otherwise."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        pass
    else:
        if seconds <= 0:
            raise ValueError(f"an interval must be longer than 0s; got {text!r}")
        return IntervalTrigger(seconds=seconds, timezone=UTC)
    try:
        return CronTrigger.from_crontab(text, timezone=UTC)
    except ValueError as exc:
        raise ValueError(
            f"must be a cron expression like '0 3 * * *' or an interval like 10m; "
            f"got {text!r} ({exc})"
        ) from None
