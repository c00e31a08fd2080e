"""Forming batches: grouping by batch key and flush decisions, with the time passed in."""

from __future__ import annotations

from daemon.pipeline.forming import Formed, Forming
from daemon.rules import BatchPolicy
from daemon.store.records import Pending

POLICIES = {"small": BatchPolicy(max_size=2, max_wait=60.0), "slow": BatchPolicy(50, 30.0)}


def _pending(dlq_id: str, rule: str, decided_at: float = 1000.0, overrides: str = "{}") -> Pending:
    return Pending(dlq_id, "resume", overrides, rule, decided_at)


def test_a_group_goes_at_the_tightest_max_size_of_its_rules() -> None:
    """dlqIds of two rules sharing a key are batched at the smaller of their maxSizes."""
    forming, held = Forming(POLICIES.__getitem__), set[str]()
    forming.add([_pending(f"d{n}", "small" if n == 0 else "slow") for n in range(5)],
                now=0.0, wall=1000.0, held=held)  # fmt: skip
    assert [formed.dlq_ids for formed in forming.due(0.0, everything=False)] == [
        ["d0", "d1"],
        ["d2", "d3"],
    ]
    assert held == {"d0", "d1", "d2", "d3", "d4"}


def test_max_wait_counts_from_the_decision_across_a_restart() -> None:
    """A dlqId decided 25 s before it was queued is due 5 s later under a 30 s maxWait."""
    forming = Forming(POLICIES.__getitem__)
    forming.add([_pending("d0", "slow", decided_at=975.0)], now=0.0, wall=1000.0, held=set())
    assert list(forming.due(4.9, everything=False)) == []
    assert forming.deadlines() == [5.0]
    assert list(forming.due(5.0, everything=False)) == [Formed("resume", "{}", ["d0"])]
    assert forming.deadlines() == []


def test_other_overrides_make_another_batch() -> None:
    """The same action with other overrides goes out in a batch of its own."""
    forming = Forming(POLICIES.__getitem__)
    forming.add([_pending("d0", "slow"), _pending("d1", "slow", overrides='{"delay":"1s"}')],
                now=0.0, wall=1000.0, held=set())  # fmt: skip
    formed = list(forming.due(0.0, everything=True))
    assert sorted(batch.overrides for batch in formed) == ['{"delay":"1s"}', "{}"]


def test_a_dlq_id_held_is_not_grouped_again() -> None:
    """A dlqId already in a group or a batch of this process is left out."""
    forming, held = Forming(POLICIES.__getitem__), {"d0"}
    forming.add([_pending("d0", "slow"), _pending("d1", "slow")], now=0.0, wall=1000.0, held=held)
    assert [formed.dlq_ids for formed in forming.due(0.0, everything=True)] == [["d1"]]
