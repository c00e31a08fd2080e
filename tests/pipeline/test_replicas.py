"""Three `recoveryd serve` on one PostgreSQL: the callbacks spread across them, the one
running the singleton jobs killed mid-run and a new replica started. Nothing accepted is
lost, no dlqId is sent twice, no call earns a 429 once the limit is known, and the token
rotation and the sweeps go on on another replica, with no lockout."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from cryptography.fernet import Fernet

from tests.account.support import RESET
from tests.pipeline.support import BULK_PATHS, assert_recovered_once
from tests.processes import Served, emulator_process, serving
from tests.support import (
    LOOPBACK_TLS,
    PASSWORD,
    USERNAME,
    callback_json,
    emulator_config,
    signed,
    wait_for,
    workflows,
)
from tests.sweeps.support import FILTER, matching

CALLBACKS = 5000
LIMIT = 100  # the account's requests a second
SWEPT = 20  # entries only the sweep selects (no callback names them)
IN_FLIGHT = 8  # calls one replica has out at most: its fetch workers and batch senders
RULES = f"""\
version: 1
rules:
  - name: resume-all
    match: {{workflow: true}}
    action: resume
    batch: {{maxSize: 50, maxWait: 200ms}}
sweeps:
  - {json.dumps({"name": "swept", "schedule": "2s", "action": "resume", "filter": FILTER})}
