"""Over real sockets: the emulator, a failing destination and a callback receiver."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import pytest

from daemon.emulator import EmulatorConfig, create_app
from daemon.http.serving import serve, serve_in_thread
from tests.emulator.support import BEARER, SIGNING_KEY_CURRENT, Received, Sink, idle, seed


@dataclass
class Served:
    sink: Sink
    url: str


@pytest.fixture
def destination() -> Iterator[Served]:
    """A server whose /work answers 503, as a destination that is down."""
    sink = Sink(statuses={"/work": 503}, bodies={"/work": b"service unavailable"})
    with serve_in_thread(sink) as url:
        yield Served(sink, url)


@pytest.fixture
def receiver() -> Iterator[Served]:
    """A server taking failure callbacks at /callbacks."""
    sink = Sink()
    with serve_in_thread(sink) as url:
        yield Served(sink, url)


@pytest.fixture
async def service(config: EmulatorConfig) -> AsyncIterator[httpx.AsyncClient]:
    """The emulator on a loopback socket, with its own outbound client."""
    async with (
        serve(create_app(config)) as url,
        httpx.AsyncClient(base_url=url, headers=BEARER, timeout=10) as client,
    ):
        yield client


def verified_claims(request: Received, url: str) -> dict[str, Any]:
    """The signature's claims, checked the way recoveryd checks them."""
    claims: dict[str, Any] = jwt.decode(
        request.headers["service-signature"],
        SIGNING_KEY_CURRENT,
        algorithms=["HS256"],
        issuer="Service",
        options={"require": ["exp", "nbf", "iat", "sub", "iss", "jti"]},
    )
    assert claims["sub"] == url
    digest = base64.urlsafe_b64encode(hashlib.sha256(request.body).digest()).decode()
    assert claims["body"].rstrip("=") == digest.rstrip("=")
    return claims


async def test_failed_delivery_is_dead_lettered_and_called_back(
    service: httpx.AsyncClient, destination: Served, receiver: Served
) -> None:
    """A 503 destination: after the retries a DLQ entry, and a signed failure callback."""
    callback_url = f"{receiver.url}/callbacks"
    response = await service.post(
        "/_emulator/publish",
        params={"wait": "true"},
        json={"url": f"{destination.url}/work", "body": '{"order": 42}', "maxRetries": 2,
              "failureCallback": callback_url},
    )  # fmt: skip
    [outcome] = response.json()["outcomes"]
    assert len(destination.sink.at("/work")) == 3
    message = (await service.get(f"/v2/dlq/{outcome['dlqId']}")).json()
    assert (message["responseStatus"], message["responseBody"]) == (503, "service unavailable")
    [callback] = receiver.sink.at("/callbacks")
    verified_claims(callback, callback_url)
    body = json.loads(callback.body)
    assert (body["dlqId"], body["status"], body["retried"]) == (outcome["dlqId"], 503, 2)
    assert base64.b64decode(body["body"]) == b"service unavailable"


async def test_resumed_run_that_fails_again_comes_back(
    service: httpx.AsyncClient, destination: Served, receiver: Served
) -> None:
    """A resumed run whose workflow URL still fails re-enters the DLQ under its new run id,
    and a new signed failure callback names it."""
    callback_url = f"{receiver.url}/callbacks"
    [old_dlq_id] = await seed(
        service,
        {"url": f"{destination.url}/work", "workflowRunId": "wfr_old", "maxRetries": 1,
         "failureCallback": callback_url, "labels": ["billing"]},
    )  # fmt: skip
    response = await service.post("/v2/workflows/dlq/resume", params={"dlqIds": old_dlq_id})
    [run] = response.json()["workflowRuns"]
    await idle(service)
    assert (await service.get(f"/v2/dlq/{old_dlq_id}")).status_code == 404
    [entry] = (await service.get("/_emulator/dlq")).json()
    assert entry["workflowRunId"] == run["workflowRunId"]
    assert entry["header"]["Service-Workflow-Runid"] == [run["workflowRunId"]]
    [callback] = receiver.sink.at("/callbacks")
    verified_claims(callback, callback_url)
    body = json.loads(callback.body)
    assert (body["dlqId"], body["workflowRunId"]) == (entry["dlqId"], run["workflowRunId"])
    assert body["workflowCreatedAt"] == run["workflowCreatedAt"]
    [record] = (await service.get("/_emulator/runs")).json()
    assert (record["status"], record["resultDlqId"]) == ("failed", entry["dlqId"])
    attempts = destination.sink.at("/work")
    assert [r.headers["service-workflow-runid"] for r in attempts] == [run["workflowRunId"]] * 2
    assert {r.headers["service-label"] for r in attempts} == {"billing"}
