"""Faults injected into the next service calls."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from daemon.emulator import Emulator, create_app
from tests.emulator.support import BEARER


async def fault(client: httpx.AsyncClient, **spec: Any) -> None:
    response = await client.post("/_emulator/faults", json=spec)
    assert response.status_code == 200, response.text


async def test_status_fault_answers_that_status_then_stops(client: httpx.AsyncClient) -> None:
    """Two 503s with an error body, then the real answer."""
    await fault(client, kind="status", status=503, times=2)
    responses = [await client.get("/v2/dlq/1-0") for _ in range(3)]
    assert [r.status_code for r in responses] == [503, 503, 404]
    assert set(responses[0].json()) == {"error"}


async def test_fault_applies_only_to_its_paths(client: httpx.AsyncClient) -> None:
    """A fault for /v2/topics leaves /v2/dlq alone."""
    await fault(client, kind="status", status=500, paths=["/v2/topics"])
    assert (await client.get("/v2/dlq/1-0")).status_code == 404
    assert (await client.get("/v2/topics/x")).status_code == 500


async def test_rate_limit_fault_sends_retry_after_when_asked(client: httpx.AsyncClient) -> None:
    """A 429 with the Burst headers and the Retry-After the fault gives."""
    await fault(client, kind="rate_limit", retryAfter=2, limit=9)
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"
    assert response.headers["Burst-RateLimit-Limit"] == "9"
    assert response.headers["Burst-RateLimit-Remaining"] == "0"


async def test_latency_fault_waits_then_answers(app: Any) -> None:
    """The call is held for the fault's seconds (through the injected sleep), then answered."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    held = create_app(app.state.emulator.config, clock=app.state.emulator.clock, sleep=sleep)
    transport = httpx.ASGITransport(app=held)
    async with httpx.AsyncClient(transport=transport, base_url="http://e", headers=BEARER) as c:
        await fault(c, kind="latency", seconds=0.75)
        assert (await c.get("/v2/dlq/1-0")).status_code == 404
    assert slept == [0.75]


async def test_drop_fault_breaks_the_connection_in_process(client: httpx.AsyncClient) -> None:
    """In-process the client sees the protocol error a real drop causes."""
    await fault(client, kind="drop")
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/v2/dlq/1-0")
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


async def test_drop_fault_breaks_a_real_connection(served: httpx.AsyncClient) -> None:
    """Over a socket the answer is cut off mid-body; the next call is answered."""
    await fault(served, kind="drop")
    with pytest.raises(httpx.RemoteProtocolError):
        await served.get("/v2/dlq/1-0")
    assert (await served.get("/v2/dlq/1-0")).status_code == 404


async def test_cleared_faults_no_longer_apply(client: httpx.AsyncClient) -> None:
    """DELETE /_emulator/faults disarms every fault."""
    await fault(client, kind="status", status=500, times=10)
    assert len((await client.get("/_emulator/faults")).json()) == 1
    await client.delete("/_emulator/faults")
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


async def test_unknown_fault_kind_is_400(client: httpx.AsyncClient) -> None:
    """The control API validates what it is given."""
    response = await client.post("/_emulator/faults", json={"kind": "gremlins"})
    assert response.status_code == 400


async def test_status_fault_sends_retry_after_when_asked(client: httpx.AsyncClient) -> None:
    """A 503 fault with retryAfter carries that Retry-After."""
    await fault(client, kind="status", status=503, retryAfter=3)
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"


async def test_status_fault_has_no_retry_after_unless_asked(client: httpx.AsyncClient) -> None:
    """Without retryAfter a status fault promises nothing, as the service does."""
    await fault(client, kind="status", status=503)
    assert "Retry-After" not in (await client.get("/v2/dlq/1-0")).headers


async def test_rate_limit_fault_without_headers_sends_a_bare_429(
    client: httpx.AsyncClient, emulator: Emulator
) -> None:
    """headers: false leaves out every Burst header, even with an account limit set."""
    emulator.max_requests_per_second = 50
    await fault(client, kind="rate_limit", headers=False)
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 429
    assert set(response.json()) == {"error"}
    assert not [name for name in response.headers if name.lower().startswith("burst-")]
    assert "Retry-After" not in response.headers


async def test_rate_limit_fault_without_headers_keeps_retry_after(
    client: httpx.AsyncClient,
) -> None:
    """headers: false with retryAfter: a 429 whose only hint is Retry-After."""
    await fault(client, kind="rate_limit", headers=False, retryAfter=1.5)
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1.5"
    assert "Burst-RateLimit-Limit" not in response.headers


async def test_burst_headers_return_after_a_headerless_fault(
    client: httpx.AsyncClient, emulator: Emulator
) -> None:
    """Only the faulted answer goes without the account limit's headers."""
    emulator.max_requests_per_second = 50
    await fault(client, kind="rate_limit", headers=False)
    await client.get("/v2/dlq/1-0")
    assert (await client.get("/v2/dlq/1-0")).headers["Burst-RateLimit-Limit"] == "50"
