"""The console's listings (Store.list_records, list_batches, failure_groups, rule_outcomes,
activity): filters, keyset paging, and the groups' counts kept through every move."""

from __future__ import annotations

import hashlib
import json

import pytest

from daemon.store import BadQuery, RecordQuery, Store
from daemon.store import listing as shared
from daemon.store.postgres import listing as postgres_listing
from daemon.store.records import Outcome
from daemon.store.sqlite import listing as sqlite_listing
from tests.store.support import OWNER, OpenStore, batched, done, received, settled

NOW = 2_000.0


def body(url: str, group: str | None = None, endpoint: str | None = None, status: int = 500,
         run: str | None = None) -> bytes:  # fmt: skip
    fields = {"url": url, "topicName": group, "endpointName": endpoint, "status": status}
    return json.dumps({k: v for k, v in {**fields, "workflowRunId": run}.items() if v}).encode()


async def everything(store: Store, query: RecordQuery) -> list[str]:
    """The dlqIds of every page of `query`, following the cursors."""
    listed: list[str] = []
    while True:
        page = await store.list_records(query)
        listed += [item["dlqId"] for item in page.items]
        if page.next is None:
            return listed
        query = RecordQuery(**{**query.__dict__, "cursor": page.next})


async def test_a_record_is_listed_with_what_its_callback_said(open_store: OpenStore) -> None:
    """URL, URL Group, endpoint and status come from the callback; newest first."""
    async with open_store() as store:
        await received(store, "old", at=NOW - 10, body=body("https://a/x", "grp", "ep", 502))
        await received(store, "new", at=NOW, body=b"not json")
        page = await store.list_records(RecordQuery())
    assert [item["dlqId"] for item in page.items] == ["new", "old"]
    assert page.next is None
    assert page.items[1] == {
        "dlqId": "old", "state": "received", "reason": None, "rule": None, "action": None,
        "workflowRunId": None, "url": "https://a/x", "urlGroup": "grp", "endpoint": "ep",
        "status": 502, "receivedAt": NOW - 10, "decidedAt": None, "updatedAt": None,
    }  # fmt: skip
    assert (page.items[0]["url"], page.items[0]["status"]) == (None, None)


async def test_each_filter_selects_its_records(open_store: OpenStore) -> None:
    """state, rule, action, since, and q on dlqId, run id, URL and URL Group."""
    async with open_store() as store:
        await settled(store, ["f-1"], "failed", now=NOW - 100, rule="rule-b",
                      body=body("https://u/1"))  # fmt: skip
        await done(store, ["d-1"], now=NOW - 50)
        await received(store, "r-1", at=NOW, body=body("https://u/2", "grp-1"))
        await received(store, "r-2", at=NOW, body=body("https://u/1"))
        await store.claim(OWNER, 5, 60.0, NOW)
        run = Outcome("r-2", "decided", rule="rule-c", action="restart", overrides="{}",
                      workflow_run_id="wfr-9")  # fmt: skip
        await store.settle(OWNER, [run], NOW)

        async def ids(**query: object) -> list[str]:
            return sorted(await everything(store, RecordQuery(**query)))  # type: ignore[arg-type]

        assert await ids(state="failed") == ["f-1"]
        assert await ids(rule="rule-b") == ["f-1"]
        assert await ids(action="restart") == ["r-2"]
        assert await ids(since=NOW - 60) == ["d-1", "r-1", "r-2"]
        assert await ids(q="d-1") == ["d-1"]
        assert await ids(q="wfr-9") == ["r-2"]
        assert await ids(q="https://u/1") == ["f-1", "r-2"]
        assert await ids(q="grp-1") == ["r-1"]
        assert await ids(q="https://u/1", state="failed") == ["f-1"]
        assert await ids(q="nothing") == []


