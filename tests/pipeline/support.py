"""The pipeline as its tests drive it: the emulator and recoveryd on loopback, the
callbacks of seeded DLQ entries sent signed, and what both sides recorded read back."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from daemon.emulator import Emulator, create_app
from daemon.http.serving import serve_in_thread
from tests.processes import emulator_process
from tests.support import LOOPBACK_TLS, Recoveryd, callback_json, emulator_config, running_recoveryd

BULK_PATHS = ("/v2/workflows/dlq/resume", "/v2/workflows/dlq/restart")
# Every workflow run resumed, in small batches flushed quickly.
RESUME_ALL = """\
version: 1
rules:
  - name: resume-all
    match: {workflow: true}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
"""
FINAL = ("done", "gone", "skipped", "failed", "dry-run")


@dataclass
class Harness:
    recoveryd: Recoveryd
    control: httpx.AsyncClient  # the emulator's control API
    on_thread: Emulator | None  # its state when it runs on a thread here, else None

    @property
    def emulator(self) -> Emulator:
        """The emulator's state, on the emulator's thread: read it, don't change it."""
        if self.on_thread is None:
            raise AttributeError("the emulator runs apart: read it through `control`")
        return self.on_thread

    async def seed(self, messages: list[dict[str, Any]]) -> list[str]:
        response = await self.control.post("/_emulator/dlq", json={"messages": messages})
        response.raise_for_status()
        ids: list[str] = response.json()["dlqIds"]
        return ids

    async def send_callbacks(self, dlq_ids: list[str]) -> None:
        """The failure callback of each dlqId, signed, as the service sends it."""
        for dlq_id in dlq_ids:
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            response = await self.recoveryd.post(body)
            assert response.status_code == 200, response.text

    async def status(self) -> dict[str, Any]:
        response = await self.recoveryd.admin.get("/api/v1/status")
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    async def settled(self, count: int, seconds: float = 30.0) -> dict[str, int]:
        """Wait until `count` dlqIds are all in a final state; the counts by state."""
        async with asyncio.timeout(seconds):
            while True:
                states: dict[str, int] = (await self.status())["states"]
                if sum(states[state] for state in FINAL) >= count:
                    return {state: n for state, n in states.items() if n}
                await asyncio.sleep(0.05)

    async def record(self, dlq_id: str) -> dict[str, Any]:
        response = await self.recoveryd.admin.get(f"/api/v1/dlq/{dlq_id}")
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    async def journal(self) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = (await self.control.get("/_emulator/journal")).json()
        return calls

    async def bulk_calls(self) -> list[dict[str, Any]]:
        """The bulk resume/restart calls the emulator answered, in order."""
        return [call for call in await self.journal() if call["path"] in BULK_PATHS]

    async def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = (await self.control.get("/_emulator/runs")).json()
        return runs

    async def fault(self, **fault: Any) -> None:
        (await self.control.post("/_emulator/faults", json=fault)).raise_for_status()


def dlq_ids_of(call: dict[str, Any]) -> list[str]:
    return [value for name, value in call["query"] if name == "dlqIds"]


def sent_per_dlq_id(calls: list[dict[str, Any]]) -> Counter[str]:
    """How many answered-200 bulk calls named each dlqId."""
    return Counter(dlq_id for call in calls if call["status"] == 200 for dlq_id in dlq_ids_of(call))


def assert_recovered_once(
    journal: list[dict[str, Any]], runs: list[dict[str, Any]], dlq_ids: list[str]
) -> None:
    """Exactly once, as the service saw it: one run made from each dlqId, and each dlqId
    in one bulk call that was answered 200."""
    assert Counter(run["sourceDlqId"] for run in runs) == Counter(dict.fromkeys(dlq_ids, 1))
    bulk_calls = [call for call in journal if call["path"] in BULK_PATHS]
    assert sent_per_dlq_id(bulk_calls) == Counter(dict.fromkeys(dlq_ids, 1))


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path,
    rules: str,
    *,
    emulator: dict[str, Any] | None = None,
    apart: bool = False,
    **options: Any,
) -> AsyncIterator[Harness]:
    """The emulator (runs are recorded, not executed) and recoveryd with `rules` (the
    text of a rules file); `options` go to `running_recoveryd`. The emulator runs on its
    own thread and loop, as the service is another machine: sharing recoveryd's loop would
    delay its arrivals by recoveryd's work. `apart` puts it in its own process, for tests
    that assert on how many calls arrive in a second (see `emulator_process`)."""
    path = tmp_path / "rules.yaml"
    path.write_text(rules)
    # A limit the service announces on every answer, as QStash does: the daemon learns it
    # from the first answer instead of starting slow (tests of the slow start set none).
    config = emulator_config(
        **{"execute_runs": False, "max_requests_per_second": 1000, **(emulator or {})}
    )
    app = None if apart else create_app(config)
    served = emulator_process(config) if app is None else serve_in_thread(app)
    with served as service_url:
        async with (
            httpx.AsyncClient(base_url=service_url, timeout=30, verify=LOOPBACK_TLS) as control,
            running_recoveryd(
                tmp_path, SERVICE_URL=service_url, RULES=str(path), **options
            ) as recoveryd,
        ):
            yield Harness(recoveryd, control, None if app is None else app.state.emulator)
