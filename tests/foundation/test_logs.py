"""The log's repeat filter: a flood of identical warnings becomes one line a window."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog

from daemon.foundation.logs import RepeatFilter, iso_times
from tests.processes import serving


def _run(repeat: RepeatFilter, **event: Any) -> dict[str, Any] | None:
    try:
        return dict(repeat(None, event.get("level", "info"), dict(event)))
    except structlog.DropEvent:
        return None


def test_identical_warnings_are_folded_with_a_count() -> None:
    """The first warning of a kind is written, the next ones in the window are left out,
    and the first one after the window says how many were."""
    now = [0.0]
    repeat = RepeatFilter(window=60.0, clock=lambda: now[0])
    written = []
    for second in range(0, 130, 1):
        now[0] = float(second)
        line = _run(repeat, level="warning", event="dlq message not fetched", dlq_id=str(second))
        if line is not None:
            written.append((second, line.get("repeated")))
    assert written == [(0, None), (60, 59), (120, 59)]


@pytest.mark.parametrize("level", ["info", "debug"])
def test_info_and_debug_lines_pass_untouched(level: str) -> None:
    """Only warnings and errors are folded: info lines are the record of what was done."""
    repeat = RepeatFilter(clock=lambda: 0.0)
    assert all(_run(repeat, level=level, event="decided") for _ in range(5))


def test_different_tasks_are_different_kinds() -> None:
    """A crash of one task does not hide the crash of another."""
    repeat = RepeatFilter(clock=lambda: 0.0)
    assert _run(repeat, level="error", event="task crashed", task="fetch-1")
    assert _run(repeat, level="error", event="task crashed", task="batcher")
    assert _run(repeat, level="error", event="task crashed", task="fetch-1") is None


def test_each_store_problem_and_each_circuit_is_news_of_its_own() -> None:
    """Two store problems found in one check, or two circuits opening, are two lines."""
    repeat = RepeatFilter(clock=lambda: 0.0)
    assert _run(repeat, level="error", event="store problem", problem="database")
    assert _run(repeat, level="error", event="store problem", problem="wal")
    assert _run(repeat, level="warning", event="circuit open", operation="resume")
    assert _run(repeat, level="warning", event="circuit open", operation="restart")
    assert _run(repeat, level="warning", event="circuit open", operation="resume") is None


def _sweep_scheduled(tmp_path: Path, log_format: str) -> str:
    """The log line of `serve` (the repository's rules, whose sweep runs nightly) that says
    when the sweep runs next."""
    with serving(tmp_path, LOG_FORMAT=log_format) as served:
        _, logs = served.stop()
    [line] = [line for line in logs.splitlines() if "sweep scheduled" in line]
    return line


def test_console_logs_show_times_in_iso_8601(tmp_path: Path) -> None:
    """A person reads `next_run_at=2026-11-28T03:00:00Z`, not seconds since the epoch,
    in the same form as the line's own timestamp."""
    line = _sweep_scheduled(tmp_path, "console")
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z ", line), line
    assert re.search(r"\bnext_run_at=\d{4}-\d\d-\d\dT03:00:00Z\b", line), line


def test_json_logs_keep_times_as_numbers(tmp_path: Path) -> None:
    """A machine reads JSON: a time field is seconds since the epoch, as docs/operating.md
    says, beside the ISO 8601 `timestamp` of the line."""
    event = json.loads(_sweep_scheduled(tmp_path, "json"))
    assert isinstance(event["next_run_at"], float)
    assert datetime.fromtimestamp(event["next_run_at"], UTC).strftime("%H:%M:%S") == "03:00:00"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", event["timestamp"])


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e20, -1e20])
def test_a_time_no_date_can_say_keeps_its_number(value: float) -> None:
    """An `_at` value out of any date's range (infinite, milliseconds by mistake) is shown
    as the number it is, not an exception in place of the line."""
    event = iso_times(None, "info", {"event": "x", "next_run_at": value})
    assert event["next_run_at"] is value
