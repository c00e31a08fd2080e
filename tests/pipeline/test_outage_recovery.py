"""The minute after an outage: 600 failure callbacks arrive while the service's API is down
for 60 s, recoveryd is SIGKILLed twice meanwhile, and the service comes back at its limit
of 50 calls/s. Every run is restarted exactly once, and the backlog is drained within
1.5x the theoretical time plus 5 s of the service's return, with 429s in one episode at
most: the wait belongs to the service, and its return ends it for every dlqId at once."""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from daemon.upstream import MAX_BULK
from tests.pipeline.support import (
    BULK_PATHS,
    RESUME_ALL,
    Harness,
    assert_recovered_once,
    dlq_ids_of,
    harness,
)
from tests.processes import Served, emulator_process, serving
from tests.support import (
    FAST_TUNING,
    LOOPBACK_TLS,
    callback_json,
    emulator_config,
    eventually,
    running_recoveryd,
    signed,
    wait_for,
    workflows,
)

CALLBACKS = 600
OUTAGE_SECONDS = 60.0
KILLS = 2  # recoveryd is SIGKILLed twice while the service is down, and started again
# The service's calls a second once it is back: a rate the daemon keeps up with on a
# loaded two-core machine (CI runs two suites at once), since what is measured is the
# wait after the outage, not how fast the machine is (at 100/s it drained at 34/s there).
LIMIT = 50
# What the pipeline needs once the service is back, with RECOVERYD_FETCH=always: one GET
# a dlqId and one bulk call a MAX_BULK; none made before, as the service was down.
CALLS_NEEDED = CALLBACKS + math.ceil(CALLBACKS / MAX_BULK)
THEORETICAL = CALLS_NEEDED / LIMIT
BOUND = 1.5 * THEORETICAL + 5.0  # the acceptance bound of issue 35
EPISODE_GAP = 2.0  # 429s further apart than this are two episodes
RULES = """\
version: 1
rules:
  - name: restart-all
    match: {workflow: true}
    action: restart
    batch: {maxSize: 50, maxWait: 1s}
"""


def status(served: Served) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/status", timeout=10, verify=LOOPBACK_TLS
    ).json()
    return answer


def post_paced(served: Served, dlq_ids: list[str], until: float) -> None:
    """Each dlqId's signed callback, spread evenly until `until` (monotonic), then wait
    for it: callbacks come in one by one all through the outage."""
    start = time.monotonic()
    step = max(0.0, until - start) / len(dlq_ids)
    with httpx.Client(base_url=served.url, timeout=10) as public:
        for number, dlq_id in enumerate(dlq_ids):
            time.sleep(max(0.0, start + number * step - time.monotonic()))
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            response = public.post("/callbacks", content=body, headers=signed(body))
            assert response.status_code == 200, response.text
    time.sleep(max(0.0, until - time.monotonic()))


