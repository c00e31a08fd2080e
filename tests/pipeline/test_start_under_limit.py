"""A start with a backlog at a rate limit the daemon has not learned yet: the first calls
are spread out, not burst, and once the limit is known no call earns a 429."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.pipeline.support import FINAL, RESUME_ALL
from tests.processes import emulator_process
from tests.support import callback_json, emulator_config, running_recoveryd, workflows

WAITING = 200
SETTLED = 100  # seconds of calls at the limit, well past the learning of it
LIMIT = 20  # requests per second


async def test_a_backlog_at_an_unlearned_limit_earns_at_most_one_429(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RESUME_ALL)
    config = emulator_config(execute_runs=False, max_requests_per_second=LIMIT)
    with emulator_process(config) as service_url:
        async with httpx.AsyncClient(base_url=service_url, timeout=30) as control:
            seeded = await control.post("/_emulator/dlq", json={"messages": workflows(WAITING)})
            dlq_ids: list[str] = seeded.json()["dlqIds"]
            # Stored while the service cannot be reached: they wait in the inbox.
            async with running_recoveryd(tmp_path, RULES=str(rules)) as offline:
                for dlq_id in dlq_ids:
                    body = callback_json(dlq_id, "failure-callback-workflow.json")
                    assert (await offline.post(body)).status_code == 200
            await control.delete("/_emulator/journal")

            async with running_recoveryd(
                tmp_path, SERVICE_URL=service_url, RULES=str(rules)
            ) as recoveryd:
                async with asyncio.timeout(120):
                    while True:
                        states = (await recoveryd.admin.get("/api/v1/status")).json()["states"]
                        if sum(states[state] for state in FINAL) >= SETTLED:
                            break
                        await asyncio.sleep(0.2)
            journal = (await control.get("/_emulator/journal")).json()
            stats = (await control.get("/_emulator/stats")).json()

    assert len(journal) >= SETTLED
    assert sum(call["status"] == 429 for call in journal) <= 1
    assert stats["max_requests_in_window"] <= LIMIT + 1  # the one that teaches the limit
