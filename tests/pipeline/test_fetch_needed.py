"""RECOVERYD_FETCH=needed: a signed callback that tells every field the rules read is
decided without a GET; one that lacks a field, or came unsigned, is read from the DLQ
as with `always`. Real deliveries fail in the emulator, which dead-letters them and
sends its own signed callbacks; the emulator's journal tells which dlqIds were read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.http.serving import serve_in_thread
from tests.emulator.support import Sink
from tests.pipeline.support import Harness, assert_recovered_once, harness
from tests.support import TOKEN, callback_json, workflows

GET = "/v2/dlq/"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
RESUME_BY_STATUS = """\
version: 1
rules:
  - name: resume-503s
    match: {responseStatus: 503, workflow: true}
    action: resume
    batch: {maxSize: 10, maxWait: 200ms}
  - name: the-rest
    match: {}
    action: ignore
"""


async def reads(h: Harness) -> list[str]:
    """The dlqIds read with GET /v2/dlq/{dlqId}, in order."""
    return [
        call["path"].removeprefix(GET)
        for call in await h.journal()
        if call["method"] == "GET" and call["path"].startswith(GET)
    ]


async def fail_workflows(h: Harness, app_url: str, count: int) -> None:
    """`count` workflow runs whose step answers 503: dead-lettered at once, each with the
    emulator's signed failure callback to recoveryd."""
    callbacks = f"{h.recoveryd.public.base_url}/callbacks"
    for number in range(count):
        answer = await h.control.post(
            "/_emulator/publish",
            json={"url": f"{app_url}/wf", "workflowRunId": f"wfr_{number}", "maxRetries": 0,
                  "body": json.dumps({"order": number}), "failureCallback": callbacks},
        )  # fmt: skip
        answer.raise_for_status()


async def test_signed_callbacks_are_decided_and_recovered_without_a_read(
    tmp_path: Path, store: dict[str, str]
) -> None:
    """On both stores: each keeps whether a callback's signature verified, and hands the
    signed bytes to the worker that claims it."""
    app = Sink(statuses={"/wf": 503})
    with serve_in_thread(app) as app_url:
        # PUBLIC_URL unset: the callbacks are signed for the daemon's loopback address.
        async with harness(tmp_path, RESUME_BY_STATUS, FETCH="needed", PUBLIC_URL="", **store) as h:
            await fail_workflows(h, app_url, 25)
            assert await h.settled(25) == {"done": 25}
            dlq_ids = [run["sourceDlqId"] for run in await h.runs()]
            record = await h.record(dlq_ids[0])
            from_callback = h.recoveryd.metric("recoveryd_decided_from_total", source="callback")
            assert_recovered_once(await h.journal(), await h.runs(), dlq_ids)
            assert await reads(h) == []

    assert len(set(dlq_ids)) == 25
    assert from_callback == 25
    assert record["rule"] == "resume-503s"
    assert record["calls"] == []  # no read of the DLQ message
    assert record["workflowRunId"].startswith("wfr_")


@pytest.mark.parametrize(
    ("match", "why"),
    [
        ({"failureCallback": {"prefix": "https://elsewhere"}}, "a field no callback carries"),
        ({"queueName": {"exists": True}}, "a field this callback has no key for"),
    ],
)
async def test_a_callback_that_lacks_a_field_the_rules_read_is_read_from_the_dlq(
    tmp_path: Path, match: dict[str, object], why: str
) -> None:
    rules = (
        "version: 1\nrules:\n  - name: first\n"
        f"    match: {json.dumps(match)}\n    action: ignore\n"
        "  - name: resume-503s\n    match: {responseStatus: 503, workflow: true}\n"
        "    action: resume\n    batch: {maxWait: 100ms}\n"
    )
    app = Sink(statuses={"/wf": 503})
    with serve_in_thread(app) as app_url:
        async with harness(tmp_path, rules, FETCH="needed", PUBLIC_URL="") as h:
            await fail_workflows(h, app_url, 3)
            assert await h.settled(3) == {"done": 3}, why
            dlq_ids = [run["sourceDlqId"] for run in await h.runs()]
            assert sorted(await reads(h)) == sorted(dlq_ids), why
            from_message = h.recoveryd.metric("recoveryd_decided_from_total", source="message")
    assert from_message == 3