async def test_paging_has_no_gap_nor_repeat_while_records_arrive(open_store: OpenStore) -> None:
    """Records arriving between pages (newer) never shift what the cursor lists next."""
    async with open_store() as store:
        await received(store, *[f"a-{n:02}" for n in range(7)], at=NOW)  # one received_at
        await received(store, *[f"b-{n:02}" for n in range(6)], at=NOW - 1)
        listed: list[str] = []
        query = RecordQuery(limit=4)
        while True:
            page = await store.list_records(query)
            assert len(page.items) <= 4
            listed += [item["dlqId"] for item in page.items]
            await received(store, f"late-{len(listed)}", at=NOW + len(listed))
            if page.next is None:
                break
            query = RecordQuery(limit=4, cursor=page.next)
    expected = sorted((f"a-{n:02}" for n in range(7)), reverse=True)
    assert listed == expected + sorted((f"b-{n:02}" for n in range(6)), reverse=True)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        (RecordQuery(cursor="not a cursor"), "cursor"),
        (RecordQuery(cursor="WyJ4Il0"), "cursor"),  # ["x"]: base64 JSON, not a key
        (RecordQuery(state="lost"), "state"),
        (RecordQuery(limit=0), "limit"),
        (RecordQuery(limit=501), "limit"),
    ],
)
async def test_a_bad_parameter_is_an_error_naming_it(
    open_store: OpenStore, query: RecordQuery, field: str
) -> None:
    """A cursor no listing gave, an unknown state, a limit out of range: BadQuery."""
    async with open_store() as store:
        with pytest.raises(BadQuery) as raised:
            await store.list_records(query)
    assert raised.value.field == field


async def test_batches_are_listed_newest_first_by_page(open_store: OpenStore) -> None:
    """list_batches pages by cursor and filters by state."""
    async with open_store() as store:
        first = await done(store, ["d-1", "d-2"], now=NOW)
        second = await batched(store, ["b-1"], now=NOW + 1)
        page = await store.list_batches(limit=1)
        assert [item["id"] for item in page.items] == [second.id]
        assert page.next is not None
        rest = await store.list_batches(cursor=page.next, limit=1)
        pending = await store.list_batches(state="pending")
    assert [item["id"] for item in rest.items] == [first.id]
    assert rest.items[0]["dlqIds"] == ["d-1", "d-2"]
    assert rest.items[0]["overrides"] == {}
    assert rest.items[0]["state"] == "settled"
    assert rest.next is None
    assert [item["id"] for item in pending.items] == [second.id]


async def test_groups_follow_state_changes_and_prune(open_store: OpenStore) -> None:
    """Counts by state per group stay right through decisions, batches and retention."""
    grouped = body("https://x/1", "orders", "ep-1", 503)
    async with open_store() as store:
        await settled(store, ["g-1", "g-2"], "failed", now=NOW - 100, body=grouped)
        await done(store, ["g-3"], now=NOW - 10)  # body {}: a group of its own
        await received(store, "g-4", at=NOW, body=grouped)
        await received(store, "u-1", at=NOW, body=body("https://solo", status=404))
        before = await store.failure_groups()
        await store.prune(before=NOW - 50, now=NOW, dedup_for=1.0)
        after = await store.failure_groups()
        outcomes = await store.rule_outcomes()
    orders = {"urlGroup": "orders", "endpoint": "ep-1", "url": None, "status": 503}
    by_key = {(g["urlGroup"], g["url"], g["rule"]): g for g in before}
    assert by_key[("orders", None, "rule-a")] | orders == by_key[("orders", None, "rule-a")]
    assert by_key[("orders", None, "rule-a")]["states"] == {"failed": 2}
    assert by_key[("orders", None, None)]["states"] == {"received": 1}
    assert by_key[(None, "https://solo", None)]["status"] == 404
    assert by_key[(None, None, "rule-a")]["states"] == {"done": 1}
    assert [g["lastSeen"] for g in before] == sorted((g["lastSeen"] for g in before), reverse=True)
    assert {(g["urlGroup"], g["url"], g["rule"]) for g in after} == {
        ("orders", None, None), (None, "https://solo", None), (None, None, "rule-a")
    }  # fmt: skip
    assert outcomes == {"rule-a": {"done": 1}}


async def test_activity_counts_decisions_and_recoveries_per_minute(
    open_store: OpenStore,
) -> None:
    """Each decision and each `done` lands in its minute; older ones are left out."""
    async with open_store() as store:
        await settled(store, ["old"], "failed", now=NOW - 3600)
        await settled(store, ["f-1", "f-2"], "failed", now=NOW - 30)
        await done(store, ["d-1"], now=NOW - 150)
        found = await store.activity(NOW, minutes=5)
        with pytest.raises(BadQuery):
            await store.activity(NOW, minutes=0)
    assert found == {"decided": [0, 0, 1, 0, 2], "recovered": [0, 0, 1, 0, 0]}


