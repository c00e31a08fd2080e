"""GET /v2/dlq/{dlqId} and the bearer auth of the message operations."""

from __future__ import annotations

import httpx

from tests.emulator.support import START, seed, workflow

ALWAYS = {
    "messageId", "url", "method", "maxRetries", "notBefore", "createdAt", "responseStatus",
    "dlqId", "callerIP",
}  # fmt: skip


async def test_message_carries_the_always_present_fields(client: httpx.AsyncClient) -> None:
    """A seeded message comes back with every field the service always sends."""
    [dlq_id] = await seed(client, {"url": "https://a.example.com/x", "responseStatus": 503})
    response = await client.get(f"/v2/dlq/{dlq_id}")
    assert response.status_code == 200
    message = response.json()
    assert set(message) == ALWAYS
    assert message["dlqId"] == dlq_id
    assert message["createdAt"] == int(START * 1000)
    assert message["responseStatus"] == 503


async def test_sample_message_round_trips(client: httpx.AsyncClient) -> None:
    """A message seeded in the shape of samples/dlq-message-url-group.json reads back as is."""
    sample = {
        "messageId": "msg_26hZCxZCuWyyTWPmSVBrNC1RADxwM",
        "topicName": "orders",
        "endpointName": "fulfilment",
        "url": "https://fulfilment.example.com/hooks/order",
        "method": "POST",
        "header": {"Content-Type": ["application/json"]},
        "body": '{"order": 42}',
        "maxRetries": 3,
        "notBefore": 1763711990000,
        "createdAt": 1763711990000,
        "callback": "https://app.example.com/qstash/callback",
        "failureCallback": "https://recoveryd.example.com/callbacks",
        "callerIP": "203.0.113.7",
        "dlqId": "1763712000123-0",
        "responseStatus": 410,
        "responseHeader": {"Content-Type": ["text/plain"]},
        "responseBody": "gone",
    }
    await seed(client, sample)
    assert (await client.get("/v2/dlq/1763712000123-0")).json() == sample


async def test_workflow_message_carries_labels_and_flow_control_key(
    client: httpx.AsyncClient,
) -> None:
    """Like real DLQ messages, a workflow entry shows labels and flowControlKey."""
    [dlq_id] = await seed(client, workflow("wfr_1", labels=["billing"], flowControlKey="fk"))
    message = (await client.get(f"/v2/dlq/{dlq_id}")).json()
    assert message["labels"] == ["billing"]
    assert message["flowControlKey"] == "fk"
    assert message["header"]["Service-Workflow-Runid"] == ["wfr_1"]


async def test_unknown_dlq_id_is_404(client: httpx.AsyncClient) -> None:
    """A dlqId never in the DLQ is a 404 with an error body."""
    response = await client.get("/v2/dlq/1700000000000-0")
    assert response.status_code == 404
    assert set(response.json()) == {"error"}


async def test_message_is_404_once_removed(client: httpx.AsyncClient) -> None:
    """After a resume took it out of the DLQ, the message is a 404."""
    [dlq_id] = await seed(client, workflow("wfr_1"))
    assert (await client.get(f"/v2/dlq/{dlq_id}")).status_code == 200
    await client.post("/v2/workflows/dlq/resume", params={"dlqIds": dlq_id})
    assert (await client.get(f"/v2/dlq/{dlq_id}")).status_code == 404


async def test_missing_token_is_401(anonymous: httpx.AsyncClient) -> None:
    """No Authorization header: 401 with an error body."""
    response = await anonymous.get("/v2/dlq/1-0")
    assert response.status_code == 401
    assert "error" in response.json()


async def test_wrong_token_is_401(anonymous: httpx.AsyncClient) -> None:
    """A token that is not the account's: 401."""
    response = await anonymous.get("/v2/dlq/1-0", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401


async def test_basic_credentials_do_not_open_message_operations(
    anonymous: httpx.AsyncClient,
) -> None:
    """The message operations take the bearer token only."""
    response = await anonymous.get("/v2/dlq/1-0", headers={"Authorization": "Basic b3BzOnB3"})
    assert response.status_code == 401


async def test_unknown_route_answers_the_error_shape(client: httpx.AsyncClient) -> None:
    """Even a path the service does not have answers {"error"}."""
    response = await client.get("/v2/nothing-here")
    assert response.status_code == 404
    assert set(response.json()) == {"error"}
