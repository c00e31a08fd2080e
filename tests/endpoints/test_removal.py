"""remove-endpoint end to end: the emulator's URL Groups, real failure callbacks, recoveryd
counting failures, reading the group and removing the endpoint, or saying why not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from daemon.http.serving import serve
from tests.emulator.support import Sink
from tests.endpoints.support import (
    dead_letter,
    endpoints,
    fail,
    finished_removals,
    group_endpoints,
    named,
    put_group,
    removals,
    rules,
    topic_calls,
)
from tests.pipeline.support import harness
from tests.support import eventually


async def test_an_endpoint_answering_410_is_removed_at_the_threshold_and_not_before(
    tmp_path: Path,
) -> None:
    """A group of three whose endpoint c answers 410: messages published to the group
    really fail at c, the service sends signed failure callbacks, and recoveryd counts
    them; the third within the window reads the group and removes c, by name, once."""
    sink = Sink(statuses={"/c": 410})
    async with serve(sink) as sink_url, harness(tmp_path, rules(failures=3), PUBLIC_URL="") as h:
        members = [{"name": name, "url": f"{sink_url}/{name}"} for name in "abc"]
        await put_group(h.control, "orders", members)
        callback = str(h.recoveryd.public.base_url.join("/callbacks"))
        for sent in range(1, 4):
            message = {"topic": "orders", "maxRetries": 0, "failureCallback": callback}
            published = await h.control.post(
                "/_emulator/publish", params={"wait": "true"}, json=message
            )
            assert [o["state"] for o in published.json()["outcomes"]] == ["delivered"] * 2 + [
                "failed"
            ]
            await h.settled(sent)
            if sent < 3:  # below the threshold: the group is not even read
                journal = await h.journal()
                assert topic_calls(journal, "GET") == topic_calls(journal, "DELETE") == []
                assert await group_endpoints(h.control, "orders") == members
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        journal = await h.journal()
        dlq_ids = [call["path"].rsplit("/", 1)[1] for call in journal
                   if call["path"].startswith("/v2/dlq/")]  # fmt: skip
        records = [await h.record(dlq_id) for dlq_id in dlq_ids]
        status = await h.status()
        failures = h.recoveryd.metric("recoveryd_endpoint_failures_total", url_group="orders")
        removed = h.recoveryd.metric("recoveryd_endpoint_removals_total", result="removed")

    assert await_nothing_else(journal)
    [read] = topic_calls(journal, "GET")
    [delete] = topic_calls(journal, "DELETE")
    assert read["path"] == "/v2/topics/orders"
    assert read["at"] <= delete["at"]
    assert (delete["path"], named(delete), delete["status"]) == (
        "/v2/topics/orders/endpoints",
        [{"name": "c"}],
        200,
    )
    assert removal["state"] == "removed"
    assert removal["endpoint"] == {"name": "c", "url": f"{sink_url}/c"}
    assert [(item["dlqId"], item["responseStatus"]) for item in removal["evidence"]] == [
        (dlq_id, 410) for dlq_id in dlq_ids
    ]
    assert [record["reason"] for record in records[:2]] == [
        "counted 1 of 3 failures within 10m of endpoint c of URL Group orders",
        "counted 2 of 3 failures within 10m of endpoint c of URL Group orders",
    ]
    assert records[2]["state"] == "done"
    assert records[2]["reason"] == "removed endpoint c from URL Group orders (removal 1)"
    # Never a batch: remove-endpoint's dlqIds do not pass through `decided`.
    assert status["pendingBatches"] == 0
    assert all("decided" not in [e["state"] for e in r["history"]] for r in records)
    assert (failures, removed) == (3, 1)


def await_nothing_else(journal: list[dict[str, object]]) -> bool:
    """Only reads of the DLQ and of the group, and the one DELETE: no bulk call."""
    return all(str(call["path"]).startswith(("/v2/dlq/", "/v2/topics/orders")) for call in journal)


async def test_the_last_endpoint_of_a_group_is_kept_and_why_is_recorded(tmp_path: Path) -> None:
    [only] = endpoints("solo", "only")
    async with harness(tmp_path, rules(failures=2)) as h:
        await put_group(h.control, "solo", [only])
        dlq_ids = await fail(h, dead_letter("solo", only), dead_letter("solo", only, status=404))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        last = await h.record(dlq_ids[1])
        journal = await h.journal()
        assert await group_endpoints(h.control, "solo") == [only]
        kept = h.recoveryd.metric("recoveryd_endpoint_removals_total", result="kept_last")

    assert topic_calls(journal, "DELETE") == []
    assert len(topic_calls(journal, "GET")) == 1
    assert removal["state"] == "kept_last"
    why = (
        "kept endpoint only: it is the last endpoint of URL Group solo, and removing it would "
        "delete the group (keepLastEndpoint)"
    )
    assert removal["reason"] == why
    assert (last["state"], last["reason"]) == ("skipped", f"{why} (removal 1)")
    assert [item["responseStatus"] for item in removal["evidence"]] == [410, 404]
    assert kept == 1


async def test_the_hourly_cap_holds_and_counts_removals_made_before_a_restart(
    tmp_path: Path,
) -> None:
    """RECOVERYD_MAX_REMOVALS_PER_HOUR=1: the first dead endpoint goes, the next is held
    back with the reason, and so is one after a restart (the count is the store's)."""
    groups = {name: endpoints(name, "a", "b", "c") for name in ("g1", "g2", "g3")}
    async with harness(tmp_path, rules(failures=1), MAX_REMOVALS_PER_HOUR="1") as h:
        for name in ("g1", "g2"):
            await put_group(h.control, name, groups[name])
        _, second = await fail(
            h, dead_letter("g1", groups["g1"][2]), dead_letter("g2", groups["g2"][2])
        )
        await finished_removals(h.recoveryd.admin, 2)
        assert await group_endpoints(h.control, "g1") == groups["g1"][:2]
        assert await group_endpoints(h.control, "g2") == groups["g2"]
        held = await h.record(second)
    async with harness(tmp_path, rules(failures=1), MAX_REMOVALS_PER_HOUR="1") as h:
        await put_group(h.control, "g3", groups["g3"])
        [third] = await fail(h, dead_letter("g3", groups["g3"][2]))
        found = await finished_removals(h.recoveryd.admin, 3)
        assert await group_endpoints(h.control, "g3") == groups["g3"]
        after_restart = await h.record(third)
        assert topic_calls(await h.journal(), "DELETE") == []
        capped = h.recoveryd.metric("recoveryd_endpoint_removals_total", result="capped")

    assert [removal["state"] for removal in found] == ["removed", "capped", "capped"]
    for record in (held, after_restart):
        assert record["state"] == "skipped"
        assert record["reason"].startswith(
            "held back: 1 endpoint was removed in the last hour, the cap "
            "(RECOVERYD_MAX_REMOVALS_PER_HOUR); endpoint c of URL Group"
        )
    assert capped == 1


async def test_a_cap_of_zero_removes_nothing(tmp_path: Path) -> None:
    members = endpoints("orders", "a", "b")
    async with harness(tmp_path, rules(failures=1), MAX_REMOVALS_PER_HOUR="0") as h:
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[1]))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        assert await group_endpoints(h.control, "orders") == members
    assert removal["state"] == "capped"
    assert removal["reason"].startswith("held back: removals are off")


