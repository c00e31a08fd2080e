"""The notify action end to end: recoveryd and the emulator on loopback, and a real
webhook receiver that answers as each test scripts it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

from daemon.notify.summary import idempotency_key
from tests.notify.support import FAST_NOTIFY, Receiver, notify_rule, receiving
from tests.pipeline.support import Harness, assert_recovered_once, harness
from tests.support import FAST_TUNING, eventually, workflows

TUNING = dataclasses.replace(FAST_TUNING, notify=FAST_NOTIFY)
CLOSED_PORT = "http://127.0.0.1:9/hook"  # refused at once


def rules_of(*rules: str) -> str:
    return "version: 1\nrules:\n" + "".join(rules)


RESUME_ALL = """\
  - name: resume-all
    match: {workflow: true}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
"""


async def notifications(h: Harness, dlq_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await h.record(dlq_id))["notifications"]
    return found


async def all_in(h: Harness, dlq_ids: list[str], state: str) -> bool:
    for dlq_id in dlq_ids:
        listed = await notifications(h, dlq_id)
        if not listed or any(item["state"] != state for item in listed):
            return False
    return True


async def test_a_notification_arrives_once_though_the_receiver_answers_500_at_first(
    tmp_path: Path,
) -> None:
    """Two 500s, then 200: each dlqId's summary is delivered once, every attempt carrying
    the same Idempotency-Key, and the record shows it sent after three attempts."""
    receiver = Receiver(failures=2)
    with receiving(receiver) as url:
        rules = rules_of(notify_rule("page", url))
        async with harness(tmp_path, rules, tuning=TUNING) as h:
            dlq_ids = await h.seed(workflows(5, responseStatus=422))
            await h.send_callbacks(dlq_ids)
            await eventually(lambda: all_in(h, dlq_ids, "sent"))
            records = {dlq_id: await h.record(dlq_id) for dlq_id in dlq_ids}
            sent = h.recoveryd.metric("recoveryd_notifications_total", rule="page", result="sent")
            retried = h.recoveryd.metric(
                "recoveryd_notifications_total", rule="page", result="retried"
            )

    assert receiver.answered_ok() == Counter(
        {idempotency_key(dlq_id, "page"): 1 for dlq_id in dlq_ids}
    )
    for dlq_id, record in records.items():
        assert receiver.keys_of(dlq_id) == {idempotency_key(dlq_id, "page")}
        assert receiver.attempts_of(dlq_id) == [500, 500, 200]
        assert record["state"] == "done"
        assert record["reason"] == f"rule page notified {url.removesuffix('/hook')}"
        [notification] = record["notifications"]
        assert notification["state"] == "sent"
        assert notification["attempts"] == 3
        assert notification["lastStatus"] == 200
        assert notification["idempotencyKey"] == idempotency_key(dlq_id, "page")
        assert notification["receiver"] == url.removesuffix("/hook")
        assert notification["nextAt"] is None
    assert (sent, retried) == (5, 10)


async def test_the_summary_is_small_and_carries_no_header_body_or_query(
    tmp_path: Path,
) -> None:
    """What the receiver gets: the dlqId, the rules' decision, the message's identifying
    fields (its url without the query); never its headers or bodies."""
    receiver = Receiver()
    message = {
        "url": "https://api.example.com/wf?apiKey=secret-in-query",
        "workflowRunId": "wfr_summary",
        "callerIP": "203.0.113.7",
        "responseStatus": 422,
        "labels": ["billing"],
        "body": "the user's data",
        "responseBody": "the endpoint's answer",
        "header": {"Authorization": ["Bearer secret-forwarded"]},
        "topicName": "orders",
    }
    with receiving(receiver) as url:
        rules = rules_of(notify_rule("page", url))
        async with harness(tmp_path, rules, tuning=TUNING) as h:
            [dlq_id] = await h.seed([message])
            await h.send_callbacks([dlq_id])
            await eventually(lambda: all_in(h, [dlq_id], "sent"))
            decided_at = (await h.record(dlq_id))["decidedAt"]

    [delivery] = receiver.deliveries
    assert delivery.headers["content-type"] == "application/json"
    assert delivery.headers["user-agent"].startswith("recoveryd/")
    body = delivery.body
    assert body["event"] == "dead_letter"
    assert body["id"] == delivery.key == idempotency_key(dlq_id, "page")
    assert body["dlqId"] == dlq_id
    assert body["rule"] == "page"
    assert body["decision"] == {"rule": "page", "action": "notify", "matchedRules": ["page"]}
    assert decided_at - 5 < body["decidedAt"] <= decided_at  # decided, then recorded
    assert body["recoveryd"]["version"]
    shown = body["message"]
    assert shown["url"] == "https://api.example.com/wf"
    assert shown["workflowRunId"] == "wfr_summary"
    assert shown["responseStatus"] == 422
    assert shown["labels"] == ["billing"]
    assert shown["topicName"] == "orders"
    assert shown["workflow"] is True
    text = str(body)
    for secret in ("secret-in-query", "secret-forwarded", "the user's data", "endpoint's answer"):
        assert secret not in text
    assert len(str(body)) < 2000


async def test_a_continue_notify_rule_notifies_and_the_next_rule_still_decides(
    tmp_path: Path,
) -> None:
    """`continue: true`: the summary goes out and the workflow is resumed all the same;
    the summary names the deciding rule, the record's history the notification."""
    receiver = Receiver()
    with receiving(receiver) as url:
        rules = rules_of(notify_rule("page", url, more="    continue: true\n"), RESUME_ALL)
        async with harness(tmp_path, rules, tuning=TUNING) as h:
            dlq_ids = await h.seed(workflows(3))
            await h.send_callbacks(dlq_ids)
            assert await h.settled(3) == {"done": 3}
            await eventually(lambda: all_in(h, dlq_ids, "sent"))
            records = [await h.record(dlq_id) for dlq_id in dlq_ids]
            assert_recovered_once(await h.journal(), await h.runs(), dlq_ids)

    assert receiver.answered_ok() == Counter(
        {idempotency_key(dlq_id, "page"): 1 for dlq_id in dlq_ids}
    )
    for delivery in receiver.deliveries:
        assert delivery.body["decision"] == {
            "rule": "resume-all",
            "action": "resume",
            "matchedRules": ["page", "resume-all"],
        }
    for record in records:
        assert (record["rule"], record["action"]) == ("resume-all", "resume")
        assert record["reason"] is None  # the batch's: done, nothing to explain
        events = [(event["state"], event.get("rule")) for event in record["history"]]
        assert ("notified", "page") in events


