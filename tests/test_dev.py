"""The demo's lines, as `recoveryd dev` prints them (the whole demo runs in test_cli.py)."""

from __future__ import annotations

import pytest
import structlog

from daemon.dev import Live, _batch_sent, _call, _notified_line, _removal_lines
from daemon.emulator import EmulatorConfig, create_app
from daemon.emulator.journal import Call


def test_a_batch_of_one_is_said_in_the_singular() -> None:
    """`1 dlqId, 1 new run`, not `1 dlqIds, 1 new runs`."""
    line = _batch_sent({"action": "resume", "batch": 4, "dlq_ids": 1, "runs": 1})
    assert line == ("sent", "resume batch 4: 1 dlqId, 1 new run")
    line = _batch_sent({"action": "resume", "batch": 5, "dlq_ids": 2, "runs": 0})
    assert line == ("sent", "resume batch 5: 2 dlqIds, 0 new runs")


def test_a_call_naming_one_dlq_id_says_so_in_the_singular() -> None:
    """`(1 dlqId: d-1)`."""
    call = Call("POST", "/v2/dlq/resume", [("dlqIds", "d-1")], {}, at=0.0, status=200)
    assert _call(call) == "POST /v2/dlq/resume -> 200 (1 dlqId: d-1)"


def test_a_summary_row_of_one_puts_its_noun_in_the_singular() -> None:
    """`notified 1 summary delivered`, `removed 1 dead endpoint`."""
    lines: list[str] = []
    _notified_line(lines.append, [{"notifications": [{"state": "sent"}]}])
    _removal_lines(lines.append, [])
    assert [" ".join(line.split()) for line in lines] == [
        "notified 1 summary delivered to the webhook (for dlqIds counted above)",
        "removed 0 dead endpoints taken out of their URL Group",
    ]


def test_other_log_events_show_times_in_iso_8601_and_end_with_their_words() -> None:
    """An event without a line of its own is shown as it is, its times in ISO 8601 and no
    space left after its last word."""
    lines: list[str] = []
    live = Live(lines.append, create_app(EmulatorConfig()).state.emulator)
    live.begin()  # the header is out
    for event in (
        {"event": "this replica runs the singleton jobs"},
        {"event": "sweep still running", "sweep": "nightly", "next_run_at": 1795834800.0},
    ):
        with pytest.raises(structlog.DropEvent):
            live.on_log(None, "info", event)
    assert [line.split(maxsplit=1)[1] for line in lines] == [
        "info      this replica runs the singleton jobs",
        "info      sweep still running sweep=nightly next_run_at=2026-11-28T03:00:00Z",
    ]
