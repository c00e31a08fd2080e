"""What a run of a sweep does, fixed at its start: relative dates resolved, dry run or
not; and which schedules fired while the daemon was away. Pure functions, no clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from daemon.rules import parse_rules
from daemon.rules.model import SweepSpec
from daemon.sweeps.plan import fire_missed, plan

NOW = datetime(2025, 11, 20, 12, 0, tzinfo=UTC).timestamp()


def sweep(text: str) -> SweepSpec:
    rules = f"version: 1\nrules: []\nsweeps:\n  - {text}\n"
    [spec] = parse_rules(rules).sweeps
    return spec


def test_relative_dates_are_resolved_at_the_run_and_absolute_ones_kept() -> None:
    """fromDate: -24h is 24 hours before the run started, in ms; a number stays as it is."""
    spec = sweep(
        "{name: s, schedule: 10m, action: restart, "
        "filter: {label: [a, b], fromDate: -24h, toDate: 1763640000000}}"
    )
    run = plan(spec, now=NOW)
    assert run.filter.from_date == int(NOW * 1000) - 24 * 3600 * 1000
    assert run.filter.to_date == 1763640000000
    assert run.filter_json() == {
        "label": ["a", "b"],
        "fromDate": int(NOW * 1000) - 86_400_000,
        "toDate": 1763640000000,
    }
    later = plan(spec, now=NOW + 60)
    assert later.filter.from_date == run.filter.from_date + 60_000


def test_every_filter_and_the_overrides_reach_the_call() -> None:
    """Each filter of the sweep becomes the bulk call's, the overrides go along."""
    spec = sweep(
        "{name: s, schedule: 1h, action: resume, maxPerRun: 70, overrides: {retries: 3}, "
        "filter: {failureFunctionState: CALLBACK_FAIL, workflowUrl: 'https://a.example.com/w', "
        "workflowRunId: wfr_1, workflowCreatedAt: 5, callerIp: 1.2.3.4, flowControlKey: k}}"
    )
    run = plan(spec, now=NOW)
    assert (run.action, run.max_per_run, run.dry_run) == ("resume", 70, False)
    assert run.overrides_json() == {"retries": 3}
    assert dict(run.filter.query()) == {
        "failureFunctionState": "CALLBACK_FAIL",
        "workflowUrl": "https://a.example.com/w",
        "workflowRunId": "wfr_1",
        "workflowCreatedAt": "5",
        "callerIp": "1.2.3.4",
        "flowControlKey": "k",
    }


@pytest.mark.parametrize(
    ("own", "daemon", "expected"),
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_a_dry_run_when_the_sweep_or_the_daemon_says(
    own: bool, daemon: bool, expected: bool
) -> None:
    """The sweep's dryRun adds to RECOVERYD_DRY_RUN / defaults.dryRun, never takes away."""
    spec = sweep(f"{{name: s, schedule: 1h, action: restart, dryRun: {str(own).lower()}, "
                 "filter: {label: x}}")  # fmt: skip
    assert plan(spec, now=NOW, dry_run=daemon).dry_run is expected


@pytest.mark.parametrize(
    ("schedule", "last_started", "missed"),
    [
        ("10m", NOW - 599, False),
        ("10m", NOW - 600, True),
        ("0 3 * * *", datetime(2025, 11, 20, 3, 0, tzinfo=UTC).timestamp(), False),
        ("0 3 * * *", datetime(2025, 11, 19, 3, 0, tzinfo=UTC).timestamp(), True),
        ("0 3 * * *", datetime(2025, 11, 19, 3, 0, 1, tzinfo=UTC).timestamp(), True),
        ("0 13 * * *", datetime(2025, 11, 19, 13, 0, tzinfo=UTC).timestamp(), False),
    ],
)
def test_a_fire_missed_while_away(schedule: str, last_started: float, missed: bool) -> None:
    """An interval missed once its length has passed since the last run began; a cron
    schedule when it had a fire time after that run began and before now (UTC)."""
    assert fire_missed(schedule, last_started, NOW) is missed
