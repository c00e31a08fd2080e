"""Test doubles for the emulator suite: a clock to drive, and a destination that records."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support import PASSWORD, SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT, TOKEN, USERNAME

__all__ = ["PASSWORD", "SIGNING_KEY_CURRENT", "SIGNING_KEY_NEXT", "TOKEN", "USERNAME"]
START = 1_763_712_000.25  # the fake clock's first reading, unix seconds
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def basic(username: str, password: str) -> dict[str, str]:
    encoded = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {encoded}"}


class FakeClock:
    """Unix time that moves only when a test moves it."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Sink:
    """An ASGI app standing for every destination: answers `statuses[path]` (default 200,
    with `bodies[path]` as body) and records every request it gets."""

    statuses: dict[str, int] = field(default_factory=dict)
    bodies: dict[str, bytes] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)

    def at(self, path: str) -> list[Received]:
        return [request for request in self.received if request.path == path]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.received.append(Received(scope["method"], scope["path"], headers, body))
        status = self.statuses.get(scope["path"], 200)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"x-sink", b"yes")],
            }
        )
        await send({"type": "http.response.body", "body": self.bodies.get(scope["path"], b"")})


def workflow(run_id: str, **fields: Any) -> dict[str, Any]:
    """A workflow DLQ message to seed."""
    return {"url": "https://app.example.com/wf", "workflowRunId": run_id, **fields}


async def seed(control: httpx.AsyncClient, *messages: dict[str, Any]) -> list[str]:
    response = await control.post("/_emulator/dlq", json={"messages": list(messages)})
    assert response.status_code == 200, response.text
    ids: list[str] = response.json()["dlqIds"]
    return ids


async def idle(control: httpx.AsyncClient) -> None:
    response = await control.post("/_emulator/idle", params={"timeout": 10})
    assert response.status_code == 200, response.text
