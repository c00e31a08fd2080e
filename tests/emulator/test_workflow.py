"""The workflow protocol over real HTTP: runs started by an Init message, each step
delivered with the run's history, the next published back, failures, resume and restart."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from daemon.emulator import EmulatorConfig, create_app
from daemon.http.serving import serve
from tests.emulator.support import (
    BEARER,
    StepApp,
    idle,
    init_item,
    verify_signature,
)

INITIAL = '{"order":42}'


@dataclasses.dataclass
class World:
    service: httpx.AsyncClient
    app: StepApp
    url: str  # the workflow endpoint

    async def trigger(self, run_id: str = "wfr_one", **headers: str) -> list[dict[str, Any]]:
        item = init_item(self.url, run_id, INITIAL, **headers)
        response = await self.service.post("/v2/batch", json=[item])
        assert response.status_code == 200, response.text
        await idle(self.service)
        answer: list[dict[str, Any]] = response.json()
        return answer

    async def runs(self) -> dict[str, dict[str, Any]]:
        listed = (await self.service.get("/_emulator/workflows")).json()
        return {run["workflowRunId"]: run for run in listed}

    async def dlq(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = (await self.service.get("/_emulator/dlq")).json()
        return messages


@pytest.fixture
def config(config: EmulatorConfig) -> EmulatorConfig:
    return dataclasses.replace(config, header_prefix="Upstash")


@pytest.fixture
async def world(config: EmulatorConfig) -> AsyncIterator[World]:
    async with serve(create_app(config)) as service_url:
        app = StepApp(service=service_url)
        async with (
            serve(app) as app_url,
            httpx.AsyncClient(base_url=service_url, headers=BEARER, timeout=10) as service,
        ):
            yield World(service, app, f"{app_url}/wf")


async def test_init_message_delivers_the_initial_payload_signed(world: World) -> None:
    """The first delivery's history is the initial payload alone, signed as the SDKs check."""
    world.app.steps = 0
    [answer] = await world.trigger()
    assert (answer["url"], answer["deduplicated"]) == (world.url, False)
    [first] = world.app.deliveries
    assert json.loads(first.body) == [
        {"messageId": answer["messageId"], "body": base64.b64encode(INITIAL.encode()).decode(),
         "callType": "step"}
    ]  # fmt: skip
    assert first.headers["upstash-workflow-sdk-version"] == "1"
    assert first.headers["upstash-workflow-runid"] == "wfr_one"
    assert first.headers["upstash-workflow-url"] == world.url
    assert first.headers["upstash-message-id"] == answer["messageId"]
    assert verify_signature(first.headers["upstash-signature"], first.body)["iss"] == "Upstash"


async def test_three_step_run_runs_each_step_once_and_completes(world: World) -> None:
    """Each delivery carries one more step's result, until the SDK ends the run."""
    await world.trigger()
    assert world.app.ran == {1: 1, 2: 1, 3: 1}
    assert [world.app.outputs(d) for d in world.app.deliveries] == [[], [1], [1, 2], [1, 2, 3]]
    run = (await world.runs())["wfr_one"]
    assert (run["status"], run["steps"]) == ("completed", 3)


async def test_forwarded_headers_reach_every_step_without_stale_service_ones(
    world: World,
) -> None:
    """A user header reaches every step; the service's own headers come once, fresh."""
    await world.trigger(**{"Upstash-Forward-X-Tenant": "acme"})
    assert [d.headers["x-tenant"] for d in world.app.deliveries] == ["acme"] * 4
    for pairs in world.app.raw_headers:
        names = [name for name, _ in pairs]
        for own in ("upstash-signature", "upstash-message-id", "host", "content-length"):
            assert names.count(own) == 1, (own, pairs)


async def test_init_of_an_existing_run_is_deduplicated(world: World) -> None:
    """A second Init with the same run id starts nothing and says so."""
    await world.trigger()
    [answer] = await world.trigger()
    assert answer["deduplicated"] is True
    assert world.app.ran == {1: 1, 2: 1, 3: 1}


async def test_step_published_to_an_ended_run_is_refused(world: World) -> None:
    """400, which the SDKs read as "the run has ended"."""
    await world.trigger()
    header = {"Upstash-Workflow-Init": "false", "Upstash-Workflow-RunId": "wfr_one"}
    item = {"destination": world.url, "headers": header, "body": "{}"}
    response = await world.service.post("/v2/batch", json=[item])
    assert response.status_code == 400, response.text


async def test_plain_publish_lets_the_sdk_start_the_run_itself(world: World) -> None:
    """A plain message to the endpoint is the SDK's first invocation; its Init runs the run."""
    response = await world.service.post(
        f"/v2/publish/{world.url}", content=INITIAL, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text
    await idle(world.service)
    [run] = (await world.runs()).values()
    assert run["status"] == "completed"
    assert run["workflowRunId"].startswith("wfr_first_")
    assert world.app.ran == {1: 1, 2: 1, 3: 1}
