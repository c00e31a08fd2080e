"""Test doubles for the emulator suite: a clock to drive, and a destination that records."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

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


async def read_request(
    scope: dict[str, Any], receive: Any, send: Any
) -> tuple[Received, list[tuple[str, str]]] | None:
    """The request an ASGI test app was sent, with its headers also as pairs (names in
    lower case, repeats kept); None for the lifespan protocol, answered here."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    pairs = [(k.decode().lower(), v.decode()) for k, v in scope["headers"]]
    return Received(scope["method"], scope["path"], dict(pairs), body), pairs


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
        if (read := await read_request(scope, receive, send)) is None:
            return
        self.received.append(read[0])
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


def verify_signature(token: str, body: bytes, key: str = SIGNING_KEY_CURRENT) -> dict[str, Any]:
    """The claims of `token` checked as both SDKs check them: HS256, issuer `Upstash`,
    `iss`/`sub`/`exp`/`nbf` required, the body hash compared without padding."""
    claims: dict[str, Any] = jwt.decode(
        token,
        key,
        algorithms=["HS256"],
        issuer="Upstash",
        options={"require": ["iss", "sub", "exp", "nbf"]},
    )
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).decode().rstrip("=")
    assert claims["body"].rstrip("=") == digest
    return claims


@dataclass
class StepApp:
    """A workflow endpoint at `/wf` playing the SDKs' side of the protocol as
    /work/wt/PROTOCOL40.md describes it (the real SDK apps are tests/apps'): it verifies the
    signature, replays the history, runs the next of `steps` steps and publishes its result
    to the emulator at `service` (step `fail_step` fails while `failing`), ends the run when
    all are done, starts a run itself on a first invocation, and records failure callbacks.
    `retries`, when set, is stamped on every step it publishes, as the Python SDK does;
    a failing step answers `fail_status` with `fail_headers` (the JavaScript SDK's 489 and
    429 answers)."""

    service: str = ""
    steps: int = 3
    fail_step: int = 2
    failing: bool = False
    retries: int | None = None
    fail_status: int = 500
    fail_headers: dict[str, str] = field(default_factory=dict)
    failure_status: int = 200  # what its failure function answers
    ran: dict[int, int] = field(default_factory=dict)
    deliveries: list[Received] = field(default_factory=list)
    failures: list[Received] = field(default_factory=list)
    copies: list[Received] = field(default_factory=list)
    raw_headers: list[list[tuple[str, str]]] = field(default_factory=list)
    failure_raw_headers: list[list[tuple[str, str]]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (read := await read_request(scope, receive, send)) is None:
            return
        request, pairs = read
        status, answer = await self._handle(request, pairs)
        extra = self.fail_headers if status == self.fail_status else {}
        headers = [(b"content-type", b"application/json")]
        headers += [(name.encode(), value.encode()) for name, value in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})

    async def _handle(
        self, request: Received, pairs: list[tuple[str, str]]
    ) -> tuple[int, dict[str, Any]]:
        verify_signature(request.headers["upstash-signature"], request.body)
        if request.path == "/callbacks":
            self.copies.append(request)
            return 200, {}
        if request.headers.get("upstash-workflow-is-failure") == "true":
            self.failures.append(request)
            self.failure_raw_headers.append(pairs)
            return self.failure_status, {"workflowRunId": "wfr_failure"}
        url = f"http://{request.headers['host']}{request.path}"
        if "upstash-workflow-sdk-version" not in request.headers:
            return await self._first_invocation(url, request)
        self.deliveries.append(request)
        self.raw_headers.append(pairs)
        run_id = request.headers["upstash-workflow-runid"]
        history = json.loads(request.body)
        done = [
            json.loads(base64.b64decode(entry["body"]))
            for entry in history[1:]
            if entry["callType"] == "step"
        ]
        async with httpx.AsyncClient(base_url=self.service, headers=BEARER) as service:
            if len(done) == self.steps:
                ended = await service.delete(f"/v2/workflows/runs/{run_id}?cancel=false")
                ended.raise_for_status()
                return 200, {"workflowRunId": run_id}
            number = len(done) + 1
            self.ran[number] = self.ran.get(number, 0) + 1
            if number == self.fail_step and self.failing:
                failed = {"error": "RuntimeError", "message": f"step {number} failed"}
                return self.fail_status, failed
            step = {"stepId": number, "stepName": f"step-{number}", "stepType": "Run",
                    "out": json.dumps(number), "concurrent": 1}  # fmt: skip
            header = self._step_headers(run_id, url, request)
            item = {"destination": url, "headers": header, "body": json.dumps(step)}
            published = await service.post("/v2/batch", json=[item])
        if published.status_code == 400:  # the run has ended: the SDKs answer 200
            return 200, {"workflowRunId": run_id}
        published.raise_for_status()
        return 200, {"workflowRunId": run_id}

    def _step_headers(self, run_id: str, url: str, request: Received) -> dict[str, str]:
        # Every header received is forwarded back but the workflow ones (the Python SDK's
        # way), the service's own and `host` included: the emulator must drop those.
        header = {
            f"Upstash-Forward-{name}": value
            for name, value in request.headers.items()
            if not name.startswith("upstash-workflow-")
        }
        header.update(
            {
                "Content-Type": "application/json",
                "Upstash-Workflow-Init": "false",
                "Upstash-Workflow-RunId": run_id,
                "Upstash-Workflow-Url": url,
                "Upstash-Forward-Upstash-Workflow-Sdk-Version": "1",
            }
        )
        if self.retries is not None:
            header["Upstash-Retries"] = str(self.retries)
        return header

    async def _first_invocation(self, url: str, request: Received) -> tuple[int, dict[str, Any]]:
        run_id = "wfr_first_" + secrets.token_hex(4)
        header = {
            "Content-Type": "application/json",
            "Upstash-Workflow-Init": "true",
            "Upstash-Workflow-RunId": run_id,
            "Upstash-Workflow-Url": url,
            "Upstash-Forward-Upstash-Workflow-Sdk-Version": "1",
        }
        item = {"destination": url, "headers": header, "body": request.body.decode()}
        async with httpx.AsyncClient(base_url=self.service, headers=BEARER) as service:
            (await service.post("/v2/batch", json=[item])).raise_for_status()
        return 200, {"workflowRunId": run_id}

    def outputs(self, delivery: Received) -> list[Any]:
        """The step results in a delivery's history, in order."""
        history = json.loads(delivery.body)
        return [json.loads(json.loads(base64.b64decode(e["body"]))["out"]) for e in history[1:]]


