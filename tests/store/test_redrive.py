"""Redrive: final dlqIds put back to `received`, or only listed."""

from __future__ import annotations

import pytest

from tests.store.support import OWNER, OpenStore, settled

NOW = 2_000.0


async def test_a_dry_redrive_lists_and_changes_nothing(open_store: OpenStore) -> None:
    """apply=False: the failed dlqIds in dlqId order; their state stays."""
    async with open_store() as store:
        await settled(store, ["d-2", "d-1"], "failed", now=NOW, reason="400")
        await settled(store, ["d-3"], "gone", now=NOW)
        assert await store.redrive(now=NOW + 1, apply=False) == ["d-1", "d-2"]
        assert (await store.status(NOW + 1))["states"]["failed"] == 2


async def test_a_redriven_dlq_id_starts_over_as_received(open_store: OpenStore) -> None:
    """Tries, lease and reason cleared; history says where it came from; claim takes it."""
    async with open_store() as store:
        await settled(store, ["d-1"], "failed", now=NOW, reason="400 bad request")
        assert await store.redrive(now=NOW + 1, apply=True) == ["d-1"]
        record = await store.record("d-1")
        assert record is not None
        assert (record["state"], record["reason"], record["fetchAttempts"]) == (
            "received", None, 0
        )  # fmt: skip
        assert record["history"][-1] == {
            "state": "redriven", "at": NOW + 1, "from": "failed", "reason": "400 bad request"
        }  # fmt: skip
        claimed = await store.claim(OWNER, 10, 60.0, NOW + 2)
        assert [(item.dlq_id, item.tries) for item in claimed] == [("d-1", 1)]


async def test_redrive_filters_by_state_rule_and_time(open_store: OpenStore) -> None:
    """Only the given states, the given rule, and final at or after `since`."""
    async with open_store() as store:
        await settled(store, ["old"], "failed", now=NOW - 100)
        await settled(store, ["new"], "failed", now=NOW)
        await settled(store, ["other-rule"], "failed", now=NOW, rule="rule-b")
        await settled(store, ["skipped"], "skipped", now=NOW)
        assert await store.redrive(since=NOW - 10, now=NOW, apply=False) == ["new", "other-rule"]
        assert await store.redrive(rule="rule-a", now=NOW, apply=False) == ["new", "old"]
        both = await store.redrive(states=("failed", "skipped"), since=NOW, rule="rule-a",
                                   now=NOW, apply=False)  # fmt: skip
        assert both == ["new", "skipped"]


async def test_redrive_takes_only_the_dlq_ids_named(open_store: OpenStore) -> None:
    """`dlq_ids` (the console's selection): those of them in a final state, no other."""
    async with open_store() as store:
        await settled(store, ["a", "b", "c"], "failed", now=NOW)
        assert await store.redrive(dlq_ids=["c", "a", "x"], now=NOW, apply=True) == ["a", "c"]
        assert (await store.status(NOW))["states"]["failed"] == 1


async def test_only_final_states_can_be_redriven(open_store: OpenStore) -> None:
    """A state still in the pipeline is refused with ValueError, naming it."""
    async with open_store() as store:
        with pytest.raises(ValueError, match="not batched"):
            await store.redrive(states=("failed", "batched"), now=NOW, apply=True)
