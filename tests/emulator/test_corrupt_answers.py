"""The `corrupt_gzip` fault: answers httpx cannot decode, with or without the service acting."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from daemon.emulator import Emulator
from tests.emulator.support import PASSWORD, TOKEN, USERNAME, basic, seed, workflow

RESUME = "/v2/workflows/dlq/resume"


async def fault(client: httpx.AsyncClient, **spec: Any) -> None:
    response = await client.post("/_emulator/faults", json={"kind": "corrupt_gzip", **spec})
    assert response.status_code == 200, response.text


async def journal(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = (await client.get("/_emulator/journal")).json()
    return calls


async def test_corrupt_gzip_is_a_decoding_error_in_process(client: httpx.AsyncClient) -> None:
    """Through ASGITransport the client raises httpx.DecodingError; the next call is fine."""
    await fault(client)
    with pytest.raises(httpx.DecodingError):
        await client.get("/v2/dlq/1-0")
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


async def test_corrupt_gzip_is_a_decoding_error_over_a_socket(served: httpx.AsyncClient) -> None:
    """Over a real connection the client raises httpx.DecodingError; the next call is fine."""
    await fault(served)
    with pytest.raises(httpx.DecodingError):
        await served.get("/v2/dlq/1-0")
    assert (await served.get("/v2/dlq/1-0")).status_code == 404


async def test_corrupt_answer_streamed_says_gzip_and_keeps_the_status(
    client: httpx.AsyncClient,
) -> None:
    """Read without decoding: the service's own status, Content-Encoding gzip, bad bytes."""
    await fault(client)
    async with client.stream("GET", "/v2/dlq/1-0") as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert (response.status_code, response.headers["Content-Encoding"]) == (404, "gzip")
    assert int(response.headers["Content-Length"]) == len(raw)
    assert raw.startswith(b"\x1f\x8b")


async def test_corrupt_gzip_is_carried_out_by_default(client: httpx.AsyncClient) -> None:
    """As from a proxy mangling the real answer: the resume happened, and the journal says so."""
    [dlq_id] = await seed(client, workflow("wfr_1"))
    await fault(client, paths=[RESUME])
    with pytest.raises(httpx.DecodingError):
        await client.post(RESUME, params={"dlqIds": dlq_id})
    assert (await client.get("/_emulator/dlq")).json() == []
    assert len((await client.get("/_emulator/runs")).json()) == 1
    [call] = await journal(client)
    assert (call["status"], call["fault"], call["carriedOut"]) == (200, "corrupt_gzip", True)


async def test_corrupt_gzip_not_carried_out_leaves_the_dlq_alone(
    client: httpx.AsyncClient,
) -> None:
    """carriedOut: false answers 200 with the corrupt body and the service does nothing."""
    [dlq_id] = await seed(client, workflow("wfr_1"))
    await fault(client, paths=[RESUME], carriedOut=False)
    with pytest.raises(httpx.DecodingError):
        await client.post(RESUME, params={"dlqIds": dlq_id})
    assert [m["dlqId"] for m in (await client.get("/_emulator/dlq")).json()] == [dlq_id]
    assert (await client.get("/_emulator/runs")).json() == []
    [call] = await journal(client)
    assert (call["status"], call["carriedOut"]) == (200, False)


async def test_corrupt_gzip_not_carried_out_over_a_socket(served: httpx.AsyncClient) -> None:
    """The answer made up without the service is just as undecodable over a connection."""
    await fault(served, carriedOut=False)
    with pytest.raises(httpx.DecodingError):
        await served.get("/v2/dlq/1-0")


async def test_corrupt_answer_to_a_token_reset_still_resets_it(
    anonymous: httpx.AsyncClient, emulator: Emulator
) -> None:
    """Carried out on the account endpoint: the token changed, and the client cannot read it."""
    await fault(anonymous, paths=["/service/user/rotatetoken"])
    with pytest.raises(httpx.DecodingError):
        await anonymous.post("/service/user/rotatetoken", headers=basic(USERNAME, PASSWORD))
    assert emulator.account.token != TOKEN