async def test_the_failure_window_survives_a_restart(tmp_path: Path) -> None:
    members = endpoints("orders", "a", "b", "c")
    async with harness(tmp_path, rules(failures=3)) as h:
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[2]), dead_letter("orders", members[2]))
        assert await removals(h.recoveryd.admin) == []
    async with harness(tmp_path, rules(failures=3)) as h:  # a new daemon on the same store
        await put_group(h.control, "orders", members)
        [third] = await fail(h, dead_letter("orders", members[2]))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        assert await group_endpoints(h.control, "orders") == members[:2]
        record = await h.record(third)
    assert removal["state"] == "removed"
    assert len(removal["evidence"]) == 3
    assert record["reason"] == "removed endpoint c from URL Group orders (removal 1)"


async def test_failures_older_than_the_window_do_not_count(tmp_path: Path) -> None:
    members = endpoints("orders", "a", "b")
    # A window that the steps between `late` and `soon` (a decision, three reads) fit in
    # with room to spare on a slow machine.
    async with harness(tmp_path, rules(failures=2, within="3s")) as h:
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[1]))
        await asyncio.sleep(3.3)
        [late] = await fail(h, dead_letter("orders", members[1]))
        assert await removals(h.recoveryd.admin) == []
        record = await h.record(late)
        [soon] = await fail(h, dead_letter("orders", members[1]))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
    assert record["reason"] == "counted 1 of 2 failures within 3s of endpoint b of URL Group orders"
    assert [item["dlqId"] for item in removal["evidence"]] == [late, soon]


