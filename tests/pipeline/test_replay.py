"""Replay after a real run of mixed traffic (issue 39's acceptance): a candidate decided on
the records the pipeline kept, through the admin API and `recoveryd replay`, with the
daemon running and without. Each test runs on both stores."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.pipeline.support import Harness, harness
from tests.processes import recoveryd
from tests.support import workflows

LIVE = """\
version: 1
rules:
  - name: restart-billing
    match: {labels: {any: [billing]}}
    action: restart
    overrides: {retries: 5, delay: 30s, labels: [auto-restarted]}
    batch: {maxSize: 10, maxWait: 100ms}
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
  - name: everything-else
    match: {}
    action: ignore
"""
BILLING_RESUMED = LIVE.replace("action: restart", "action: resume").replace(
    "retries: 5", "retries: 3"
)
# One recovery of a workflow an hour: the workflow recovered before is stopped.
BUDGETED = LIVE.replace(
    "  - name: everything-else",
    "    budget: {maxRecoveries: 1, within: 1h}\n  - name: everything-else",
)


@dataclass
class Run:
    """The pipeline after the traffic: the dlqIds by kind, and the failure of the run a
    recovery of `others[0]` made (its workflow recovered before)."""

    h: Harness
    billing: list[str]
    others: list[str]
    plain: list[str]
    again: str

    async def replay(self, candidate: str, **body: Any) -> tuple[int, dict[str, Any]]:
        answer = await self.h.recoveryd.admin.post(
            "/api/v1/replay", json={"rules": candidate, **body}
        )
        return answer.status_code, answer.json()

    @property
    def admin_listen(self) -> str:
        url = self.h.recoveryd.admin.base_url
        return f"{url.host}:{url.port}"


@contextlib.asynccontextmanager
async def mixed_run(tmp_path: Path, store: dict[str, str]) -> AsyncIterator[Run]:
    """recoveryd with LIVE after billing runs, other runs and plain messages, each
    settled; then the new run of one recovered workflow failed too, and was recovered."""
    async with harness(tmp_path, LIVE, **store) as h:
        billing = await h.seed(workflows(3, labels=["billing"]))
        others = await h.seed(
            [{**sent, "workflowRunId": f"wfr_other_{i}"} for i, sent in enumerate(workflows(3))]
        )
        plain = await h.seed(
            [{"url": "https://app.example.com/publish", "callerIP": "1.2.3.4"}] * 2
        )
        await h.send_callbacks(billing + others + plain)
        await h.settled(8)
        [made] = [run for run in await h.runs() if run["sourceDlqId"] == others[0]]
        [again] = await h.seed(workflows(1, workflowRunId=made["workflowRunId"]))
        await h.send_callbacks([again])
        await h.settled(9)
        assert (await h.record(again))["state"] == "done"
        yield Run(h, billing, others, plain, again)


def candidate_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "candidate.yaml"
    path.write_text(text)
    return path


async def test_a_candidate_resuming_billing_changes_exactly_the_billing_records(
    tmp_path: Path, store: dict[str, str]
) -> None:
    """Through the API and the command asking the daemon: the billing records alone, restart
    to resume, each with the overrides that differ; exit 1."""
    path = candidate_file(tmp_path, BILLING_RESUMED)
    async with mixed_run(tmp_path, store) as run:
        status, report = await run.replay(BILLING_RESUMED)
        # No store where the command runs: only the daemon can answer it.
        nowhere = f"sqlite:///{tmp_path / 'nowhere.db'}"
        command = await recoveryd(
            tmp_path, "replay", str(path), "--format", "json",
            ADMIN_LISTEN=run.admin_listen, STORE=nowhere,
        )  # fmt: skip
    assert status == 200, report
    assert (report["examined"], report["changed"]) == (9, 3)
    [group] = report["groups"]
    assert (group["before"], group["after"]) == (
        {"rule": "restart-billing", "action": "restart"},
        {"rule": "restart-billing", "action": "resume"},
    )
    assert (group["count"], sorted(group["examples"])) == (3, sorted(run.billing))
    [overrides] = report["overrides"]
    assert overrides["before"]["overrides"] == {
        "retries": 5, "delay": "30s", "labels": ["auto-restarted"]
    }  # fmt: skip
    assert overrides["after"]["overrides"] == {
        "retries": 3, "delay": "30s", "labels": ["auto-restarted"]
    }  # fmt: skip
    assert sorted(overrides["examples"]) == sorted(run.billing)
    assert command.returncode == 1, command.stderr
    told = json.loads(command.stdout)
    assert told["candidate"]["source"] == str(path)
    assert {**told, "candidate": None, "since": None} == {
        **report,
        "candidate": None,
        "since": None,
    }


async def test_the_rules_in_force_change_nothing_and_exit_0_without_a_daemon(
    tmp_path: Path, store: dict[str, str]
) -> None:
    """Once the daemon is gone the command reads the store itself: the same rules replayed
    change no decision and no budget, and it exits 0."""
    path = candidate_file(tmp_path, LIVE)
    async with mixed_run(tmp_path, store):
        pass
    command = await recoveryd(tmp_path, "replay", str(path), ADMIN_LISTEN="127.0.0.1:0", **store)
    as_json = await recoveryd(
        tmp_path, "replay", str(path), "--format", "json", ADMIN_LISTEN="127.0.0.1:0", **store
    )
    assert command.returncode == 0, command.stderr
    assert "replayed on 9 records" in command.stdout
    assert "nothing would change" in command.stdout
    report = json.loads(as_json.stdout)
    assert (report["examined"], report["changed"], report["groups"]) == (9, 0, [])
    assert report["budget"]["stopped"]["count"] == report["budget"]["recoveredAgain"]["count"] == 0


async def test_a_budget_stops_the_workflow_recovered_before(
    tmp_path: Path, store: dict[str, str]
) -> None:
    """A budget of one recovery an hour would have stopped the second recovery of the
    workflow, and only it; no decision changes."""
    async with mixed_run(tmp_path, store) as run:
        status, report = await run.replay(BUDGETED)
        only_billing = (await run.replay(BUDGETED, rule="restart-billing"))[1]
    assert status == 200, report
    assert report["changed"] == 0
    assert report["budget"]["stopped"] == {"count": 1, "examples": [run.again]}
    assert report["budget"]["liveStopped"] == 0
    assert only_billing["examined"] == 3
    assert only_billing["budget"]["stopped"]["count"] == 0
