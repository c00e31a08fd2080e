"""End to end over real sockets: callbacks in, runs resumed and restarted in batches, with
exactly the rule's override headers, each dlqId sent once; and every other outcome. Each
test runs on both stores: SQLite, and PostgreSQL (a database of the test's own)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.pipeline.support import dlq_ids_of, harness, sent_per_dlq_id
from tests.support import workflows

RESTART_BILLING = """\
version: 1
rules:
  - name: restart-billing
    match: {labels: {any: [billing]}}
    action: restart
    overrides:
      retries: 5
      delay: 30s
      retryDelay: "pow(2, retried) * 1000"
      flowControl: {key: billing, parallelism: 5, rate: 10, period: 1m}
      labels: [auto-restarted]
      failureCallback: https://hooks.example.com/again
    batch: {maxSize: 20, maxWait: 5s}
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
    batch: {maxSize: 50, maxWait: 200ms}
  - name: everything-else
    match: {}
    action: ignore
"""

BILLING_HEADERS = {
    "Service-Retries": "5",
    "Service-Delay": "30s",
    "Service-Retry-Delay": "pow(2, retried) * 1000",
    "Service-Flow-Control-Key": "billing",
    "Service-Flow-Control-Value": "parallelism=5, rate=10, period=1m",
    "Service-Label": "auto-restarted",
    "Service-Failure-Callback": "https://hooks.example.com/again",
}


async def test_runs_are_restarted_in_batches_with_the_rules_headers_each_sent_once(
    tmp_path: Path, store: dict[str, str]
) -> None:
    async with harness(tmp_path, RESTART_BILLING, **store) as h:
        billing = await h.seed(workflows(45, labels=["billing"]))
        others = await h.seed(workflows(7))
        await h.send_callbacks(billing + others)

        assert await h.settled(52) == {"done": 52}

        calls = await h.bulk_calls()
        restarts = [call for call in calls if call["path"].endswith("/restart")]
        resumes = [call for call in calls if call["path"].endswith("/resume")]
        assert all(len(dlq_ids_of(call)) <= 20 for call in restarts)
        assert sorted(dlq_id for call in restarts for dlq_id in dlq_ids_of(call)) == sorted(billing)
        assert sorted(dlq_id for call in resumes for dlq_id in dlq_ids_of(call)) == sorted(others)
        assert set(sent_per_dlq_id(calls).values()) == {1}
        # Two batches flushed full, the rest when its first had waited maxWait.
        assert sorted(len(dlq_ids_of(call)) for call in restarts) == [5, 20, 20]

        runs = await h.runs()
        by_source = {run["sourceDlqId"]: run for run in runs}
        assert sorted(by_source) == sorted(billing + others)
        for dlq_id in billing:
            run = by_source[dlq_id]
            assert run["mode"] == "restart"
            headers = {k: v for k, v in run["rawHeaders"].items() if k in BILLING_HEADERS}
            assert headers == BILLING_HEADERS
        for dlq_id in others:
            assert by_source[dlq_id]["mode"] == "resume"
            assert by_source[dlq_id]["rawHeaders"] == {}


async def test_the_record_shows_the_rule_the_calls_and_the_runs(
    tmp_path: Path, store: dict[str, str]
) -> None:
    # A batch of one, sent at once: maxWait is not what this test is about.
    rules = RESTART_BILLING.replace("maxSize: 20, maxWait: 5s", "maxSize: 20, maxWait: 100ms")
    async with harness(tmp_path, rules, **store) as h:
        [dlq_id] = await h.seed(workflows(1, labels=["billing"]))
        await h.send_callbacks([dlq_id])
        await h.settled(1)

        record = await h.record(dlq_id)

        assert record["state"] == "done"
        assert (record["rule"], record["action"]) == ("restart-billing", "restart")
        assert record["workflowRunId"] == "wfr_0"
        assert [call["operation"] for call in record["calls"]] == ["get_dlq_message"]
        assert record["calls"][0]["status"] == 200
        [batch] = record["batches"]
        [run] = await h.runs()
        assert batch["workflowRuns"] == [
            {"workflowRunId": run["workflowRunId"], "workflowCreatedAt": run["workflowCreatedAt"]}
        ]
        assert [call["status"] for call in batch["calls"]] == [200]
        assert [event["state"] for event in record["history"]] == ["decided", "batched", "done"]
        missing = await h.recoveryd.admin.get("/api/v1/dlq/never-heard-of")
        assert missing.status_code == 404
        assert "never-heard-of" in missing.json()["error"]


async def test_different_overrides_never_share_a_call(
    tmp_path: Path, store: dict[str, str]
) -> None:
    rules = """\
version: 1
rules:
  - name: quick
    match: {labels: {any: [quick]}}
    action: resume
    overrides: {retries: 1}
    batch: {maxWait: 100ms}
  - name: patient
    match: {workflow: true}
    action: resume
    overrides: {retries: 2}
    batch: {maxWait: 100ms}
