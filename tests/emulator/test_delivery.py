"""Deliveries through POST /_emulator/publish: retries, dead-lettering and callbacks."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.emulator import EmulatorConfig, create_app
from tests.emulator.support import Sink, idle

SAMPLES = Path(__file__).parents[1] / "testdata" / "samples"
DEST = "https://dest.example.com/hook"
HOOK = "https://hooks.example.com/failed"


async def publish(client: httpx.AsyncClient, **message: Any) -> dict[str, Any]:
    response = await client.post("/_emulator/publish", params={"wait": "true"}, json=message)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def sample_keys(name: str) -> set[str]:
    return set(json.loads((SAMPLES / name).read_text()))


async def test_delivered_message_leaves_no_dlq_entry(client: httpx.AsyncClient, sink: Sink) -> None:
    """A 2xx on the first attempt ends the delivery."""
    result = await publish(client, url=DEST, body="hi")
    [outcome] = result["outcomes"]
    assert (outcome["state"], outcome["attempts"], outcome["dlqId"]) == ("delivered", 1, None)
    assert result["messageId"] == outcome["id"]
    [request] = sink.at("/hook")
    assert request.body == b"hi"
    assert request.headers["service-message-id"] == result["messageId"]
    assert "service-signature" in request.headers
    assert (await client.get("/_emulator/dlq")).json() == []


async def test_failing_message_is_retried_then_dead_lettered(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """1 + maxRetries attempts, then a DLQ entry holding the last answer."""
    sink.statuses["/hook"], sink.bodies["/hook"] = 503, b"unavailable"
    [outcome] = (await publish(client, url=DEST, maxRetries=2))["outcomes"]
    assert (outcome["state"], outcome["attempts"]) == ("failed", 3)
    assert [r.headers["service-retried"] for r in sink.at("/hook")] == ["0", "1", "2"]
    message = (await client.get(f"/v2/dlq/{outcome['dlqId']}")).json()
    assert (message["responseStatus"], message["responseBody"]) == (503, "unavailable")
    assert message["responseHeader"]["Content-Type"] == ["text/plain"]
    assert message["maxRetries"] == 2


async def test_binary_response_is_kept_as_base64(client: httpx.AsyncClient, sink: Sink) -> None:
    """A response body that is not UTF-8 goes to responseBodyBase64."""
    sink.statuses["/hook"], sink.bodies["/hook"] = 500, b"\xff\xfe"
    [outcome] = (await publish(client, url=DEST, maxRetries=0))["outcomes"]
    message = (await client.get(f"/v2/dlq/{outcome['dlqId']}")).json()
    assert message["responseBodyBase64"] == base64.b64encode(b"\xff\xfe").decode()
    assert "responseBody" not in message


async def test_url_group_gets_one_delivery_per_endpoint(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """Each endpoint gets its own message; a failing one is dead-lettered with its names."""
    sink.statuses["/b"] = 410
    group = {
        "name": "orders",
        "endpoints": [{"name": "a", "url": "https://a.example.com/a"}, {"url": "https://b/b"}],
    }
    await client.post("/_emulator/url-groups", json=group)
    outcomes = (await publish(client, topic="orders", maxRetries=0))["outcomes"]
    assert [o["state"] for o in outcomes] == ["delivered", "failed"]
    message = (await client.get(f"/v2/dlq/{outcomes[1]['dlqId']}")).json()
    assert message["topicName"] == "orders"
    assert "endpointName" not in message  # the endpoint has no name


async def test_failure_callback_has_the_service_shape(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """The failure callback carries exactly the fields of samples/failure-callback.json."""
    sink.statuses["/a"] = 503
    group = {"name": "orders", "endpoints": [{"name": "f", "url": "https://a.example.com/a"}]}
    await client.post("/_emulator/url-groups", json=group)
    [outcome] = (
        await publish(client, topic="orders", maxRetries=1, failureCallback=HOOK, body="{}")
    )["outcomes"]
    [received] = sink.at("/failed")
    body = json.loads(received.body)
    assert set(body) == sample_keys("failure-callback.json") - {"scheduleId"}
    assert (body["dlqId"], body["status"], body["retried"]) == (outcome["dlqId"], 503, 1)
    assert (body["topicName"], body["endpointName"]) == ("orders", "f")
    assert base64.b64decode(body["sourceBody"]) == b"{}"
    assert received.headers["content-type"] == "application/json"


async def test_workflow_failure_callback_names_the_run(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """A workflow run's failure callback adds workflowRunId and workflowCreatedAt."""
    sink.statuses["/hook"] = 500
    await publish(
        client, url=DEST, maxRetries=0, failureCallback=HOOK, workflowRunId="wfr_1",
        workflowCreatedAt=1763711900000, labels=["billing"],
    )  # fmt: skip
    body = json.loads(sink.at("/failed")[0].body)
    assert set(body) == sample_keys("failure-callback-workflow.json")
    assert (body["workflowRunId"], body["workflowCreatedAt"]) == ("wfr_1", 1763711900000)
    assert body["sourceHeader"]["Service-Label"] == ["billing"]


async def test_failure_callback_is_retried_until_it_lands(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """A callback receiver answering 500 gets 1 + callback_retries tries."""
    sink.statuses["/hook"] = sink.statuses["/failed"] = 500
    await publish(client, url=DEST, maxRetries=0, failureCallback=HOOK)
    [record] = (await client.get("/_emulator/callbacks")).json()
    assert (record["kind"], record["state"], record["attempts"]) == ("failure", "failed", 4)
    assert len(sink.at("/failed")) == 4


async def test_callback_is_sent_for_each_attempt(client: httpx.AsyncClient, sink: Sink) -> None:
    """`callback` hears about every delivery attempt."""
    sink.statuses["/hook"] = 500
    await publish(client, url=DEST, maxRetries=1, callback="https://hooks.example.com/each")
    await idle(client)
    statuses = [json.loads(r.body)["status"] for r in sink.at("/each")]
    assert statuses == [500, 500]


async def test_publish_needs_one_destination(client: httpx.AsyncClient) -> None:
    """Neither url nor topic, or both: 400."""
    for body in ({}, {"url": DEST, "topic": "t"}):
        assert (await client.post("/_emulator/publish", json=body)).status_code == 400


async def test_publish_to_a_missing_group_is_404(client: httpx.AsyncClient) -> None:
    """The URL Group must exist."""
    assert (await client.post("/_emulator/publish", json={"topic": "none"})).status_code == 404


async def test_publish_without_wait_answers_at_once(client: httpx.AsyncClient) -> None:
    """The answer lists the deliveries; idle waits for them."""
    response = await client.post("/_emulator/publish", json={"url": DEST})
    assert set(response.json()) == {"messageId", "deliveries"}
    await idle(client)
    [delivery] = (await client.get("/_emulator/deliveries")).json()
    assert delivery["done"]


@pytest.fixture
async def own_client_app(config: EmulatorConfig) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(config)  # the emulator's own outbound client, made in the lifespan
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://e") as client:
            yield client


async def test_unreachable_destination_is_status_zero(
    own_client_app: httpx.AsyncClient,
) -> None:
    """No answer at all (connection refused) is dead-lettered with responseStatus 0."""
    [outcome] = (await publish(own_client_app, url="http://127.0.0.1:9/x", maxRetries=0))[
        "outcomes"
    ]
    message = (await own_client_app.get("/_emulator/dlq")).json()[0]
    assert (outcome["lastStatus"], message["responseStatus"]) == (0, 0)