async def test_a_callback_without_the_body_a_recovery_reads_is_read_from_the_dlq(
    tmp_path: Path,
) -> None:
    """A resume's record keeps the message body's fingerprint (store/sqlite_lineage): a
    callback with no `sourceBody` cannot give it, so the DLQ message is read."""
    async with harness(tmp_path, RESUME_BY_STATUS, FETCH="needed") as h:
        [whole, bodiless] = await h.seed(workflows(2, responseStatus=503))
        body = json.loads(callback_json(bodiless, "failure-callback-workflow.json", status=503))
        del body["sourceBody"]
        assert (await h.recoveryd.post(json.dumps(body).encode())).status_code == 200
        sent = callback_json(whole, "failure-callback-workflow.json", status=503)
        assert (await h.recoveryd.post(sent)).status_code == 200
        assert await h.settled(2) == {"done": 2}
        assert await reads(h) == [bodiless]


async def test_an_unsigned_callback_is_read_from_the_dlq(tmp_path: Path) -> None:
    """Taken unsigned (RECOVERYD_ALLOW_UNSIGNED), its fields are anyone's word."""
    async with harness(tmp_path, RESUME_BY_STATUS, FETCH="needed", ALLOW_UNSIGNED="true") as h:
        [signed, unsigned] = await h.seed(workflows(2, responseStatus=503))
        for dlq_id, headers in ((signed, None), (unsigned, {"Content-Type": "application/json"})):
            body = callback_json(dlq_id, "failure-callback-workflow.json", status=503)
            assert (await h.recoveryd.post(body, headers)).status_code == 200
        assert await h.settled(2) == {"done": 2}
        assert await reads(h) == [unsigned]


async def test_a_bulk_call_that_recovers_none_of_its_dlq_ids_ends_them_gone(
    tmp_path: Path, store: dict[str, str]
) -> None:
    """Decided from their callbacks, but deleted from the DLQ before the call: the
    service passes them over and lists no run, which says they were not there."""
    async with harness(tmp_path, RESUME_BY_STATUS, FETCH="needed", **store) as h:
        dlq_ids = await h.seed(workflows(3, responseStatus=503))
        for dlq_id in dlq_ids:  # as a person at the console would
            deleted = await h.control.delete(f"/v2/dlq/{dlq_id}", headers=BEARER)
            deleted.raise_for_status()
        for dlq_id in dlq_ids:
            body = callback_json(dlq_id, "failure-callback-workflow.json", status=503)
            assert (await h.recoveryd.post(body)).status_code == 200
        assert await h.settled(3) == {"gone": 3}
        record = await h.record(dlq_ids[0])
        assert await reads(h) == []
    assert "not in the DLQ when the bulk call named it" in record["reason"]


async def test_a_decision_from_the_callback_keeps_its_facts(tmp_path: Path) -> None:
    """What the callback told, kept for replay as a decision from the message is."""
    app = Sink(statuses={"/wf": 503})
    with serve_in_thread(app) as app_url:
        async with harness(tmp_path, RESUME_BY_STATUS, FETCH="needed", PUBLIC_URL="") as h:
            await fail_workflows(h, app_url, 3)
            assert await h.settled(3) == {"done": 3}
            rows = await h.recoveryd.daemon.store.replay_rows(None, None, 10)
            assert await reads(h) == []

    assert [row.rule for row in rows] == ["resume-503s"] * 3
    kept = [json.loads(row.facts) for row in rows]
    assert {facts["responseStatus"] for facts in kept} == {503}
    assert all(facts["workflow"] and facts["dlqId"] == row.dlq_id
               for facts, row in zip(kept, rows, strict=True))  # fmt: skip
