"""A replay's report as people read it (rules/replay_text.py): the terminal's table, and
Markdown for a pull request, where a dlqId is text, never markup."""

from __future__ import annotations

import json

from daemon.rules.replay import replay
from daemon.rules.replay_text import rendered, summary
from tests.rules.test_replay import BILLING_RESUMED, LIVE, message, mixed, recorded


def test_the_table_shows_each_group_and_each_override_that_differs() -> None:
    lines = rendered(replay(BILLING_RESUMED, mixed(2)), "table").splitlines()

    assert lines[0].endswith("replayed on 6 records: 2 decisions would change")
    assert lines[2].split() == ["BEFORE", "(RULE", "ACTION)", "AFTER", "(RULE", "ACTION)",
                                "RECORDS", "EXAMPLES"]  # fmt: skip
    assert lines[3].split() == ["restart-billing", "restart", "restart-billing", "resume", "2",
                                "billing-0,", "billing-1"]  # fmt: skip
    assert "overrides restart-billing restart -> restart-billing resume: 2 records" in lines[5]
    assert lines[6] == "  retries: 5 -> 3"


def test_nothing_changing_is_said_in_one_line() -> None:
    assert summary(replay(LIVE, mixed(1))).endswith(": nothing would change")


def test_json_is_the_report_itself() -> None:
    report = replay(BILLING_RESUMED, mixed(1))
    assert json.loads(rendered(report, "json")) == report


def test_markdown_sets_a_hostile_dlq_id_as_text() -> None:
    """A dlqId with a table's bar, a link and markup cannot break the table or add a link."""
    hostile = "x|<img src=x>[a](javascript:alert(1))`"
    rows = [recorded(hostile, 0, message("b0", labels=["billing"]))]

    text = rendered(replay(BILLING_RESUMED, rows), "markdown")

    [row] = [line for line in text.splitlines() if line.startswith("| restart-billing restart | ")]
    assert row.count("|") - row.count("\\|") == 5  # four cells, whatever the dlqId holds
    assert "<img" not in text.replace("\\<img", "")  # escaped, it is text
    assert "](" not in text.replace("\\](", "")
    assert "x\\|\\<img src=x\\>\\[a\\](javascript:alert(1))\\`" in row