async def test_a_failed_group_read_removes_nothing_and_says_why(tmp_path: Path) -> None:
    """The service keeps answering 500 to the group read: it is tried again with backoff
    (the client's retries, then the remover's), then nothing is removed, with the reason."""
    members = endpoints("orders", "a", "b", "c")
    async with harness(tmp_path, rules(failures=1)) as h:
        await put_group(h.control, "orders", members)
        await h.fault(kind="status", status=500, times=1000, paths=["/v2/topics/orders"])
        [dlq_id] = await fail(h, dead_letter("orders", members[2]))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        record = await h.record(dlq_id)
        journal = await h.journal()
        assert await group_endpoints(h.control, "orders") == members
        failed = h.recoveryd.metric("recoveryd_endpoint_removals_total", result="read_failed")

    assert topic_calls(journal, "DELETE") == []
    reads = topic_calls(journal, "GET")
    assert len(reads) > 5
    assert {call["status"] for call in reads} == {500}
    assert removal["state"] == "read_failed"
    assert removal["reason"].startswith("reading URL Group orders failed: get_url_group: 500")
    assert removal["reason"].endswith("; nothing removed")
    assert (record["state"], record["reason"]) == ("skipped", f"{removal['reason']} (removal 1)")
    assert failed == 1


async def test_a_group_read_that_fails_for_a_while_is_tried_again_and_the_removal_made(
    tmp_path: Path,
) -> None:
    members = endpoints("orders", "a", "b", "c")
    async with harness(tmp_path, rules(failures=1)) as h:
        await put_group(h.control, "orders", members)
        # More than the client's own retries of one read: the remover defers, then reads again.
        await h.fault(kind="status", status=503, times=6, paths=["/v2/topics/orders"])
        await fail(h, dead_letter("orders", members[2]))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        assert await group_endpoints(h.control, "orders") == members[:2]
        reads = topic_calls(await h.journal(), "GET")
    assert removal["state"] == "removed"
    assert [call["status"] for call in reads] == [503] * 6 + [200]
    assert [call["status"] for call in removal["calls"]] == [503] * 6 + [200, 200]


async def test_a_dlq_id_counts_once_even_when_redriven(tmp_path: Path) -> None:
    members = endpoints("orders", "a", "b")
    async with harness(tmp_path, rules(failures=2)) as h:
        await put_group(h.control, "orders", members)
        [dlq_id] = await fail(h, dead_letter("orders", members[1]))
        answer = await h.recoveryd.admin.post("/api/v1/redrive", json={"states": ["done"]})
        assert answer.json()["dlqIds"] == [dlq_id]

        async def counted_again() -> bool:
            return "already counted" in ((await h.record(dlq_id))["reason"] or "")

        await eventually(counted_again)
        assert await removals(h.recoveryd.admin) == []
        record = await h.record(dlq_id)
    assert record["state"] == "done"
    assert record["reason"] == (
        "already counted as a failure of endpoint b of URL Group orders (a dlqId counts once)"
    )


async def test_a_message_not_sent_through_a_url_group_is_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    text = rules(failures=1).replace("topicName: {exists: true}", "url: {exists: true}")
    async with harness(tmp_path, text) as h:
        [dlq_id] = await fail(h, {"url": "https://lone.example.com/hook", "responseStatus": 410})
        record = await h.record(dlq_id)
        assert await removals(h.recoveryd.admin) == []
    assert record["state"] == "skipped"
    assert record["reason"] == (
        "remove-endpoint applies to messages sent to a URL Group, and this one has no topicName"
    )


async def test_removals_are_listed_by_group(tmp_path: Path) -> None:
    members = endpoints("orders", "a", "b")
    async with harness(tmp_path, rules(failures=1)) as h:
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[1]))
        await finished_removals(h.recoveryd.admin, 1)
        admin: httpx.AsyncClient = h.recoveryd.admin
        mine = (await admin.get("/api/v1/removals", params={"group": "orders"})).json()
        other = (await admin.get("/api/v1/removals", params={"group": "other"})).json()
    assert [removal["urlGroup"] for removal in mine["removals"]] == ["orders"]
    assert other == {"removals": []}
