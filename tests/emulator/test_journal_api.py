"""The journal of service calls, and that it never holds a credential."""

from __future__ import annotations

import httpx

from daemon.emulator.journal import redact
from tests.emulator.support import PASSWORD, START, TOKEN, USERNAME, basic


async def journal(client: httpx.AsyncClient) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = (await client.get("/_emulator/journal")).json()
    return calls


async def test_every_service_call_is_journaled_in_order(client: httpx.AsyncClient) -> None:
    """Method, path, query pairs, status and time of each call."""
    await client.get("/v2/dlq/1-0")
    await client.post("/v2/workflows/dlq/resume", params=[("label", "a"), ("label", "b")])
    calls = await journal(client)
    assert [(c["method"], c["path"], c["status"]) for c in calls] == [
        ("GET", "/v2/dlq/1-0", 404),
        ("POST", "/v2/workflows/dlq/resume", 200),
    ]
    assert calls[1]["query"] == [["label", "a"], ["label", "b"]]
    assert calls[0]["at"] == START


async def test_request_body_is_journaled(client: httpx.AsyncClient) -> None:
    """What a client sent to remove endpoints can be checked afterwards."""
    body = '{"endpoints":[{"name":"a"}]}'
    await client.request("DELETE", "/v2/topics/g/endpoints", content=body)
    [call] = await journal(client)
    assert call["body"] == body


async def test_credentials_are_redacted(anonymous: httpx.AsyncClient) -> None:
    """Neither the token nor the password appears anywhere in the journal."""
    await anonymous.get("/v2/dlq/1-0", headers={"Authorization": f"Bearer {TOKEN}"})
    await anonymous.post("/service/user/rotatetoken", headers=basic(USERNAME, PASSWORD))
    calls = await journal(anonymous)
    text = str(calls)
    assert TOKEN not in text
    assert PASSWORD not in text
    assert basic(USERNAME, PASSWORD)["Authorization"].split()[1] not in text
    auth = [c["headers"]["authorization"] for c in calls]  # type: ignore[index]
    assert auth == ["Bearer <redacted>", "Basic <redacted>"]


async def test_control_calls_are_not_journaled(client: httpx.AsyncClient) -> None:
    """Only the service API is journaled."""
    await client.get("/_emulator/stats")
    assert await journal(client) == []


async def test_journal_is_cleared(client: httpx.AsyncClient) -> None:
    """DELETE /_emulator/journal empties it."""
    await client.get("/v2/dlq/1-0")
    await client.delete("/_emulator/journal")
    assert await journal(client) == []


async def test_faulted_calls_are_marked(client: httpx.AsyncClient) -> None:
    """A call answered by a fault says which."""
    await client.post("/_emulator/faults", json={"kind": "status", "status": 502})
    await client.get("/v2/dlq/1-0")
    [call] = await journal(client)
    assert (call["status"], call["fault"]) == (502, "status")


def test_redaction_keeps_only_the_scheme() -> None:
    """`Bearer x` becomes `Bearer <redacted>`; a bare value is fully redacted."""
    assert redact("Authorization", "Bearer tok") == "Bearer <redacted>"
    assert redact("authorization", "tok") == "<redacted>"
    assert redact("content-type", "text/plain") == "text/plain"