def init_item(url: str, run_id: str, body: str, **headers: str) -> dict[str, Any]:
    """A run's Init message as the JavaScript SDK's `trigger` publishes it in `/v2/batch`."""
    header = {
        "Content-Type": "application/json",
        "Upstash-Workflow-Init": "true",
        "Upstash-Workflow-RunId": run_id,
        "Upstash-Workflow-Url": url,
        "Upstash-Feature-Set": "LazyFetch,InitialBody,WF_DetectTrigger,WF_TriggerOnConfig",
        "Upstash-Workflow-Sdk-Version": "1",
        "Upstash-Forward-Upstash-Workflow-Sdk-Version": "1",
        "Upstash-Method": "POST",
        **headers,
    }
    return {"destination": url, "headers": header, "body": body}


def failure_block(failure_url: str, run_id: str, url: str) -> dict[str, str]:
    """The failure-callback headers both SDKs put on a run's messages."""
    return {
        "Upstash-Failure-Callback": failure_url,
        "Upstash-Failure-Callback-Forward-Upstash-Workflow-Is-Failure": "true",
        "Upstash-Failure-Callback-Forward-Upstash-Workflow-Failure-Callback": "true",
        "Upstash-Failure-Callback-Workflow-Runid": run_id,
        "Upstash-Failure-Callback-Workflow-Init": "false",
        "Upstash-Failure-Callback-Workflow-Url": url,
        "Upstash-Failure-Callback-Workflow-Calltype": "failureCall",
    }
