"""Upstream trouble: failed fetches and bulk calls end in a final state with the reason,
calls of unknown outcome are checked before anything is sent again, and under 5xx,
timeouts, dropped connections and 429 bursts the call rate stays under the limit."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path

from tests.pipeline.support import BULK_PATHS, RESUME_ALL, Harness, harness, sent_per_dlq_id
from tests.support import FAST_BREAKER, FAST_RETRY, FAST_TUNING, TOKEN, eventually, workflows

FAILED = "recoveryd_dlq_ids_failed_total"


async def failed_count(h: Harness, count: int, **labels: str) -> None:
    """Wait for recoveryd_dlq_ids_failed_total{labels} to reach `count`, and check it
    goes no further than it (counted once per dlqId)."""
    await eventually(lambda: h.recoveryd.metric(FAILED, **labels) >= count, 10, FAILED)
    assert h.recoveryd.metric(FAILED, **labels) == count


async def test_a_message_the_service_refuses_fails_with_the_reason(tmp_path: Path) -> None:
    """A 400 on the fetch is final for the dlqId: `failed` after the fetch tries."""
    async with harness(tmp_path, RESUME_ALL) as h:
        [dlq_id] = await h.seed(workflows(1))
        await h.fault(kind="status", status=400, times=1000, paths=["/v2/dlq/"])
        await h.send_callbacks([dlq_id])

        assert await h.settled(1) == {"failed": 1}

        record = await h.record(dlq_id)
        assert record["reason"].startswith("fetching the DLQ message failed")
        assert record["reason"].endswith("(5 final answers in 5 tries)")
        assert (record["fetchAttempts"], record["fetchRefusals"]) == (5, 5)
        # A 400 is not retried by the client: one call a try, tries spaced by backoff.
        assert [call["status"] for call in record["calls"]] == [400] * 5
        await h.recoveryd.admin.get("/metrics")
        assert h.recoveryd.metric("recoveryd_dlq_ids", state="failed") == 1
        await failed_count(h, 1, rule="", reason="fetch_refused")  # no rule decided it


async def test_after_an_outage_a_message_fails_only_at_its_fifth_final_answer(
    tmp_path: Path,
) -> None:
    """Four reads fail for the service's sake (503s: an outage), then the service refuses
    the message: the first 400 does not end it `failed` on the tries the outage spent.
    Only final answers count, and it fails at the fifth of them."""
    one_attempt = dataclasses.replace(FAST_RETRY, max_attempts=1)  # a read a try
    quick = dataclasses.replace(FAST_TUNING, retry_base=0.01)  # nine tries' backoff
    async with harness(tmp_path, RESUME_ALL, retry=one_attempt, tuning=quick) as h:
        [dlq_id] = await h.seed(workflows(1))
        await h.fault(kind="status", status=503, times=4, paths=["/v2/dlq/"])
        await h.fault(kind="status", status=400, times=5, paths=["/v2/dlq/"])
        await h.send_callbacks([dlq_id])

        assert await h.settled(1) == {"failed": 1}

        record = await h.record(dlq_id)
        assert [call["status"] for call in record["calls"]] == [503] * 4 + [400] * 5
        assert (record["fetchAttempts"], record["fetchRefusals"]) == (9, 5)
        assert record["reason"].endswith("(5 final answers in 9 tries)")


async def test_a_message_the_service_keeps_failing_is_never_failed(tmp_path: Path) -> None:
    """500s on every fetch for well past the fetch tries: the dlqId waits in `received`
    (never `failed`), and is recovered once the service answers again."""
    # A probe every 0.4 s at most once the circuit opens, not every 2 s: the point is
    # how many tries fail, not how long the breaker waits between them.
    breaker = dataclasses.replace(FAST_BREAKER, max_open=0.4)
    async with harness(tmp_path, RESUME_ALL, breaker=breaker) as h:
        [dlq_id] = await h.seed(workflows(1))
        await h.fault(kind="status", status=500, times=100_000, paths=["/v2/dlq/"])
        await h.send_callbacks([dlq_id])
        for _ in range(600):
            if (await h.record(dlq_id))["fetchAttempts"] >= 8:
                break
            await asyncio.sleep(0.05)
        record = await h.record(dlq_id)
        assert record["fetchAttempts"] >= 8  # well past the 5 tries a final answer gets
        assert record["state"] == "received"

        (await h.control.delete("/_emulator/faults")).raise_for_status()

        assert await h.settled(1, seconds=60) == {"done": 1}


async def test_a_bulk_call_the_service_rejects_fails_its_dlq_ids(tmp_path: Path) -> None:
    async with harness(tmp_path, RESUME_ALL) as h:
        dlq_ids = await h.seed(workflows(3))
        # One 400 for each call there may be: callbacks that arrive across a batch's
        # maxWait go out in two or three calls, each of which the service must reject.
        await h.fault(kind="status", status=400, times=3, paths=["/v2/workflows/"])
        await h.send_callbacks(dlq_ids)

        assert await h.settled(3) == {"failed": 3}

        record = await h.record(dlq_ids[0])
        assert record["reason"].startswith("the service rejected the call")
        assert [call["status"] for call in record["batches"][0]["calls"]] == [400]
        await failed_count(h, 3, rule="resume-all", reason="call_rejected")


async def test_a_call_whose_outcome_cannot_be_checked_fails_its_dlq_ids(tmp_path: Path) -> None:
    """Every attempt of the bulk call answered 503 (its outcome unknown), then the reads
    that would check it refused with 400s, round after round: `failed`, and counted as
    check_refused, not as a rejected call."""
    rules = RESUME_ALL.replace("maxSize: 10, maxWait: 100ms", "maxSize: 1, maxWait: 30s")
    async with harness(tmp_path, rules) as h:
        [dlq_id] = await h.seed(workflows(1))
        # Taken in the order armed: the fetch's read answers as usual (a latency of 0),
        # the check's five rounds get a 400 each.
        await h.fault(kind="latency", seconds=0, times=1, paths=["/v2/dlq/"])
        await h.fault(kind="status", status=400, times=5, paths=["/v2/dlq/"])
        await h.fault(kind="status", status=503, times=4, paths=["/v2/workflows/"])
        await h.send_callbacks([dlq_id])

        assert await h.settled(1) == {"failed": 1}

        record = await h.record(dlq_id)
        assert "its outcome cannot be checked" in record["reason"]
        await failed_count(h, 1, rule="resume-all", reason="check_refused")
        assert h.recoveryd.metric(FAILED, rule="resume-all", reason="call_rejected") == 0


async def test_a_bulk_call_of_unknown_outcome_is_checked_before_it_is_sent_again(
    tmp_path: Path,
) -> None:
    """The call answered 503, after which the service may have acted: it is not sent
    again blind. The dlqIds are looked up, found still in the DLQ, and sent once more,
    which succeeds."""
    # One batch of the four, flushed when full: with RESUME_ALL's maxWait of 100ms a slow
    # machine could split them over two calls, and the 503s with them.
    rules = RESUME_ALL.replace("maxSize: 10, maxWait: 100ms", "maxSize: 4, maxWait: 30s")
    async with harness(tmp_path, rules) as h:
        dlq_ids = await h.seed(workflows(4))
        await h.fault(kind="status", status=503, times=1, paths=["/v2/workflows/"])
        await h.send_callbacks(dlq_ids)

        assert await h.settled(4) == {"done": 4}

        journal = await h.journal()
        lookups = Counter(call["path"] for call in journal if call["method"] == "GET")
        assert all(lookups[f"/v2/dlq/{dlq_id}"] == 2 for dlq_id in dlq_ids)  # fetch + check
        assert sent_per_dlq_id(journal) == Counter(dict.fromkeys(dlq_ids, 1))
        record = await h.record(dlq_ids[0])
        assert record["sends"] == 2
        assert [event["state"] for event in record["history"]] == [
            "decided", "batched", "decided", "batched", "done"
        ]  # fmt: skip


async def test_a_timed_out_bulk_call_creates_each_run_once(tmp_path: Path) -> None:
    """The service carries the call out after the client gave up on it: the lookups find
    the entries gone, and no run is made twice."""
    async with harness(tmp_path, RESUME_ALL, http_timeout=0.3) as h:
        dlq_ids = await h.seed(workflows(5))
        await h.fault(kind="latency", seconds=0.6, times=1, paths=["/v2/workflows/"])
        await h.send_callbacks(dlq_ids)

        assert await h.settled(5) == {"done": 5}

        sources = Counter(run["sourceDlqId"] for run in await h.runs())
        assert sources == Counter(dict.fromkeys(dlq_ids, 1))


async def test_dlq_ids_an_earlier_call_recovered_after_its_lookup_end_done(
    tmp_path: Path,
) -> None:
    """A call whose answer was lost is carried out after its lookup found its dlqIds
    still in the DLQ: the call made again finds none of them, and they end `done`
    (recovered once, by the first call), not `gone`."""
    # The three in one batch however slowly a loaded machine decides them: a batch of
    # some would take the 504 alone, and the rest would go out in the held call.
    together = RESUME_ALL.replace("maxSize: 10, maxWait: 100ms", "maxSize: 3, maxWait: 30s")
    async with harness(tmp_path, together) as h:
        dlq_ids = await h.seed(workflows(3))
        # The first call's answer is lost (a 504: it may have acted); the second is held.
        await h.fault(kind="status", status=504, times=1, paths=[BULK_PATHS[0]])
        await h.fault(kind="latency", seconds=2.0, times=1, paths=[BULK_PATHS[0]])
        await h.send_callbacks(dlq_ids)

        async def sent_again() -> bool:
            """Looked up, found in the DLQ, and their second call out (held)."""
            records = [await h.record(dlq_id) for dlq_id in dlq_ids]
            return all(
                r["sends"] == 1 and r["state"] == "batched" and r["batches"][-1]["sentAt"]
                for r in records
            )

        await eventually(sent_again, 10, "the dlqIds looked up and sent again")
        # Meanwhile the service carries the first call out, late, as such a call is.
        late = await h.control.post(
            BULK_PATHS[0], params=[("dlqIds", dlq_id) for dlq_id in dlq_ids],
            headers={"Authorization": f"Bearer {TOKEN}"},
        )  # fmt: skip
        assert len(late.json()["workflowRuns"]) == 3, late.text

        assert await h.settled(3) == {"done": 3}
        sources = Counter(run["sourceDlqId"] for run in await h.runs())
        assert sources == Counter(dict.fromkeys(dlq_ids, 1))


async def test_under_every_kind_of_fault_all_settle_within_the_rate_limit(
    tmp_path: Path,
) -> None:
    async with harness(
        tmp_path,
        RESUME_ALL,
        emulator={"max_requests_per_second": 20},
        apart=True,
        http_timeout=0.3,
    ) as h:
        dlq_ids = await h.seed(workflows(60))
        for fault in (
            {"kind": "status", "status": 503, "times": 6},
            {"kind": "rate_limit", "times": 5, "retryAfter": 0.2},
            {"kind": "latency", "seconds": 0.5, "times": 3},
            {"kind": "drop", "times": 3},
            {"kind": "status", "status": 502, "times": 3, "paths": ["/v2/workflows/"]},
        ):
            await h.fault(**fault)
        await h.send_callbacks(dlq_ids)

        states = await h.settled(60, seconds=60)

        assert states == {"done": 60}
        sources = Counter(run["sourceDlqId"] for run in await h.runs())
        assert sources == Counter(dict.fromkeys(dlq_ids, 1))
        stats = (await h.control.get("/_emulator/stats")).json()
        assert stats["max_requests_in_window"] <= 20
        assert stats["rate_limited"] == 5  # the 5 injected: none was earned
