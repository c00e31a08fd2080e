"""Bulk calls the service carried out whose answer was lost (a proxy's 504, a reset): the
outcome is checked with reads, never assumed, so a service that refuses calls naming
dlqIds gone from its DLQ ends nothing `failed`, and every run id that an answer brought
is in the records."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.pipeline.support import BULK_PATHS, Harness, dlq_ids_of, harness
from tests.support import TOKEN, eventually, workflows

RESTART_ALL = """\
version: 1
rules:
  - name: restart-all
    match: {workflow: true}
    action: restart
    batch: {maxSize: 10, maxWait: 100ms}
"""
RUNS = 150


async def test_lost_answers_with_refused_resends_fail_nothing_and_restart_each_once(
    tmp_path: Path,
) -> None:
    """150 runs, 3 answers lost after the service acted (two 504s, one reset), a service
    that answers 400 to a call naming a dlqId no longer in its DLQ: every dlqId `done`,
    each run restarted once, and the run ids of each answer that arrived recorded."""
    emulator = {"refuse_gone_dlq_ids": True}
    async with harness(tmp_path, RESTART_ALL, emulator=emulator) as h:
        dlq_ids = await h.seed(workflows(RUNS))
        await h.fault(kind="lost_answer", status=504, times=2, paths=list(BULK_PATHS))
        await h.fault(kind="lost_answer", reset=True, times=1, paths=list(BULK_PATHS))
        await h.send_callbacks(dlq_ids)

        assert await h.settled(RUNS, seconds=90) == {"done": RUNS}

        runs = await h.runs()
        assert Counter(run["sourceDlqId"] for run in runs) == Counter(dict.fromkeys(dlq_ids, 1))
        assert {run["mode"] for run in runs} == {"restart"}
        calls = await h.bulk_calls()
        lost = [call for call in calls if call.get("fault") == "lost_answer"]
        assert [call["carriedOut"] for call in lost] == [True] * 3
        answered = {dlq_id for call in calls if call["status"] == 200
                    for dlq_id in dlq_ids_of(call)}  # fmt: skip
        assert answered | {dlq_id for call in lost for dlq_id in dlq_ids_of(call)} == set(dlq_ids)
        run_of = {run["sourceDlqId"]: run["workflowRunId"] for run in runs}
        for dlq_id in answered:
            record = await h.record(dlq_id)
            recorded = {run["workflowRunId"] for batch in record["batches"]
                        for run in batch["workflowRuns"]}  # fmt: skip
            assert run_of[dlq_id] in recorded, record


async def test_a_refusal_for_a_dlq_id_someone_else_took_out_sends_the_rest_again(
    tmp_path: Path,
) -> None:
    """A dlqId deleted from the DLQ after its decision makes the strict service refuse
    its batch's call (400): it ends `gone` (no call of ours recovered it), the other four
    go out again without it, and nothing is `failed`."""
    rules = RESTART_ALL.replace("maxSize: 10, maxWait: 100ms", "maxSize: 5, maxWait: 5s")
    async with harness(tmp_path, rules, emulator={"refuse_gone_dlq_ids": True}) as h:
        dlq_ids = await h.seed(workflows(5))
        await h.send_callbacks(dlq_ids[:4])
        await eventually(lambda: decided(h, 4), what="four dlqIds decided")
        deleted = await h.control.delete(
            f"/v2/dlq/{dlq_ids[0]}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert deleted.status_code == 200
        await h.send_callbacks(dlq_ids[4:])  # the fifth fills the batch

        assert await h.settled(5) == {"done": 4, "gone": 1}

        record = await h.record(dlq_ids[0])
        assert record["state"] == "gone"
        assert "no longer in the DLQ" in record["reason"]
        assert record["sends"] == 0
        calls = await h.bulk_calls()
        assert [(call["status"], len(dlq_ids_of(call))) for call in calls] == [(400, 5), (200, 4)]
        runs = await h.runs()
        assert Counter(run["sourceDlqId"] for run in runs) == Counter(dict.fromkeys(dlq_ids[1:], 1))


async def decided(h: Harness, count: int) -> bool:
    return bool((await h.status())["states"]["decided"] == count)
