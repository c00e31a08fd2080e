"""Fencing by lease deadline: a replica frozen while its client waits to retry a batch's
bulk call, for longer than its lease, sends nothing for that batch once it thaws; the
replica that adopted the batch recovers each run once."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.pipeline.support import BULK_PATHS, dlq_ids_of
from tests.processes import Served, emulator_process, serving
from tests.support import LOOPBACK_TLS, callback_json, emulator_config, signed, wait_for, workflows

LEASE = 3.0  # seconds: the shortest RECOVERYD_REPLICA_LEASE takes
RULES = """\
version: 1
rules:
  - name: resume-all
    match: {workflow: true}
    action: resume
    batch: {maxSize: 5, maxWait: 5s}  # one batch: A's call names all five
"""
FENCED = "lease lapsed during a batch's call"


def bulk_calls(control: httpx.Client) -> list[dict[str, Any]]:
    journal: list[dict[str, Any]] = control.get("/_emulator/journal").json()
    return [call for call in journal if call["path"] in BULK_PATHS]


def done(served: Served) -> int:
    states = httpx.get(f"{served.admin_url}/api/v1/status", timeout=5, verify=LOOPBACK_TLS).json()[
        "states"
    ]
    return int(states["done"])


def test_a_replica_frozen_mid_retry_sends_nothing_for_its_adopted_batch(
    tmp_path: Path, postgres_url: str
) -> None:
    """Replica A's batch call is answered 429 with a Retry-After that its client waits
    out; A is frozen (SIGSTOP) right then, for two leases. B declares A gone, adopts the
    batch, checks it with reads and recovers its runs. A thaws (SIGCONT) and its client's
    retry comes due at once. Without the fence that retry would go out: the store's
    checks (the batch's owner) were made before the first attempt, and the client retries
    for up to 120 s. With it, the attempt asks the fence first, finds that A's lease
    lapsed since the batch was marked, and A lets the batch go."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = emulator_config(execute_runs=False, max_requests_per_second=1000)
    settings = {"RULES": str(rules), "STORE": postgres_url, "REPLICA_LEASE": f"{LEASE:g}s"}
    with (
        emulator_process(config) as service_url,
        httpx.Client(base_url=service_url, timeout=30) as control,
    ):
        dlq_ids: list[str] = control.post("/_emulator/dlq", json={"messages": workflows(5)}).json()[
            "dlqIds"
        ]
        # A refusal the client waits out: due while A is still frozen, so at once on SIGCONT.
        refusal = {"kind": "rate_limit", "retryAfter": LEASE, "paths": list(BULK_PATHS)}
        control.post("/_emulator/faults", json=refusal).raise_for_status()
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with serving(tmp_path / "a", SERVICE_URL=service_url, **settings) as a:
            try:
                for dlq_id in dlq_ids:
                    body = callback_json(dlq_id, "failure-callback-workflow.json")
                    answer = httpx.post(
                        f"{a.url}/callbacks",
                        content=body,
                        headers=signed(body),
                        verify=LOOPBACK_TLS,
                    )
                    assert answer.status_code == 200
                wait_for(lambda: bulk_calls(control), 30, "A's bulk call, refused")
                a.process.send_signal(signal.SIGSTOP)
                stopped = time.time()
                with serving(tmp_path / "b", SERVICE_URL=service_url, **settings) as b:
                    wait_for(lambda: done(b) == 5, 60, "B to adopt A's batch and recover it")
                    # Frozen for two leases in all, then thawed.
                    time.sleep(max(0.0, stopped + 2 * LEASE - time.time()))
                    a.process.send_signal(signal.SIGCONT)
                    resumed = time.time()
                    wait_for(lambda: FENCED in a.logs() or bulk_calls(control)[-1]["at"] > resumed,
                             30, "A's retry, fenced or sent")  # fmt: skip
                    assert done(a) == 5
            finally:
                a.process.send_signal(signal.SIGCONT)
        calls = bulk_calls(control)
        runs = control.get("/_emulator/runs").json()

    refused, *recovered = calls
    assert refused["status"] == 429
    assert sorted(dlq_ids_of(refused)) == sorted(dlq_ids)
    assert refused["at"] < stopped
    assert recovered
    assert [call for call in recovered if not stopped < call["at"] < resumed] == []
    assert {call["status"] for call in recovered} == {200}
    assert sorted(dlq_id for call in recovered for dlq_id in dlq_ids_of(call)) == sorted(dlq_ids)
    assert Counter(run["sourceDlqId"] for run in runs) == Counter(dict.fromkeys(dlq_ids, 1))
    assert FENCED in a.logs()
