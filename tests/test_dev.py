"""The demo's lines, as `recoveryd dev` prints them (the whole demo runs in test_cli.py)."""

from __future__ import annotations

from daemon.dev import _batch_sent, _call, _notified_line, _removal_lines
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