async def test_records_from_before_the_migration_are_listed_and_grouped(
    open_store: OpenStore,
) -> None:
    """The migration fills the listed fields from the bodies stored (a body that is not
    a JSON object, or a field of another type, leaves them empty) and counts the groups."""
    open_store.migrated_up_to(sqlite_listing.SCHEMA, postgres_listing.SCHEMA)
    rows = {
        "old-1": body("https://o/1", "grp", "ep", 502),
        "old-2": json.dumps({"url": 7, "status": "500", "topicName": None}).encode(),
        "old-3": b"\xff not json",
        "old-4": b"[1, 2]",
        "old-5": json.dumps({"url": "https://o/1", "status": 99999999999}).encode(),
        "old-6": body("https://o/" + "é" * 900),
    }
    for at, (dlq_id, stored) in enumerate(rows.items()):
        literal = f"x'{stored.hex()}'" if open_store.kind == "sqlite" else f"'\\x{stored.hex()}'"
        open_store.query(
            "INSERT INTO callbacks (dlq_id, body, received_at) "
            f"VALUES ('{dlq_id}', {literal}, {NOW + at})"
        )
    async with open_store() as store:
        page = await store.list_records(RecordQuery())
        groups = await store.failure_groups()
    listed = {item["dlqId"]: (item["url"], item["urlGroup"], item["endpoint"], item["status"])
              for item in page.items}  # fmt: skip
    assert listed == {
        "old-1": ("https://o/1", "grp", "ep", 502),
        "old-2": (None, None, None, None),
        "old-3": (None, None, None, None),
        "old-4": (None, None, None, None),
        "old-5": ("https://o/1", None, None, None),
        "old-6": (("https://o/" + "é" * 900)[: shared.MAX_LISTED], None, None, 500),
    }
    counts = {(g["urlGroup"], g["url"]): g["count"] for g in groups}
    assert counts == {
        ("grp", None): 1, (None, None): 3, (None, "https://o/1"): 1, (None, listed["old-6"][0]): 1
    }  # fmt: skip


async def test_groups_follow_a_redrive_decided_again_by_another_rule(
    open_store: OpenStore,
) -> None:
    """A rule change moves a record to the other rule's group; counts match the table."""
    grouped = body("https://x/1", "orders", "ep-1", 500)
    async with open_store() as store:
        await settled(store, ["m-1", "m-2"], "failed", now=NOW, rule="rule-a", body=grouped)
        await store.redrive(now=NOW + 1, apply=True)
        await store.claim(OWNER, 1, 60.0, NOW + 2)
        [claimed] = [dlq_id for dlq_id in ("m-1", "m-2")
                     if (await store.record(dlq_id) or {}).get("fetchAttempts")]  # fmt: skip
        again = Outcome(claimed, "skipped", rule="rule-b", action="resume", overrides="{}")
        await store.settle(OWNER, [again], NOW + 2)
        groups = await store.failure_groups()
        outcomes = await store.rule_outcomes()
    assert {(g["rule"], tuple(sorted(g["states"].items()))) for g in groups} == {
        ("rule-a", (("received", 1),)), ("rule-b", (("skipped", 1),))
    }  # fmt: skip
    counted = open_store.query(
        "SELECT rule, state, count(*) FROM callbacks WHERE rule IS NOT NULL GROUP BY rule, state"
    )
    assert outcomes == {rule: {state: n} for rule, state, n in counted}


async def test_a_callback_with_a_very_long_url_is_stored_and_found(open_store: OpenStore) -> None:
    """Its listed URL is cut to MAX_LISTED characters (an index entry has a size limit);
    a search for the whole URL still finds it."""
    # Hashes, which PostgreSQL cannot compress into an index entry's room.
    noise = "".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(100))
    url = "https://long/" + noise
    async with open_store() as store:
        await received(store, "long-1", at=NOW, body=body(url, noise, noise))
        page = await store.list_records(RecordQuery(q=url))
    [item] = page.items
    assert item["url"] == url[: shared.MAX_LISTED]
    assert len(item["urlGroup"]) == shared.MAX_LISTED
