"""A rule's budget follows the workflow through the whole real loop: delivery, failure,
dead letter, signed callback, resume with a new run id, failure again... No run id is
seeded by hand: the emulator makes every one, as the service does."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from daemon.http.serving import serve_in_thread
from tests.emulator.support import Sink
from tests.pipeline.support import Harness, dlq_ids_of, harness

RESUME_TWICE = """\
version: 1
rules:
  - name: resume-twice
    match: {workflow: true}
    action: resume
    overrides: {retries: 0}
    budget: {maxRecoveries: 2, within: 24h}
    batch: {maxWait: 300ms}
"""


def origins(runs: list[dict[str, Any]], first_run_ids: set[str]) -> Counter[str]:
    """How many runs recovery made from each first run, following each run back through
    the runs it was made from."""
    made_from = {run["workflowRunId"]: run["previousWorkflowRunId"] for run in runs}
    counted: Counter[str] = Counter()
    for run in runs:
        origin = run["workflowRunId"]
        while origin not in first_run_ids:
            origin = made_from[origin]
        counted[origin] += 1
    return counted


async def publish_failing_workflows(h: Harness, app_url: str, count: int) -> set[str]:
    callbacks = f"{h.recoveryd.public.base_url}/callbacks"
    run_ids = {f"wfr_first_{n}" for n in range(count)}
    for run_id in sorted(run_ids):
        answer = await h.control.post(
            "/_emulator/publish",
            json={"url": f"{app_url}/wf", "workflowRunId": run_id, "maxRetries": 0,
                  "body": f'{{"order": "{run_id}"}}', "failureCallback": callbacks},
        )  # fmt: skip
        answer.raise_for_status()
    return run_ids


@pytest.mark.parametrize("fetch", ["always", "needed"])
async def test_a_workflow_that_always_fails_is_recovered_max_recoveries_times(
    tmp_path: Path, fetch: str
) -> None:
    """Three workflows whose step always answers 500, failing together so that their
    dlqIds share batches: each is resumed exactly twice (each time under a new run id),
    then its third failure is skipped with the budget's reason. Decided from the signed
    callbacks alone (RECOVERYD_FETCH=needed), the same, with no read of the DLQ."""
    app = Sink(statuses={"/wf": 500})
    with serve_in_thread(app) as app_url:
        # PUBLIC_URL unset: the callbacks are signed for the daemon's loopback address.
        emulator = {"execute_runs": True}
        async with harness(
            tmp_path, RESUME_TWICE, emulator=emulator, PUBLIC_URL="", FETCH=fetch
        ) as h:
            first = await publish_failing_workflows(h, app_url, 3)
            assert await h.settled(9, seconds=60) == {"done": 6, "skipped": 3}
            await h.control.post("/_emulator/idle")
            await asyncio.sleep(0.5)  # time for a recovery past the budget to show up
            runs = (await h.control.get("/_emulator/runs")).json()
            skipped = [
                record
                for entry in (await h.control.get("/_emulator/dlq")).json()
                if (record := await h.record(entry["dlqId"]))["state"] == "skipped"
            ]
            shared = [call for call in await h.bulk_calls() if len(dlq_ids_of(call)) > 1]
            stops = h.recoveryd.metric("recoveryd_budget_exhausted_total", rule="resume-twice")
            reads = [call for call in await h.journal() if call["path"].startswith("/v2/dlq/")]
            page = (await h.recoveryd.admin.get(f"/ui/failures/{skipped[0]['dlqId']}")).text

    assert shared, "no batch held dlqIds of several workflows: the lines were never mixed"
    assert origins(runs, first) == Counter(dict.fromkeys(first, 2))
    assert len(skipped) == 3
    assert all("already recovered 2 times" in record["reason"] for record in skipped)
    assert stops == 3
    assert len(app.at("/wf")) == 9  # three first deliveries and six recovered runs
    assert len(reads) == (9 if fetch == "always" else 0)
    # The console shows the skipped failure's line: the two recoveries, then itself.
    line = page.split('<table id="lineage">')[1].split("</table>")[0]
    assert [
        row.split("</td><td>")[-1] for row in re.findall(r"<tr[^>]*><td>(.*?)</td></tr>", line)
    ] == ["skipped", "done", "done"]


async def test_a_run_id_seen_again_counts_against_the_same_budget(tmp_path: Path) -> None:
    """A failure whose run id was seen before (the service delivering the same run's DLQ
    message twice, say) belongs to that run's line."""
    rules = RESUME_TWICE.replace("maxWait: 300ms", "maxWait: 100ms")
    async with harness(tmp_path, rules) as h:
        dlq_ids = []
        for _ in range(3):  # one at a time, so that the order is known
            [dlq_id] = await h.seed([{"url": "https://app.example.com/wf",
                                      "workflowRunId": "wfr_again"}])  # fmt: skip
            await h.send_callbacks([dlq_id])
            await h.settled(len(dlq_ids) + 1)
            dlq_ids.append(dlq_id)

        states = [(await h.record(dlq_id))["state"] for dlq_id in dlq_ids]
    assert states == ["done", "done", "skipped"]
