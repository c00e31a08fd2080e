"""What a dlqId's record counts as a send, re-sent batches under their rule's policy, and
redrive: final dlqIds put back into the pipeline from the admin API and the command."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import httpx

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from daemon.store import Callback
from daemon.store.records import Outcome
from daemon.store.sqlite import SQLiteStore
from tests.pipeline.support import BULK_PATHS, dlq_ids_of, harness
from tests.processes import environ
from tests.support import (
    FAST_BREAKER,
    callback_json,
    emulator_config,
    running_recoveryd,
    workflows,
)

SMALL_BATCHES = """\
version: 1
rules:
  - name: resume-in-fives
    match: {workflow: true}
    action: resume
    batch: {maxSize: 5, maxWait: 100ms}
"""


async def test_a_refused_bulk_call_is_not_counted_as_a_send(tmp_path: Path) -> None:
    """Every attempt answered 429: the service did nothing, the call is not a send, and
    the same batch's call is made again later; the record shows what each call answered."""
    async with harness(tmp_path, SMALL_BATCHES) as h:
        [dlq_id] = await h.seed(workflows(1))
        await h.fault(kind="rate_limit", times=4, retryAfter=0.01, paths=["/v2/workflows/"])
        await h.send_callbacks([dlq_id])

        assert await h.settled(1) == {"done": 1}

        record = await h.record(dlq_id)
        assert record["sends"] == 1
        [batch] = record["batches"]
        assert [call["status"] for call in batch["calls"]] == [429] * 4 + [200]


async def test_a_call_that_may_have_acted_is_checked_and_counts_as_a_send(
    tmp_path: Path,
) -> None:
    """A 503 (the service may have acted): the client does not send it again, its
    dlqIds are looked up before they go out again, and it counts as a send; the next
    call, refused by 429s, is made again until it goes through, and counts once."""
    async with harness(tmp_path, SMALL_BATCHES) as h:
        [dlq_id] = await h.seed(workflows(1))
        await h.fault(kind="status", status=503, times=1, paths=["/v2/workflows/"])
        await h.fault(kind="rate_limit", times=3, retryAfter=0.01, paths=["/v2/workflows/"])
        await h.send_callbacks([dlq_id])

        assert await h.settled(1) == {"done": 1}

        record = await h.record(dlq_id)
        assert record["sends"] == 2
        checked, sent = record["batches"]
        assert checked["reason"].startswith("the call failed")
        assert [call["status"] for call in checked["calls"]] == [503]
        assert [call["status"] for call in sent["calls"]] == [429, 429, 429, 200]
        gets = [call for call in await h.journal() if call["path"] == f"/v2/dlq/{dlq_id}"]
        assert len(gets) == 2  # the fetch, and the check


async def test_a_batch_left_unsent_by_a_crash_keeps_its_rules_max_size(tmp_path: Path) -> None:
    """A start finds a batch of 15 persisted but never sent (a crash before its call):
    its dlqIds go back to their queue and out in calls of the rule's maxSize, 5."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(SMALL_BATCHES)
    with serve_in_thread(create_app(emulator_config(execute_runs=False))) as service_url:
        async with httpx.AsyncClient(base_url=service_url, timeout=30) as control:
            seeded = await control.post("/_emulator/dlq", json={"messages": workflows(15)})
            dlq_ids: list[str] = seeded.json()["dlqIds"]
            await left_in_an_unsent_batch(tmp_path / "recoveryd.db", dlq_ids, "resume-in-fives")

            async with running_recoveryd(tmp_path, SERVICE_URL=service_url, RULES=str(rules)) as d:
                async with asyncio.timeout(30):
                    while True:
                        if (await d.admin.get("/api/v1/status")).json()["states"]["done"] == 15:
                            break
                        await asyncio.sleep(0.1)
            journal = (await control.get("/_emulator/journal")).json()
    calls = [call for call in journal if call["path"] in BULK_PATHS]
    assert sorted(len(dlq_ids_of(call)) for call in calls) == [5, 5, 5]


async def left_in_an_unsent_batch(path: Path, dlq_ids: list[str], rule: str) -> None:
    """The store as a daemon killed right after persisting a batch of `dlq_ids` leaves it."""
    async with SQLiteStore.open(path) as store:
        now = time.time()
        for dlq_id in dlq_ids:
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            await store.add_callback(Callback(dlq_id, body, now))
        await store.claim("crashed", len(dlq_ids), 60.0, now)
        decided = [Outcome(dlq_id, "decided", rule=rule, action="resume", overrides="{}")
                   for dlq_id in dlq_ids]  # fmt: skip
        await store.settle("crashed", decided, now)
        assert await store.open_batch("resume", "{}", dlq_ids, now) is not None


async def test_resent_batches_keep_the_rules_max_size(tmp_path: Path) -> None:
    """A call of unknown outcome is checked and its dlqIds go out again, still at most
    the rule's maxSize to a call."""
    # Once the 503s open the circuit, a probe every 0.4 s at most, not every 2 s: the
    # point is the resent batches' size, not the breaker's wait.
    breaker = dataclasses.replace(FAST_BREAKER, max_open=0.4)
    async with harness(tmp_path, SMALL_BATCHES, breaker=breaker) as h:
        dlq_ids = await h.seed(workflows(12))
        await h.fault(kind="status", status=503, times=12, paths=["/v2/workflows/"])
        await h.send_callbacks(dlq_ids)

        assert await h.settled(12) == {"done": 12}

        calls = await h.bulk_calls()
        assert max(len(dlq_ids_of(call)) for call in calls) == 5
        assert sum(call["status"] == 503 for call in calls) == 12


