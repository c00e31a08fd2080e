"""The log's repeat filter: a flood of identical warnings becomes one line a window."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from daemon.logs import RepeatFilter


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
