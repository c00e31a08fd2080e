"""Faults injected into the next service calls: errors, latency, drops, 429s, corrupt bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal[
    "status", "latency", "drop", "rate_limit", "malformed", "corrupt_gzip", "lost_answer"
]

# A gzip header, then a deflate block of the reserved type 11: zlib refuses it at once, so
# httpx raises `DecodingError`. (A merely truncated stream would not do: httpx flushes the
# decompressor at the end without complaint and hands over what it got.)
CORRUPT_GZIP = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\xff" * 16


def retry_after_header(seconds: float | None) -> dict[str, str]:
    """`Retry-After: <seconds>`, or nothing without a value (the service promises none)."""
    return {} if seconds is None else {"Retry-After": f"{seconds:g}"}


class FaultSpec(BaseModel):
    """A fault as `POST /_emulator/faults` takes it.

    `status`: answer `status` with `{"error"}`, and `Retry-After` when `retryAfter` is
    given. `latency`: wait `seconds`, then answer normally (the request's body is read
    first, so the call is carried out even when its client has gone meanwhile). `drop`:
    start an answer and close the connection mid-body. `rate_limit`: a 429 with the
    `Burst-RateLimit-*` headers (limit = `limit`, else the account's), and `Retry-After`
    only when `retryAfter` is given. `malformed`: a 200 whose body is not JSON, as a
    broken proxy or an incompatible service version would send. `corrupt_gzip`: an
    answer with `Content-Encoding: gzip` and a body that is not gzip, so httpx raises
    `DecodingError` reading it; with `carriedOut` (the default) the service acts on the
    call first and the answer keeps its status (a proxy mangling the real answer: the
    operation WAS carried out), without it the call is answered 200 and the service does
    nothing (the outcome a client cannot tell from the first). `lost_answer`: the
    service carries the call out (unless a limit refuses it) and its answer is lost on
    the way back: the client gets `status` instead (504, say: a proxy that gave up
    waiting), or with `reset` the connection is closed without an answer. `headers:
    false`: the answer carries no `Burst-RateLimit-*` header, neither the fault's nor
    the account limit's (a 429 that says nothing but, optionally, `Retry-After`).
    Applies to the next `times` service calls whose path starts with one of `paths`
    (every service call when empty).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    status: int = Field(503, ge=400, le=599)
    seconds: float = Field(0.5, ge=0, le=120)
    retryAfter: float | None = Field(None, ge=0)  # the control API spells it so
    limit: int | None = Field(None, ge=1)
    headers: bool = True
    carriedOut: bool = True  # the control API spells it so
    reset: bool = False
    times: int = Field(1, ge=1)
    paths: tuple[str, ...] = ()

    def applies_to(self, path: str) -> bool:
        return not self.paths or any(path.startswith(prefix) for prefix in self.paths)

    def retry_after_header(self) -> dict[str, str]:
        return retry_after_header(self.retryAfter)


@dataclass
class _Armed:
    spec: FaultSpec
    remaining: int


class FaultBook:
    """The faults waiting for calls, used up in the order they were added."""

    def __init__(self) -> None:
        self._armed: list[_Armed] = []

    def add(self, spec: FaultSpec) -> None:
        self._armed.append(_Armed(spec, spec.times))

    def clear(self) -> None:
        self._armed.clear()

    def take(self, path: str) -> FaultSpec | None:
        """The fault for a call to `path`, if one is armed for it; uses up one of its times."""
        for armed in self._armed:
            if armed.spec.applies_to(path):
                armed.remaining -= 1
                if armed.remaining == 0:
                    self._armed.remove(armed)
                return armed.spec
        return None

    def to_json(self) -> list[dict[str, Any]]:
        return [{**armed.spec.model_dump(), "remaining": armed.remaining} for armed in self._armed]


class ConnectionDropped(httpx.RemoteProtocolError):
    """Raised by the app to cut the connection: the `drop` fault, after starting an answer,
    and a dropped call of an outage (`outage.cut_connection`) where the socket is out of reach.

    Under uvicorn the exception makes the server close the socket mid-body, so a client sees
    a protocol error. In-process, httpx's ASGITransport re-raises it to the client, and since
    it is an `httpx.RemoteProtocolError` the client sees the same error class either way.
    """