async def test_a_redrive_sends_failed_dlq_ids_through_again(tmp_path: Path) -> None:
    """Failed by a 400 on the fetch; once the cause is gone a redrive (listed first with
    dryRun) fetches and recovers them; a bad filter is a 400 naming the field. The
    failures stay counted: the redrive empties the failed state, not the counter the
    alert reads."""
    async with harness(tmp_path, SMALL_BATCHES) as h:
        dlq_ids = await h.seed(workflows(3))
        await h.fault(kind="status", status=400, times=15, paths=["/v2/dlq/"])
        await h.send_callbacks(dlq_ids)
        assert await h.settled(3) == {"failed": 3}

        admin = h.recoveryd.admin
        listed = await admin.post("/api/v1/redrive", json={"states": ["failed"], "dryRun": True})
        assert listed.json() == {"status": "dry-run", "count": 3, "dlqIds": sorted(dlq_ids)}
        assert (await h.status())["states"]["failed"] == 3

        bad = await admin.post("/api/v1/redrive", json={"states": ["received"]})
        assert bad.status_code == 400
        assert bad.json()["field"] == "states"

        listed = await admin.post("/api/v1/redrive", json={"state": ["failed"], "dryRun": True})
        assert listed.json()["count"] == 3
        redriven = await admin.post("/api/v1/redrive", json={"state": "failed", "since": "1h"})
        assert redriven.json()["count"] == 3
        assert await h.settled(3) == {"done": 3}
        record = await h.record(dlq_ids[0])
        assert "redriven" in [event["state"] for event in record["history"]]
        scraped = (await admin.get("/metrics")).text
        assert 'recoveryd_dlq_ids{state="failed"} 0.0' in scraped
        failed = {"rule": "", "reason": "fetch_refused"}
        assert h.recoveryd.metric("recoveryd_dlq_ids_failed_total", **failed) == 3


async def test_a_dlq_id_with_a_slash_has_a_record(tmp_path: Path) -> None:
    """The service does not forbid `/` in a dlqId: its record is served, %2F-encoded."""
    async with harness(tmp_path, SMALL_BATCHES) as h:
        body = callback_json("has/slash", "failure-callback-workflow.json")
        assert (await h.recoveryd.post(body)).status_code == 200
        await h.settled(1)

        found = await h.recoveryd.admin.get("/api/v1/dlq/has%2Fslash")

        assert found.status_code == 200
        assert found.json()["dlqId"] == "has/slash"


def test_the_redrive_command_prints_first_and_acts_with_yes(tmp_path: Path) -> None:
    """With no daemon running, `recoveryd redrive` lists what it would do, and with --yes
    puts the dlqIds back to `received` in the store (the next start picks them up)."""

    async def fail_three() -> list[str]:
        async with harness(tmp_path, SMALL_BATCHES) as h:
            dlq_ids = await h.seed(workflows(3))
            await h.fault(kind="status", status=400, times=15, paths=["/v2/dlq/"])
            await h.send_callbacks(dlq_ids)
            assert await h.settled(3) == {"failed": 3}
            return dlq_ids

    dlq_ids = asyncio.run(fail_three())
    # Neither a token nor a signing key: the command calls no service and checks no callback.
    unset = {"TOKEN": "", "SIGNING_KEY_CURRENT": "", "SIGNING_KEY_NEXT": ""}
    env = environ(tmp_path, ADMIN_LISTEN="127.0.0.1:0", **unset)

    def redrive(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "daemon", "redrive", *args],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout

    preview = redrive("--state", "failed")
    assert preview.splitlines() == [*sorted(dlq_ids), "would redrive 3 dlqIds in state "
                                    "failed; run again with --yes to do it"]  # fmt: skip
    assert "redriven: 3 dlqIds" in redrive("--yes", "--since", "1h")
    assert "would redrive 0" in redrive()
