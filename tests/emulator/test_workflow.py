"""The workflow protocol over real HTTP: runs started by an Init message, each step
delivered with the run's history, the next published back, failures, resume and restart."""

from __future__ import annotations

import asyncio
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
    failure_block,
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
    waits: list[float]  # every wait the emulator asked for, in seconds

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
    """The emulator and a workflow endpoint, each on its own socket; the endpoint's
    `/callbacks` stands for recoveryd, which gets a copy of every failure callback."""
    app = StepApp()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # recorded, and kept short
        waits.append(seconds)
        await asyncio.sleep(min(seconds, 0.01))

    async with serve(app) as app_url:
        config = dataclasses.replace(config, failure_callback_copy=f"{app_url}/callbacks")
        async with (
            serve(create_app(config, sleep=sleep)) as service_url,
            httpx.AsyncClient(base_url=service_url, headers=BEARER, timeout=10) as service,
        ):
            app.service = service_url
            yield World(service, app, f"{app_url}/wf", waits)


async def fail_once(world: World) -> dict[str, Any]:
    """A run whose step 2 fails its one retry: its DLQ message."""
    world.app.failing = True
    block = failure_block(world.url, "wfr_one", world.url)
    await world.trigger(**{"Upstash-Retries": "1", **block})
    [message] = await world.dlq()
    return message


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


async def test_step_out_of_retries_lands_the_run_in_the_dlq(world: World) -> None:
    """The Init's retries cover every step; the failed step's message is dead-lettered."""
    message = await fail_once(world)
    assert world.app.ran == {1: 1, 2: 2}
    assert (message["workflowRunId"], message["workflowUrl"]) == ("wfr_one", world.url)
    assert message["maxRetries"] == 1
    assert json.loads(message["body"])["stepName"] == "step-1"
    assert (await world.runs())["wfr_one"]["status"] == "failed"


async def test_step_own_retries_win_over_the_runs(world: World) -> None:
    """A step carrying its own `Retries` (the Python SDK's way) is retried that often."""
    world.app.failing, world.app.retries = True, 0
    await world.trigger(**{"Upstash-Retries": "2"})
    assert world.app.ran == {1: 1, 2: 1}


async def test_failure_callback_reaches_the_failure_function_as_the_sdks_read_it(
    world: World,
) -> None:
    """Run headers, no SDK version, the failed answer and the initial payload as source."""
    message = await fail_once(world)
    [callback] = world.app.failures
    assert callback.headers["upstash-workflow-failure-callback"] == "true"
    assert callback.headers["upstash-workflow-runid"] == "wfr_one"
    assert callback.headers["upstash-workflow-url"] == world.url
    assert "upstash-workflow-sdk-version" not in callback.headers
    payload = json.loads(callback.body)
    assert (payload["status"], payload["url"]) == (500, world.url)
    assert payload["dlqId"] == message["dlqId"]
    assert json.loads(base64.b64decode(payload["body"]))["message"] == "step 2 failed"
    assert base64.b64decode(payload["sourceBody"]).decode() == INITIAL
    assert payload["workflowRunId"] == "wfr_one"
    assert isinstance(payload["header"], dict)


async def test_failure_callback_has_the_services_content_type_alone(world: World) -> None:
    """A `Content-Type` the SDKs forward to the failure URL does not double the callback's."""
    world.app.failing = True
    block = failure_block(world.url, "wfr_one", world.url)
    forwarded = {"Upstash-Failure-Callback-Forward-Content-Type": "text/plain"}
    await world.trigger(**{"Upstash-Retries": "0", **block, **forwarded})
    [pairs] = world.app.failure_raw_headers
    assert [value for name, value in pairs if name == "content-type"] == ["application/json"]


async def test_failure_callback_copy_goes_to_the_copy_url(world: World) -> None:
    """recoveryd's copy has the same body as the failure function's callback."""
    await fail_once(world)
    [copy] = world.app.copies
    [callback] = world.app.failures
    assert json.loads(copy.body) == json.loads(callback.body)


async def test_resume_continues_from_the_failed_step(world: World) -> None:
    """The new run replays step 1 from its history and runs steps 2 and 3."""
    message = await fail_once(world)
    world.app.failing = False
    response = await world.service.post(
        "/v2/workflows/dlq/resume", params={"dlqIds": message["dlqId"]}
    )
    assert response.status_code == 200, response.text
    [new] = response.json()["workflowRuns"]
    await idle(world.service)
    assert world.app.ran == {1: 1, 2: 3, 3: 1}
    assert (await world.runs())[new["workflowRunId"]]["status"] == "completed"
    resumed = [
        d
        for d in world.app.deliveries
        if d.headers["upstash-workflow-runid"] == new["workflowRunId"]
    ]
    assert [world.app.outputs(d) for d in resumed] == [[1], [1, 2], [1, 2, 3]]