async def test_receivers_that_are_down_or_hang_delay_neither_recoveries_nor_others(
    tmp_path: Path,
) -> None:
    """One receiver refuses connections, one holds every request (longer than the whole
    test), one answers: the resumes all go out as if there were no notifications, and
    the answering receiver gets every summary meanwhile."""
    hanging, answering = Receiver(), Receiver()
    hanging.holding.set()
    slow_timeout = dataclasses.replace(FAST_NOTIFY, timeout=60.0)
    with receiving(hanging) as hang_url, receiving(answering) as ok_url:
        rules = rules_of(
            notify_rule("page-dead", CLOSED_PORT, more="    continue: true\n"),
            notify_rule("page-hang", hang_url, more="    continue: true\n"),
            notify_rule("page-ok", ok_url, more="    continue: true\n"),
            RESUME_ALL,
        )
        tuning = dataclasses.replace(TUNING, notify=slow_timeout)
        async with harness(tmp_path, rules, tuning=tuning) as h:
            dlq_ids = await h.seed(workflows(30))
            started = time.monotonic()
            await h.send_callbacks(dlq_ids)
            assert await h.settled(30, seconds=10) == {"done": 30}
            await eventually(lambda: len(answering.answered_ok()) == 30, seconds=10)
            took = time.monotonic() - started
            assert_recovered_once(await h.journal(), await h.runs(), dlq_ids)
            [dead, hang, ok] = await notifications(h, dlq_ids[0])
            assert hanging.held() >= 1  # its requests are out, and held

    assert took < 10  # a batch waits 100 ms; a hanging receiver would have cost 60 s
    assert (dead["rule"], dead["state"]) == ("page-dead", "pending")
    assert dead["reason"] == "could not connect"
    assert (hang["rule"], hang["state"]) == ("page-hang", "pending")
    assert (ok["rule"], ok["state"]) == ("page-ok", "sent")


