"""A dlqId's final answers (refusals) counted apart from its fetch tries, on both stores:
an outage's transient failures are tries, and must not bring a dlqId nearer to `failed`."""

from __future__ import annotations

from daemon.store import Store
from daemon.store.postgres import schema
from daemon.store.records import Claimed, Outcome, State
from daemon.store.sqlite.pipeline import REFUSALS
from tests.store.support import OWNER, OpenStore, received

NOW = 3_000.0


async def tried(store: Store, state: State = "received", *, refused: bool) -> Claimed:
    """Claim the one dlqId, and settle its fetch as `state` (due again at once)."""
    [claimed] = await store.claim(OWNER, 1, 60.0, NOW)
    outcome = Outcome(claimed.dlq_id, state, reason="r", retry_at=NOW, refused=refused)
    await store.settle(OWNER, [outcome], NOW)
    return claimed


async def test_refusals_count_final_answers_only(open_store: OpenStore) -> None:
    """Two transient failures, then two refusals: the claims say 0, 0, 0, 1 refusals
    before each try; the record shows 4 tries and 2 refusals; a redrive clears both."""
    async with open_store() as store:
        await received(store, "d-1", at=NOW)
        seen = [await tried(store, refused=False) for _ in range(2)]
        seen.append(await tried(store, refused=True))
        seen.append(await tried(store, "failed", refused=True))
        record = await store.record("d-1")
        assert await store.redrive(states=["failed"], now=NOW, apply=True) == ["d-1"]
        [again] = await store.claim(OWNER, 1, 60.0, NOW)
    assert [(claimed.tries, claimed.refusals) for claimed in seen] == [
        (1, 0), (2, 0), (3, 0), (4, 1)
    ]  # fmt: skip
    assert record is not None
    assert (record["state"], record["fetchAttempts"], record["fetchRefusals"]) == ("failed", 4, 2)
    assert (again.tries, again.refusals) == (1, 0)


async def test_a_store_from_before_refusals_migrates_its_rows_to_none(
    open_store: OpenStore,
) -> None:
    """A dlqId that spent seven tries under the older schema (final answers and an
    outage's failures, which it cannot tell apart) starts at 0 refusals: it can get up
    to five more final answers, never fewer."""
    open_store.migrated_up_to(REFUSALS, schema.REFUSALS)
    body = "x''" if open_store.kind == "sqlite" else "''::bytea"
    open_store.query(
        f"INSERT INTO callbacks (dlq_id, body, received_at, tries) VALUES ('old', {body}, {NOW}, 7)"
    )
    async with open_store() as store:
        [claimed] = await store.claim(OWNER, 1, 60.0, NOW)
        record = await store.record("old")
    assert (claimed.tries, claimed.refusals) == (8, 0)
    assert record is not None
    assert record["fetchRefusals"] == 0
