"""Faults injected into the next calls to the service API: errors, latency, drops and 429s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal["status", "latency", "drop", "rate_limit", "malformed"]


class FaultSpec(BaseModel):
    """A fault as `POST /_emulator/faults` takes it.

    `status`: answer `status` with `{"error"}`. `latency`: wait `seconds`, then answer
    normally. `drop`: start an answer and close the connection mid-body. `rate_limit`: a 429
    with the `Burst-RateLimit-*` headers (limit = `limit`, else the account's), and
    `Retry-After` only when `retryAfter` is given. `malformed`: a 200 whose body is not
    JSON, as a broken proxy or an incompatible service version would send. Applies to
    the next `times` service calls whose path starts with one of `paths` (every service
    call when empty).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    status: int = Field(503, ge=400, le=599)
    seconds: float = Field(0.5, ge=0, le=120)
    retryAfter: float | None = Field(None, ge=0)  # the control API spells it so
    limit: int | None = Field(None, ge=1)
    times: int = Field(1, ge=1)
    paths: tuple[str, ...] = ()

    def applies_to(self, path: str) -> bool:
        return not self.paths or any(path.startswith(prefix) for prefix in self.paths)

    def retry_after_header(self) -> dict[str, str]:
        if self.retryAfter is None:
            return {}
        return {"Retry-After": f"{self.retryAfter:g}"}


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
    """Raised by the app after starting an answer, to cut the connection (the `drop` fault).

    Under uvicorn the exception makes the server close the socket mid-body, so a client sees
    a protocol error. In-process, httpx's ASGITransport re-raises it to the client, and since
    it is an `httpx.RemoteProtocolError` the client sees the same error class either way.
    """