async def test_a_receiver_that_keeps_failing_ends_failed_and_a_redrive_sends_again(
    tmp_path: Path,
) -> None:
    """Always 500: after its attempts the notification is `failed` with the reason, and so
    is the dlqId its notify rule decided. A redrive queues it again; the receiver, back,
    gets it with the same Idempotency-Key."""
    receiver = Receiver(failures=1000)
    with receiving(receiver) as url:
        rules = rules_of(notify_rule("page", url))
        async with harness(tmp_path, rules, tuning=TUNING) as h:
            [dlq_id] = await h.seed(workflows(1))
            await h.send_callbacks([dlq_id])
            await eventually(lambda: all_in(h, [dlq_id], "failed"))
            failed = await h.record(dlq_id)
            metric = h.recoveryd.metric(
                "recoveryd_notifications_total", rule="page", result="failed"
            )

            receiver.failures = 0
            answer = await h.recoveryd.admin.post("/api/v1/redrive", json={"states": ["failed"]})
            assert answer.json()["dlqIds"] == [dlq_id]
            await eventually(lambda: all_in(h, [dlq_id], "sent"))
            again = await h.record(dlq_id)
            counted = h.recoveryd.metric(
                "recoveryd_dlq_ids_failed_total", rule="page", reason="notify_failed"
            )

    assert failed["state"] == "failed"
    assert failed["reason"].startswith(f"rule page could not notify {url.removesuffix('/hook')}")
    [notification] = failed["notifications"]
    assert notification["attempts"] == FAST_NOTIFY.max_attempts
    assert notification["reason"].startswith(f"gave up after {FAST_NOTIFY.max_attempts} attempts")
    assert notification["reason"].endswith("the last answered 500")
    assert metric == 1
    assert receiver.attempts_of(dlq_id) == [500] * FAST_NOTIFY.max_attempts + [200]
    assert receiver.keys_of(dlq_id) == {idempotency_key(dlq_id, "page")}
    assert again["state"] == "done"
    assert again["notifications"][0]["attempts"] == 1
    assert counted == 1  # redriven and done since: still counted


async def test_a_refusal_ends_the_notification_at_once(tmp_path: Path) -> None:
    """A 4xx (here 404, the path is wrong) is not tried again: failed after one attempt."""
    receiver = Receiver()
    with receiving(receiver) as url:
        rules = rules_of(notify_rule("page", url.replace("/hook", "/nowhere")))
        async with harness(tmp_path, rules, tuning=TUNING) as h:
            [dlq_id] = await h.seed(workflows(1))
            await h.send_callbacks([dlq_id])
            await eventually(lambda: all_in(h, [dlq_id], "failed"))
            [notification] = await notifications(h, dlq_id)

    assert notification["attempts"] == 1
    assert notification["lastStatus"] == 404
    assert notification["reason"] == "refused: answered 404"


async def test_a_dry_run_notify_rule_posts_nothing(tmp_path: Path) -> None:
    """The rule's dryRun: recorded as dry-run with what it would do, no request made."""
    receiver = Receiver()
    with receiving(receiver) as url:
        rules = rules_of(notify_rule("page", url, more="    dryRun: true\n"))
        async with harness(tmp_path, rules, tuning=TUNING) as h:
            [dlq_id] = await h.seed(workflows(1))
            await h.send_callbacks([dlq_id])
            assert await h.settled(1) == {"dry-run": 1}
            await asyncio.sleep(0.3)  # several polls of the notifier
            record = await h.record(dlq_id)

    assert receiver.deliveries == []
    assert record["notifications"] == []
    assert record["wouldCall"] == {"action": "notify", "receiver": url.removesuffix("/hook")}