async def test_restart_runs_from_the_first_step(world: World) -> None:
    """The new run starts from the initial payload: step 1 runs again."""
    message = await fail_once(world)
    world.app.failing = False
    response = await world.service.post(f"/v2/workflows/dlq/restart/{message['dlqId']}")
    assert response.status_code == 200, response.text
    await idle(world.service)
    assert world.app.ran == {1: 2, 2: 3, 3: 1}
    assert (await world.runs())[response.json()["workflowRunId"]]["status"] == "completed"


async def test_resume_overrides_apply_to_the_remaining_steps(world: World) -> None:
    """A later step of the resumed run gets the override's retries, not its own."""
    world.app.retries = 1  # stamped on every step, as the Python SDK does
    message = await fail_once(world)
    world.app.fail_step = 3
    response = await world.service.post(
        f"/v2/workflows/dlq/resume/{message['dlqId']}", headers={"Upstash-Retries": "0"}
    )
    assert response.status_code == 200, response.text
    await idle(world.service)
    assert world.app.ran == {1: 1, 2: 3, 3: 1}
    [again] = await world.dlq()
    assert again["maxRetries"] == 0
    assert again["workflowRunId"] == response.json()["workflowRunId"]


async def test_non_retryable_answer_skips_the_remaining_retries(world: World) -> None:
    """489 with `NonRetryable-Error` (the JavaScript SDK's) dead-letters the step at once."""
    world.app.fail_status, world.app.fail_headers = 489, {"Upstash-NonRetryable-Error": "true"}
    message = await fail_once(world)
    assert world.app.ran == {1: 1, 2: 1}
    assert message["responseStatus"] == 489
    [callback] = world.app.failures
    assert json.loads(callback.body)["retried"] == 0


async def test_retry_after_answer_sets_the_wait_before_the_retry(world: World) -> None:
    """429 with `Retry-After` (the JavaScript SDK's retry-after error) is waited out."""
    world.app.fail_status, world.app.fail_headers = 429, {"Retry-After": "7"}
    await fail_once(world)
    assert world.app.ran == {1: 1, 2: 2}
    assert 7.0 in world.waits


async def test_batch_with_a_malformed_message_starts_nothing(world: World) -> None:
    """400 naming the header, and the well-formed message before it is not taken either."""
    good = init_item(world.url, "wfr_good", INITIAL)
    bad = init_item(world.url, "wfr_bad", INITIAL, **{"Upstash-Retries": "many"})
    response = await world.service.post("/v2/batch", json=[good, bad])
    assert response.status_code == 400
    assert "Upstash-Retries" in response.json()["error"]
    await idle(world.service)
    assert await world.runs() == {}
    assert world.app.deliveries == []


async def test_sleep_step_is_delivered_after_its_delay(world: World) -> None:
    """A step published with `Delay` waits (capped at max_delay_seconds) before delivery."""
    item = init_item(world.url, "wfr_one", INITIAL, **{"Upstash-Delay": "10s"})
    response = await world.service.post("/v2/batch", json=[item])
    assert response.status_code == 200, response.text
    await idle(world.service)
    assert world.waits == [0.01]
    assert (await world.runs())["wfr_one"]["status"] == "completed"


async def test_run_labels_reach_its_steps_and_its_dead_letter(world: World) -> None:
    """The Init's `Label` is on every delivery and on the DLQ message."""
    world.app.failing = True
    await world.trigger(**{"Upstash-Label": "billing", "Upstash-Retries": "0"})
    assert [d.headers["upstash-label"] for d in world.app.deliveries] == ["billing"] * 2
    [message] = await world.dlq()
    wire = (await world.service.get(f"/v2/dlq/{message['dlqId']}")).json()
    assert (wire["labels"], wire["label"]) == (["billing"], "billing")


@pytest.mark.parametrize(("answer", "state"), [(200, "CALLBACK_SUCCESS"), (500, "CALLBACK_FAIL")])
async def test_failure_function_outcome_is_the_dead_letters_state(
    world: World, answer: int, state: str
) -> None:
    """The failed run's listing says whether its failure function took the callback."""
    world.app.failure_status = answer
    await fail_once(world)
    [listed] = (await world.service.get("/v2/workflows/dlq")).json()["messages"]
    assert listed["failureFunctionState"] == state


async def test_retry_delay_expression_sets_the_wait_before_each_retry(world: World) -> None:
    """`Retry-Delay`, ms over `retried` (the retries made so far), spaces a step's retries."""
    world.app.failing = True
    # Under the emulator's cap on delays here (max_delay_seconds, 10 ms).
    await world.trigger(**{"Upstash-Retries": "2", "Upstash-Retry-Delay": "pow(2, retried) * 3"})
    assert world.app.ran == {1: 1, 2: 3}
    assert world.waits == [0.003, 0.006]