def episodes(times: list[float]) -> int:
    """How many bursts of 429s: arrivals more than EPISODE_GAP apart start a new one."""
    ordered = sorted(times)
    return sum(1 for i, at in enumerate(ordered) if i == 0 or at - ordered[i - 1] > EPISODE_GAP)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_backlog_of_an_outage_drains_as_soon_as_the_service_is_back(
    tmp_path: Path, record_property: Any
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = emulator_config(execute_runs=False, max_requests_per_second=LIMIT)
    # Its own process: the limit is counted at arrival, which recoveryd's work must not skew.
    with (
        emulator_process(config) as service_url,
        httpx.Client(base_url=service_url, timeout=30) as control,
    ):
        dlq_ids: list[str] = control.post(
            "/_emulator/dlq", json={"messages": workflows(CALLBACKS)}
        ).json()["dlqIds"]
        settings = {"SERVICE_URL": service_url, "RULES": str(rules)}
        control.post("/_emulator/outage", json={"mode": "503"}).raise_for_status()
        down_at = time.monotonic()
        share = CALLBACKS // (KILLS + 1)
        for part in range(KILLS + 1):
            ends = down_at + OUTAGE_SECONDS * (part + 1) / (KILLS + 1)
            with serving(tmp_path, **settings) as served:
                post_paced(served, dlq_ids[part * share : (part + 1) * share], ends)
                if part < KILLS:
                    exit_status, _ = served.stop(signal.SIGKILL)
                    assert exit_status == -signal.SIGKILL
                    continue
                during = status(served)["states"]
                back_at = time.time()  # wall clock, as the emulator's journal
                control.delete("/_emulator/outage").raise_for_status()
                wait_for(lambda: status(served)["states"]["done"] == CALLBACKS, seconds=240,
                         what="every dlqId done")  # fmt: skip
                final = status(served)
                served.stop()
        journal: list[dict[str, Any]] = control.get("/_emulator/journal").json()
        runs: list[dict[str, Any]] = control.get("/_emulator/runs").json()

    assert during["done"] == during["failed"] == 0  # nothing could be done while down
    assert {state: n for state, n in final["states"].items() if n} == {"done": CALLBACKS}
    assert_recovered_once(journal, runs, dlq_ids)
    assert {run["mode"] for run in runs} == {"restart"}
    answered = [call for call in journal if call["path"] in BULK_PATHS and call["status"] == 200]
    drained = max(call["at"] for call in answered) - back_at
    after = [call for call in journal if call["at"] >= back_at and not call.get("outage")]
    refused = [call["at"] for call in after if call["status"] == 429]
    probed = min(call["at"] for call in after) - back_at
    figure = (
        f"outage backlog: {CALLBACKS} runs, {CALLS_NEEDED} calls needed at {LIMIT}/s "
        f"(theoretical {THEORETICAL:.2f} s); the last restarted {drained:.2f} s after the "
        f"service returned (bound {BOUND:.2f} s, {drained / THEORETICAL:.2f}x), its first "
        f"call {probed:.2f} s after; {len(after)} calls after the return, "
        f"{len(refused)} answered 429 in {episodes(refused)} episode(s); "
        f"{sum(1 for c in journal if c.get('outage'))} calls met the outage"
    )
    print(figure)
    record_property("outage_drain_seconds", round(drained, 3))
    record_property("outage_drain", figure)
    assert drained <= BOUND, figure
    assert episodes(refused) <= 1, figure


# Backoffs far longer than any wait of these tests: a dlqId that goes must have been
# made due by the service's return, not by its backoff running out.
LONG_BACKOFF = dataclasses.replace(FAST_TUNING, retry_base=600.0, retry_cap=600.0)
FETCH_FAILED = "fetching the DLQ message failed"


async def waiting_for_the_service(h: Harness, dlq_ids: list[str]) -> list[str]:
    """Those of `dlq_ids` whose fetch failed and waits to be tried again."""
    records = [await h.record(dlq_id) for dlq_id in dlq_ids]
    return [r["dlqId"] for r in records if (r["reason"] or "").startswith(FETCH_FAILED)]


async def test_the_dlq_ids_waiting_for_the_service_go_when_its_circuit_closes(
    tmp_path: Path,
) -> None:
    """Fetches failed during an outage, then backoffs of 5 to 10 minutes: the probe that
    finds the service back makes them due at once, and each is recovered once."""
    async with harness(tmp_path, RESUME_ALL, tuning=LONG_BACKOFF) as h:
        dlq_ids = await h.seed(workflows(30))
        (await h.control.post("/_emulator/outage", json={"mode": "503"})).raise_for_status()
        await h.send_callbacks(dlq_ids)
        waiting = await eventually(lambda: waiting_for_the_service(h, dlq_ids),
                                   what="fetches failed by the outage")  # fmt: skip
        (await h.control.delete("/_emulator/outage")).raise_for_status()
        assert await h.settled(len(dlq_ids)) == {"done": len(dlq_ids)}
        assert_recovered_once(await h.journal(), await h.runs(), dlq_ids)
    assert waiting


async def test_a_start_after_the_service_came_back_tries_what_waited_for_it_at_once(
    tmp_path: Path,
) -> None:
    """Stopped during the outage with fetches in backoff, started once the service is
    back: no breaker of the new process ever opens, yet they go at once."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RESUME_ALL)
    config = emulator_config(execute_runs=False, max_requests_per_second=1000)
    with serve_in_thread(create_app(config)) as service_url:
        async with httpx.AsyncClient(base_url=service_url, timeout=30) as control:
            dlq_ids: list[str] = (
                await control.post("/_emulator/dlq", json={"messages": workflows(30)})
            ).json()["dlqIds"]
            (await control.post("/_emulator/outage", json={"mode": "503"})).raise_for_status()
            async with running_recoveryd(
                tmp_path, tuning=LONG_BACKOFF, SERVICE_URL=service_url, RULES=str(rules)
            ) as recoveryd:
                h = Harness(recoveryd, control, None)
                await h.send_callbacks(dlq_ids)
                waiting = await eventually(lambda: waiting_for_the_service(h, dlq_ids),
                                           what="fetches failed by the outage")  # fmt: skip
            (await control.delete("/_emulator/outage")).raise_for_status()
            async with running_recoveryd(
                tmp_path, tuning=LONG_BACKOFF, SERVICE_URL=service_url, RULES=str(rules)
            ) as recoveryd:
                h = Harness(recoveryd, control, None)
                assert await h.settled(len(dlq_ids)) == {"done": len(dlq_ids)}
                assert_recovered_once(await h.journal(), await h.runs(), dlq_ids)
    assert waiting


async def met_the_outage(h: Harness, dlq_ids: list[str]) -> bool:
    """Whether each of `dlq_ids` was in a bulk call that met the outage: every batch is
    waiting to check its call's outcome, none left to probe the service with a call."""
    journal = await h.journal()
    met = [call for call in journal if call["path"] in BULK_PATHS and call.get("outage")]
    return {dlq_id for call in met for dlq_id in dlq_ids_of(call)} == set(dlq_ids)


async def test_batches_whose_calls_met_the_outage_are_checked_once_the_service_is_back(
    tmp_path: Path,
) -> None:
    """RECOVERYD_FETCH=needed: decided from the callbacks, with no read to probe the
    service with; their bulk calls meet the outage (503: outcome unknown) and the checks
    wait backoffs of 5 to 10 minutes. Three batches: three failed calls (each made once,
    a call that may have reached the service is checked, not repeated) open no circuit.
    The checks' first reads probe within a probe interval, find the service back, and
    each dlqId is recovered once."""
    async with harness(tmp_path, RESUME_ALL, tuning=LONG_BACKOFF, FETCH="needed") as h:
        dlq_ids = await h.seed(workflows(30))
        (await h.control.post("/_emulator/outage", json={"mode": "503"})).raise_for_status()
        await h.send_callbacks(dlq_ids)
        await eventually(lambda: met_the_outage(h, dlq_ids), what="every batch's call sent")
        (await h.control.delete("/_emulator/outage")).raise_for_status()
        assert await h.settled(len(dlq_ids)) == {"done": len(dlq_ids)}
        assert_recovered_once(await h.journal(), await h.runs(), dlq_ids)
