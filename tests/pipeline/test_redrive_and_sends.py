"""What a dlqId's record counts as a send, re-sent batches under their rule's policy, and
redrive: final dlqIds put back into the pipeline from the admin API and the command."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from tests.pipeline.support import dlq_ids_of, harness
from tests.processes import environ
from tests.support import callback_json, workflows

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
    the dlqIds go out again; the record shows both batches and what each call answered."""
    async with harness(tmp_path, SMALL_BATCHES) as h:
        [dlq_id] = await h.seed(workflows(1))
        await h.fault(kind="rate_limit", times=4, retryAfter=0.01, paths=["/v2/workflows/"])
        await h.send_callbacks([dlq_id])

        assert await h.settled(1) == {"done": 1}

        record = await h.record(dlq_id)
        assert record["sends"] == 1
        refused, sent = record["batches"]
        assert refused["reason"].startswith("the service refused the call")
        assert {call["status"] for call in refused["calls"]} == {429}
        assert [call["status"] for call in sent["calls"]] == [200]


async def test_resent_batches_keep_the_rules_max_size(tmp_path: Path) -> None:
    """A call of unknown outcome is checked and its dlqIds go out again, still at most
    the rule's maxSize to a call."""
    async with harness(tmp_path, SMALL_BATCHES) as h:
        dlq_ids = await h.seed(workflows(12))
        await h.fault(kind="status", status=503, times=12, paths=["/v2/workflows/"])
        await h.send_callbacks(dlq_ids)

        assert await h.settled(12) == {"done": 12}

        calls = await h.bulk_calls()
        assert max(len(dlq_ids_of(call)) for call in calls) == 5
        assert sum(call["status"] == 503 for call in calls) == 12


async def test_a_redrive_sends_failed_dlq_ids_through_again(tmp_path: Path) -> None:
    """Failed by a 400 on the fetch; once the cause is gone a redrive (listed first with
    dryRun) fetches and recovers them; a bad filter is a 400 naming the field."""
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

        redriven = await admin.post("/api/v1/redrive", json={"state": "failed", "since": "1h"})
        assert redriven.json()["count"] == 3
        assert await h.settled(3) == {"done": 3}
        record = await h.record(dlq_ids[0])
        assert "redriven" in [event["state"] for event in record["history"]]


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
    env = environ(tmp_path, ADMIN_LISTEN="127.0.0.1:0")

    def redrive(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "daemon", "redrive", *args],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout

    preview = redrive("--state", "failed")
    assert preview.splitlines() == [*sorted(dlq_ids), "would redrive 3 dlqId(s) in state "
                                    "failed; run again with --yes to do it"]  # fmt: skip
    assert "redriven: 3 dlqId(s)" in redrive("--yes", "--since", "1h")
    assert "would redrive 0" in redrive()