"""


def metric(served: Served, name: str) -> float:
    text = httpx.get(f"{served.admin_url}/metrics", timeout=5, verify=LOOPBACK_TLS).text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def status(served: Served) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/status", timeout=5, verify=LOOPBACK_TLS
    ).json()
    return answer


def sweep_runs(served: Served) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{served.admin_url}/api/v1/sweeps?runs=50", timeout=5, verify=LOOPBACK_TLS
    ).json()
    runs: list[dict[str, Any]] = answer["sweeps"][0]["lastRuns"]
    return runs


async def post_all(replicas: list[Served], dlq_ids: list[str]) -> set[str]:
    """Each callback to the next replica in turn, 32 at a time; one that a replica does
    not answer (it was killed) goes to the next, as the service retries. The accepted."""
    accepted: set[str] = set()
    queue = list(enumerate(dlq_ids))

    async def send(http: httpx.AsyncClient) -> None:
        while queue:
            index, dlq_id = queue.pop(0)
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            for attempt in range(len(replicas) * 3):
                target = replicas[(index + attempt) % len(replicas)]
                if target.process.poll() is not None:
                    continue
                try:
                    answer = await http.post(f"{target.url}/callbacks", content=body,
                                             headers=signed(body))  # fmt: skip
                except httpx.TransportError:
                    continue
                if answer.status_code == 200:
                    accepted.add(dlq_id)
                    break
            else:
                raise AssertionError(f"no replica took {dlq_id}")

    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.gather(*(send(http) for _ in range(32)))
    return accepted


def leader_of(replicas: list[Served]) -> Served:
    holding = [
        served
        for served in replicas
        if served.process.poll() is None and metric(served, "recoveryd_singleton_jobs_running")
    ]
    assert len(holding) == 1, f"{len(holding)} replicas run the singleton jobs"
    return holding[0]


def test_three_replicas_share_the_work_and_survive_the_leaders_death(
    tmp_path: Path, postgres_url: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = emulator_config(execute_runs=False, max_requests_per_second=LIMIT)
    with (
        emulator_process(config) as service_url,
        httpx.Client(base_url=service_url, timeout=30) as control,
        ExitStack() as running,
    ):
        dlq_ids: list[str] = control.post(
            "/_emulator/dlq", json={"messages": workflows(CALLBACKS)}
        ).json()["dlqIds"]
        swept = [
            {**entry, "workflowRunId": f"wfr_swept_{i}"} for i, entry in enumerate(matching(SWEPT))
        ]
        control.post("/_emulator/dlq", json={"messages": swept}).raise_for_status()
        settings = {
            "SERVICE_URL": service_url,
            "RULES": str(rules),
            "STORE": postgres_url,
            "REPLICA_LEASE": "3s",
            "CREDENTIALS_KEY": Fernet.generate_key().decode(),
            "ACCOUNT_USERNAME": USERNAME,
            "ACCOUNT_PASSWORD": PASSWORD,
            "ROTATE_SCHEDULE": "5s",
        }

        def start(name: str) -> Served:
            folder = tmp_path / name
            folder.mkdir()
            return running.enter_context(serving(folder, prefix=(), **settings))

        replicas = [start(f"replica-{n}") for n in range(3)]
        wait_for(lambda: sum(metric(s, "recoveryd_replicas") == 3 for s in replicas) == 3,
                 what="three replicas to see each other")  # fmt: skip
        leader = leader_of(replicas)

        killed: list[float] = []

        async def spread_and_kill() -> set[str]:
            posting = asyncio.create_task(post_all(replicas, dlq_ids))
            # Mid-run, right after a rotation (so that none is cut short: a reset whose
            # answer dies with its replica is a lockout, by design, rotation.py).
            await asyncio.to_thread(
                wait_for, lambda: status(leader)["states"]["done"] >= 1000, 120, "1000 done"
            )
            rotated = status(leader)["lastTokenRotation"]["id"]
            await asyncio.to_thread(
                wait_for, lambda: (status(leader)["lastTokenRotation"] or {}).get("id", 0) > rotated
                and status(leader)["lastTokenRotation"]["result"] is not None, 30, "a rotation",
            )  # fmt: skip
            leader.stop(signal.SIGKILL)
            killed.append(time.time())
            return await posting

        accepted = asyncio.run(spread_and_kill())
        [killed_at] = killed
        replicas.append(start("replica-3"))
        survivors = [served for served in replicas if served.process.poll() is None]
        wait_for(lambda: status(survivors[0])["states"]["done"] == CALLBACKS, 240,
                 "every callback done")  # fmt: skip
        new_leader = leader_of(survivors)
        # Rotation and sweeps go on, on the new leader.
        wait_for(lambda: (status(new_leader)["lastTokenRotation"] or {}).get("startedAt", 0)
                 > killed_at + 1, 30, "a rotation after the kill")  # fmt: skip

        def swept_since() -> bool:
            runs = sweep_runs(new_leader)
            return any(
                run["startedAt"] > killed_at + 1 and run["result"] == "success" for run in runs
            )

        wait_for(swept_since, 30, "a sweep after the kill")
        final = [status(served) for served in survivors]
        journal = control.get("/_emulator/journal").json()
        runs = control.get("/_emulator/runs").json()
        stats = control.get("/_emulator/stats").json()

    assert accepted == set(dlq_ids)
    assert {state: n for state, n in final[0]["states"].items() if n} == {"done": CALLBACKS}
    recovered = [run for run in runs if run["sourceDlqId"] in set(dlq_ids)]
    callback_calls = [
        call for call in journal
        if call["path"] not in BULK_PATHS or any(n == "dlqIds" for n, _ in call["query"])
    ]  # fmt: skip
    assert_recovered_once(callback_calls, recovered, dlq_ids)
    assert [call for call in journal if call["status"] == 429] == []
    assert stats["max_requests_in_window"] <= LIMIT
    for answer in final:
        assert answer["token"]["lockedOut"] is False
        assert answer["token"]["problems"] == []
    # A replica learns of another's rotation from its first refused call: those are at
    # most the calls in flight on the two other replicas at each reset.
    rotations = sum(call["path"] == RESET and call["status"] == 200 for call in journal)
    refused = sum(call["status"] == 401 for call in journal)
    assert rotations >= 2
    assert refused <= rotations * 2 * IN_FLIGHT
    assert sum(run["sourceDlqId"] not in set(dlq_ids) for run in runs) == SWEPT
