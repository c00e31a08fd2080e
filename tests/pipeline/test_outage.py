"""A three-minute outage of the service in the middle of 5,000 callbacks, against
`recoveryd serve` as a process with its production timings: nothing ends `failed`, no
call loops hot while the service is down, work resumes by itself once it is back, every
dlqId is recovered exactly once, and the log neither floods nor shows a secret."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.pipeline.support import BULK_PATHS, RESUME_ALL, assert_recovered_once
from tests.processes import Served, serving
from tests.support import (
    LOOPBACK_TLS,
    PASSWORD,
    TOKEN,
    callback_json,
    emulator_config,
    signed,
    workflows,
)

CALLBACKS = 5000
# The outage: first the service's connections drop, then it answers 503 (a load
# balancer in front of nothing); 180 seconds in all.
OUTAGE = (("drop", 90.0), ("503", 90.0))


def status(served: Served) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/status", timeout=10, verify=LOOPBACK_TLS
    ).json()
    return answer


def post_callbacks(served: Served, dlq_ids: list[str]) -> None:
    with httpx.Client(base_url=served.url, timeout=10, verify=LOOPBACK_TLS) as public:
        for dlq_id in dlq_ids:
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            response = public.post("/callbacks", content=body, headers=signed(body))
            assert response.status_code == 200, response.text


@pytest.mark.slow
@pytest.mark.timeout(600)  # the outage alone is three minutes
def test_a_three_minute_outage_fails_nothing_and_recovers_each_once(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RESUME_ALL)
    with (
        serve_in_thread(create_app(emulator_config(execute_runs=False))) as service_url,
        httpx.Client(base_url=service_url, timeout=30) as control,
    ):
        seeded = control.post("/_emulator/dlq", json={"messages": workflows(CALLBACKS)})
        dlq_ids: list[str] = seeded.json()["dlqIds"]
        half = CALLBACKS // 2
        with serving(tmp_path, SERVICE_URL=service_url, RULES=str(rules)) as served:
            post_callbacks(served, dlq_ids[:half])
            outage_started = time.monotonic()
            for number, (mode, seconds) in enumerate(OUTAGE):
                control.post("/_emulator/outage", json={"mode": mode, "seconds": seconds})
                if number == 0:  # the rest arrive while the service is down
                    post_callbacks(served, dlq_ids[half:])
                    during = status(served)["states"]
                time.sleep(max(0.0, outage_started + sum(s for _, s in OUTAGE[: number + 1])
                               - time.monotonic()))  # fmt: skip
            control.delete("/_emulator/outage")
            in_outage = status(served)["states"]
            recovered_by = time.monotonic() + 240
            while sum(status(served)["states"][s] for s in ("done", "gone", "failed")) < CALLBACKS:
                assert time.monotonic() < recovered_by, status(served)
                time.sleep(1)
            final = status(served)
            _, logs = served.stop()

        journal: list[dict[str, Any]] = control.get("/_emulator/journal").json()
        runs: list[dict[str, Any]] = control.get("/_emulator/runs").json()

    # Nothing failed, and nothing was given up while the service was away.
    assert during["failed"] == in_outage["failed"] == 0
    assert {state: n for state, n in final["states"].items() if n} == {"done": CALLBACKS}
    # Exactly once: one run per dlqId, and each dlqId in one bulk call that succeeded.
    assert_recovered_once(journal, runs, dlq_ids)
    # No hot loop: while the service was down, a probe now and then, not a stream.
    tried_in_outage = [call for call in journal if call.get("outage")]
    assert 0 < len(tried_in_outage) < 300, len(tried_in_outage)
    # The log did not flood: a line a dlqId decided and one a bulk call (how many calls
    # depends on the machine's pace), and the outage's thousands of failed tries folded
    # into a few lines. No secret is in any line of it.
    lines = logs.splitlines()
    events = Counter(json.loads(line).get("event") for line in lines)
    assert events.pop("decided") == CALLBACKS
    assert events.pop("batch sent") <= len([c for c in journal if c["path"] in BULK_PATHS])
    assert sum(events.values()) < 1000, events.most_common(10)
    assert not [line for line in lines if TOKEN in line or PASSWORD in line]