"""
    async with harness(tmp_path, rules, **store) as h:
        quick = await h.seed(workflows(6, labels=["quick"]))
        patient = await h.seed(workflows(6))
        await h.send_callbacks(
            [dlq_id for pair in zip(quick, patient, strict=True) for dlq_id in pair]
        )
        await h.settled(12)

        groups = [set(dlq_ids_of(call)) for call in await h.bulk_calls()]
        assert all(group <= set(quick) or group <= set(patient) for group in groups)
        headers = {run["sourceDlqId"]: run["rawHeaders"] for run in await h.runs()}
        assert all(headers[dlq_id] == {"Service-Retries": "1"} for dlq_id in quick)
        assert all(headers[dlq_id] == {"Service-Retries": "2"} for dlq_id in patient)


async def test_every_other_outcome_is_final_and_says_why(
    tmp_path: Path, store: dict[str, str]
) -> None:
    rules = """\
version: 1
rules:
  - name: leave-canaries
    match: {labels: {any: [canary]}}
    action: ignore
  - name: resume-all
    match: {responseStatus: {gte: 500}}
    action: resume
    batch: {maxWait: 100ms}
"""
    async with harness(tmp_path, rules, **store) as h:
        [canary] = await h.seed(workflows(1, labels=["canary"], responseStatus=503))
        [unmatched] = await h.seed(workflows(1, responseStatus=404))
        [plain] = await h.seed([{"url": "https://app.example.com/hook", "responseStatus": 503}])
        await h.send_callbacks([canary, unmatched, plain, "never-in-the-dlq"])

        assert await h.settled(4) == {"skipped": 3, "gone": 1}

        reasons = {dlq_id: (await h.record(dlq_id))["reason"] for dlq_id in
                   (canary, unmatched, plain, "never-in-the-dlq")}  # fmt: skip
        assert reasons == {
            canary: "rule leave-canaries says ignore",
            unmatched: "no rule matched",
            plain: "resume applies to workflow runs, and this message is not one",
            "never-in-the-dlq": "not in the DLQ",
        }
        assert await h.bulk_calls() == []


DRY = """\
version: 1
rules:
  - name: careful
    match: {labels: {any: [careful]}}
    action: restart
    overrides: {retries: 2}
    dryRun: true
  - name: resume-all
    match: {workflow: true}
    action: resume
    batch: {maxWait: 100ms}
"""


async def test_a_dry_run_rule_records_the_call_and_makes_none(
    tmp_path: Path, store: dict[str, str]
) -> None:
    async with harness(tmp_path, DRY, **store) as h:
        [careful] = await h.seed(workflows(1, labels=["careful"]))
        [other] = await h.seed(workflows(1))
        await h.send_callbacks([careful, other])

        assert await h.settled(2) == {"dry-run": 1, "done": 1}

        record = await h.record(careful)
        assert record["wouldCall"] == {
            "method": "POST",
            "path": "/v2/workflows/dlq/restart",
            "query": {"dlqIds": [careful]},
            "headers": {"Service-Retries": "2"},
        }
        assert [dlq_ids_of(call) for call in await h.bulk_calls()] == [[other]]
        in_dlq = [entry["dlqId"] for entry in (await h.control.get("/_emulator/dlq")).json()]
        assert in_dlq == [careful]


async def test_recoveryd_dry_run_changes_nothing_at_all(
    tmp_path: Path, store: dict[str, str]
) -> None:
    async with harness(tmp_path, DRY, DRY_RUN="true", **store) as h:
        dlq_ids = await h.seed(workflows(3))
        await h.send_callbacks(dlq_ids)

        assert await h.settled(3) == {"dry-run": 3}

        methods = Counter(
            (call["method"], call["path"].split("/")[2]) for call in await h.journal()
        )
        assert methods == Counter({("GET", "dlq"): 3})


async def test_metrics_count_decisions_batches_calls_and_states(
    tmp_path: Path, store: dict[str, str]
) -> None:
    # Two batches, each flushed full (maxSize 20): none waits out maxWait.
    async with harness(tmp_path, RESTART_BILLING, **store) as h:
        dlq_ids = await h.seed(workflows(40, labels=["billing"]))
        await h.send_callbacks(dlq_ids)
        await h.settled(40)
        await h.recoveryd.admin.get("/metrics")
        metric = h.recoveryd.metric

        assert metric("recoveryd_decisions_total", rule="restart-billing", action="restart") == 40
        assert metric("recoveryd_batch_dlq_ids_count") == 2
        assert metric("recoveryd_batch_dlq_ids_sum") == 40
        assert metric("recoveryd_recovered_total", action="restart") == 40
        assert (
            metric("recoveryd_upstream_calls_total", operation="get_dlq_message", status="200")
            == 40
        )
        assert metric("recoveryd_upstream_calls_total", operation="restart", status="200") == 2
        assert metric("recoveryd_upstream_call_duration_seconds_count", operation="restart") == 2
        assert metric("recoveryd_dlq_ids", state="done") == 40
        assert metric("recoveryd_dlq_ids", state="received") == 0
        assert metric("recoveryd_oldest_pending_age_seconds") == 0
        assert metric("recoveryd_pending_batches") == 0
