"""SIGKILL while a large batch's call is in flight, then a restart: every dlqId ends done,
nothing is lost, and no run is resumed twice."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.pipeline.support import BULK_PATHS, assert_recovered_once, dlq_ids_of
from tests.processes import Served, serving
from tests.support import (
    LOOPBACK_TLS,
    callback_json,
    emulator_config,
    faults_taken,
    signed,
    wait_for,
    workflows,
)

UNSETTLED = "the call's outcome was not recorded"  # a batch's reason, once checked
RULES = """\
version: 1
rules:
  - name: resume-all
    match: {workflow: true}
    action: resume
    batch: {maxSize: 50, maxWait: 5s}
"""


def status(served: Served) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/status", timeout=5, verify=LOOPBACK_TLS
    ).json()
    return answer


def record(served: Served, dlq_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/dlq/{dlq_id}", timeout=5, verify=LOOPBACK_TLS
    ).json()
    return answer


def post_callbacks(served: Served, dlq_ids: list[str]) -> None:
    """Each dlqId's signed failure callback, one after the other, as the service sends them."""
    with httpx.Client(base_url=served.url, timeout=10, verify=LOOPBACK_TLS) as public:
        for dlq_id in dlq_ids:
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            response = public.post("/callbacks", content=body, headers=signed(body))
            assert response.status_code == 200


def journal_of(control: httpx.Client) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = control.get("/_emulator/journal").json()
    return calls


def test_a_kill_during_a_batch_call_loses_nothing_and_resumes_nothing_twice(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = emulator_config(execute_runs=False)
    with (
        serve_in_thread(create_app(config)) as service_url,
        httpx.Client(base_url=service_url, timeout=10) as control,
    ):
        seeded = control.post("/_emulator/dlq", json={"messages": workflows(120)})
        dlq_ids: list[str] = seeded.json()["dlqIds"]
        # The first bulk call (the first 50, flushed full) takes its time: the kill comes
        # while it is in flight, after the other 70 callbacks are posted one by one.
        fault = {"kind": "latency", "seconds": 8, "times": 1, "paths": ["/v2/workflows/"]}
        control.post("/_emulator/faults", json=fault).raise_for_status()
        settings = {"SERVICE_URL": service_url, "RULES": str(rules)}

        with serving(tmp_path, **settings) as served:
            post_callbacks(served, dlq_ids)
            # Marked as sending (committed right before the call), and the call at the
            # emulator, which is holding it when the kill comes.
            wait_for(
                lambda: any(batch["sentAt"] for batch in record(served, dlq_ids[0])["batches"])
            )
            wait_for(lambda: faults_taken(control))
            exit_status, _ = served.stop(signal.SIGKILL)
        assert exit_status == -signal.SIGKILL
        # The emulator carries the held call out, for no one.
        wait_for(lambda: any(call.get("fault") == "latency" for call in journal_of(control)))

        with serving(tmp_path, **settings) as served:
            wait_for(lambda: status(served)["states"]["done"] == 120)
            final = status(served)
            killed = httpx.get(
                f"{served.admin_url}/api/v1/dlq/{dlq_ids[0]}", verify=LOOPBACK_TLS
            ).json()
            served.stop()

        runs = control.get("/_emulator/runs").json()
        journal = journal_of(control)

    assert final["pendingBatches"] == 0
    assert {state: n for state, n in final["states"].items() if n} == {"done": 120}
    assert Counter(run["sourceDlqId"] for run in runs) == Counter(dict.fromkeys(dlq_ids, 1))
    sent = Counter(
        dlq_id for call in journal if call["path"] in BULK_PATHS for dlq_id in dlq_ids_of(call)
    )
    assert sent == Counter(dict.fromkeys(dlq_ids, 1))  # checked with GETs, never re-sent
    [batch] = killed["batches"]
    assert batch["reason"] == UNSETTLED
    assert [event["state"] for event in killed["history"]] == ["decided", "batched", "done"]


@pytest.mark.parametrize("fetch", ["always", "needed"])
def test_three_kills_at_random_points_fail_nothing_and_recover_each_once(
    tmp_path: Path, fetch: str
) -> None:
    """SIGKILL three times while batches are being formed and sent (each call held a
    while, so kills land in every step), then a last start: all done, none failed, each
    run made once and each dlqId in one answered call. With RECOVERYD_FETCH=needed,
    decided from the callbacks: a dlqId is read only to check a call cut short."""
    chance = random.Random(20261123)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("maxSize: 50, maxWait: 5s", "maxSize: 20, maxWait: 300ms"))
    config = emulator_config(execute_runs=False)
    with (
        serve_in_thread(create_app(config)) as service_url,
        httpx.Client(base_url=service_url, timeout=10) as control,
    ):
        dlq_ids: list[str] = control.post(
            "/_emulator/dlq", json={"messages": workflows(300)}
        ).json()["dlqIds"]
        fault = {"kind": "latency", "seconds": 0.4, "times": 1000, "paths": ["/v2/workflows/"]}
        control.post("/_emulator/faults", json=fault).raise_for_status()
        settings = {"SERVICE_URL": service_url, "RULES": str(rules), "FETCH": fetch}

        for kill in range(3):
            with serving(tmp_path, **settings) as served:
                post_callbacks(served, dlq_ids[kill * 100 : (kill + 1) * 100])
                wait_for(lambda: status(served)["pendingBatches"] >= 1)
                time.sleep(chance.uniform(0.0, 1.5))
                exit_status, _ = served.stop(signal.SIGKILL)
                assert exit_status == -signal.SIGKILL

        control.delete("/_emulator/faults").raise_for_status()
        with serving(tmp_path, **settings) as served:
            wait_for(lambda: status(served)["states"]["done"] == 300, seconds=120)
            final = status(served)
            journal = journal_of(control)
            read = {
                dlq_id: [batch["reason"] for batch in record(served, dlq_id)["batches"]]
                for dlq_id in {call["path"].removeprefix("/v2/dlq/") for call in journal
                               if call["method"] == "GET" and call["path"].startswith("/v2/dlq/")}
            }  # fmt: skip
            served.stop()
        runs = control.get("/_emulator/runs").json()

    assert {state: n for state, n in final["states"].items() if n} == {"done": 300}
    assert_recovered_once(journal, runs, dlq_ids)
    if fetch == "needed":  # read only to check a call a kill cut short
        assert len(read) < len(dlq_ids)
        assert all(UNSETTLED in reasons for reasons in read.values()), read
