"""What replay and the shadow rules read from the store (Store.replay_rows,
shadow_disagreements): the facts and shadow decisions settle records, paged by keyset."""

from __future__ import annotations

import json

import pytest

from daemon.store import Store
from daemon.store.records import Outcome, ReplayRow
from tests.store.support import OWNER, OpenStore, received

NOW = 3_000.0


def shadow(rule: str | None, action: str | None = "ignore", overrides: str | None = None) -> str:
    return json.dumps({"rule": rule, "action": action, "overrides": overrides})


async def decided(store: Store, *outcomes: Outcome, at: float = NOW) -> None:
    """Received at `at` and settled as `outcomes`."""
    await received(store, *(outcome.dlq_id for outcome in outcomes), at=at)
    claimed = await store.claim(OWNER, len(outcomes), 60.0, at)
    assert len(claimed) == len(outcomes)
    await store.settle(OWNER, list(outcomes), at)


def ignored(dlq_id: str, rule: str = "quiet", *, shadow: str | None = None) -> Outcome:
    facts = json.dumps({"dlqId": dlq_id, "url": "https://a/x"})
    return Outcome(dlq_id, "skipped", reason=f"rule {rule} says ignore", rule=rule,
                   action="ignore", facts=facts, shadow=shadow)  # fmt: skip


async def every_row(store: Store, since: float | None = None, limit: int = 2) -> list[ReplayRow]:
    """Each page after the last one's end, until a page comes back short."""
    found: list[ReplayRow] = []
    after = None
    while True:
        page = await store.replay_rows(since, after, limit)
        found += page
        if len(page) < limit:
            return found
        after = (page[-1].received_at, page[-1].dlq_id)


async def test_a_settled_record_keeps_its_facts_and_decision(open_store: OpenStore) -> None:
    """The row carries the recorded decision, its overrides and the facts as settled."""
    overrides, facts = '{"retries":2}', '{"workflow":true}'
    recovery = Outcome("d-1", "dry-run", rule="billing", action="restart", overrides=overrides,
                       workflow_run_id="wfr-1", facts=facts)  # fmt: skip
    async with open_store() as store:
        await decided(store, recovery)
        rows = await store.replay_rows(None, None, 10)
    row = ReplayRow("d-1", NOW, "dry-run", None, "billing", "restart", overrides, "wfr-1", facts)
    assert rows == [row]


async def test_records_come_in_received_order_a_page_at_a_time(open_store: OpenStore) -> None:
    """Keyset on (received_at, dlqId): ties on the time ordered by dlqId, none twice;
    records without facts (not decided) are left out."""
    async with open_store() as store:
        await decided(store, ignored("b"), ignored("a"), ignored("c"), at=NOW)
        await decided(store, ignored("e"), at=NOW - 10)
        await decided(store, ignored("d"), at=NOW + 10)
        await received(store, "waiting", at=NOW + 5)
        await decided(store, Outcome("gone-1", "gone", reason="not in the DLQ"), at=NOW + 6)
        rows = await every_row(store)
    assert [row.dlq_id for row in rows] == ["e", "a", "b", "c", "d"]


async def test_since_leaves_out_the_records_received_before(open_store: OpenStore) -> None:
    """Received at `since` or later."""
    async with open_store() as store:
        await decided(store, ignored("old"), at=NOW - 100)
        await decided(store, ignored("edge"), at=NOW - 50)
        await decided(store, ignored("new"), at=NOW)
        rows = await every_row(store, since=NOW - 50)
    assert [row.dlq_id for row in rows] == ["edge", "new"]


async def test_a_page_larger_than_the_limit_is_refused(open_store: OpenStore) -> None:
    """Replay holds a page at a time: a bound on the page bounds its memory."""
    async with open_store() as store:
        with pytest.raises(ValueError, match="limit"):
            await store.replay_rows(None, None, 1_000_000)


async def test_disagreements_are_grouped_with_examples(open_store: OpenStore) -> None:
    """Rule, action or overrides that differ count; agreement and records without a
    shadow do not. The largest group first, five examples at most."""
    restart = Outcome("o-1", "dry-run", rule="billing", action="restart", overrides="{}",
                      facts="{}", shadow=shadow("billing", "restart", '{"retries":3}'))  # fmt: skip
    async with open_store() as store:
        await decided(store, *(ignored(f"n-{n}", shadow=shadow("loud", "restart"))
                               for n in range(7)))  # fmt: skip
        await decided(store, ignored("same", shadow=shadow("quiet")), ignored("unshadowed"))
        await decided(store, ignored("none", shadow=shadow(None, None)), restart)
        found = await store.shadow_disagreements()
        later = await store.shadow_disagreements(since=NOW + 1)
    assert found[0] == {
        "liveRule": "quiet", "liveAction": "ignore", "shadowRule": "loud",
        "shadowAction": "restart", "count": 7, "examples": found[0]["examples"],
    }  # fmt: skip
    assert len(found[0]["examples"]) == 5
    assert set(found[0]["examples"]) <= {f"n-{n}" for n in range(7)}
    assert found[1:] == [
        {"liveRule": "billing", "liveAction": "restart", "shadowRule": "billing",
         "shadowAction": "restart", "count": 1, "examples": ["o-1"]},
        {"liveRule": "quiet", "liveAction": "ignore", "shadowRule": None,
         "shadowAction": None, "count": 1, "examples": ["none"]},
    ]  # fmt: skip
    assert later == []
