"""The reasons both stores record, as a person reads them in a record or a log line."""

from __future__ import annotations

from daemon.store.records import over_budget_reason
from daemon.store.removals import capped_reason


def test_a_budget_spent_by_one_recovery_says_one_time() -> None:
    """`already recovered 1 time`, not `1 times`."""
    assert "already recovered 1 time in the rule's window" in over_budget_reason("wf", "r", 1)
    assert "already recovered 2 times in the rule's window" in over_budget_reason("wf", "r", 2)


def test_a_cap_of_one_removal_says_one_endpoint_was_removed() -> None:
    """`1 endpoint was removed`, not `1 endpoints were removed`."""
    assert capped_reason(1, 1, "orders", "a", None).startswith(
        "held back: 1 endpoint was removed in the last hour"
    )
    assert capped_reason(2, 2, "orders", "a", None).startswith(
        "held back: 2 endpoints were removed in the last hour"
    )
