"""The outage switch: the whole service API down (503, dropped or hung calls) for a while.

An outage stands in front of everything else: a call that meets it reaches neither the
rate limit nor an armed fault nor the service logic, so nothing changes in the DLQ and
no quota is used. Every such call is still journaled, marked with the outage's mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.types import Receive, Scope, Send

from daemon.emulator.errors import error_response
from daemon.emulator.faults import ConnectionDropped, retry_after_header
from daemon.emulator.journal import Call

OutageMode = Literal["503", "drop", "hang"]

# How long a `hang` holds a call when the outage has no end, or a later one: longer than
# any client's timeout, short enough that a forgotten outage does not hold a socket forever.
MAX_HOLD_SECONDS = 600.0


class OutageSpec(BaseModel):
    """An outage as `POST /_emulator/outage` takes it.

    `mode` "503": every call is answered 503 `{"error"}` (with `Retry-After` when
    `retryAfter` is given), as a load balancer in front of nothing does. "drop": the
    connection is closed without a byte of answer, as when the server dies. "hang": the
    call is held without an answer until the outage ends (or `MAX_HOLD_SECONDS`, or the
    client goes away), then dropped, so a client with a timeout times out. `seconds`: how
    long the outage lasts by the emulator's clock; without it, until switched off.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: OutageMode = "503"
    seconds: float | None = Field(None, gt=0, le=86_400)
    retryAfter: float | None = Field(None, ge=0)  # the control API spells it so

    @field_validator("mode", mode="before")
    @classmethod
    def _status_as_text(cls, value: Any) -> Any:
        # `{"mode": 503}` is what someone typing the status means; accept it.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _retry_after_needs_an_answer(self) -> OutageSpec:
        if self.retryAfter is not None and self.mode != "503":
            raise ValueError("retryAfter goes with mode 503 only: the other modes answer nothing")
        return self


class Outage:
    """The switch: off, or on with a spec until a time of the emulator's clock."""

    def __init__(self) -> None:
        self.spec: OutageSpec | None = None
        self.until: float | None = None
        self.calls = 0  # calls met by the outage switched on last
        self.held = 0  # calls a `hang` is holding right now
        self._over = asyncio.Event()

    def start(self, spec: OutageSpec, now: float) -> None:
        """Switch on (replacing the outage in force, whose held calls are let go)."""
        self._release()
        self.spec = spec
        self.until = None if spec.seconds is None else now + spec.seconds
        self.calls = 0

    def end(self) -> None:
        """Switch off; calls being held are dropped."""
        self._release()
        self.spec = None
        self.until = None

    def clear(self) -> None:
        self.end()
        self.calls = 0

    def current(self, now: float) -> OutageSpec | None:
        """The outage in force at `now`, if any."""
        if self.spec is not None and self.until is not None and now >= self.until:
            self.end()
        return self.spec

    def remaining(self, now: float) -> float | None:
        """Seconds left of the outage in force; None when it has no end or there is none."""
        if self.current(now) is None or self.until is None:
            return None
        return self.until - now

    def over(self) -> asyncio.Event:
        """Set when the outage in force is switched off or replaced."""
        return self._over

    def _release(self) -> None:
        # A fresh event for the next outage: held calls of this one wait on the old one.
        self._over.set()
        self._over = asyncio.Event()

    def to_json(self, now: float) -> dict[str, Any]:
        spec = self.current(now)
        return {
            "active": spec is not None,
            "mode": spec.mode if spec else None,
            "seconds": spec.seconds if spec else None,
            "remaining": self.remaining(now),
            "retryAfter": spec.retryAfter if spec else None,
            "calls": self.calls,
            "held": self.held,
        }


class ServiceDown:
    """Answers a call that met an outage, as the service's front would while it is down."""

    def __init__(
        self,
        outage: Outage,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.outage = outage
        self.clock = clock
        self.sleep = sleep

    async def __call__(
        self, spec: OutageSpec, scope: Scope, receive: Receive, send: Send, call: Call
    ) -> None:
        self.outage.calls += 1
        call.outage = spec.mode
        call.status = 0
        # The body is read in every mode, so the journal shows what a refused call carried.
        gone = await _read_body(receive, call)
        if spec.mode == "503":
            headers = retry_after_header(spec.retryAfter)
            response = error_response(503, "service unavailable (emulated outage)", headers)
            call.status = 503
            await response(scope, receive, send)
            return
        if spec.mode == "hang" and not gone:
            gone = await self._hold(receive)
        if not gone:
            await cut_connection(receive)

    async def _hold(self, receive: Receive) -> bool:
        """Hold until the outage is over, the hold's limit passes or the client goes away;
        True in the last case."""
        remaining = self.outage.remaining(self.clock())
        seconds = MAX_HOLD_SECONDS if remaining is None else min(remaining, MAX_HOLD_SECONDS)
        over = asyncio.ensure_future(self.outage.over().wait())
        timer = asyncio.ensure_future(self.sleep(seconds))
        client_gone = asyncio.ensure_future(_disconnected(receive))
        waits = (over, timer, client_gone)
        self.outage.held += 1
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.outage.held -= 1
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return client_gone.done() and not client_gone.cancelled()


async def _read_body(receive: Receive, call: Call) -> bool:
    """Read the request body into the journal; True when the client went away meanwhile."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True
        call.add_body(message.get("body", b""))
        if not message.get("more_body", False):
            return False


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone away (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def cut_connection(receive: Receive) -> None:
    """Close the connection without answering, as a server that dies does.

    An ASGI app has no standard way to do that: raising before an answer makes uvicorn
    (and Starlette) answer 500. So under uvicorn the socket is closed through the request
    cycle's transport, which `receive` is a method of; the client sees "Server disconnected
    without sending a response". Elsewhere (httpx's ASGITransport in-process) the app
    raises `ConnectionDropped`, which the transport hands to the client as the same
    `httpx.RemoteProtocolError`.
    """
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    # Duck-typed: uvloop's transports (uvicorn's loop when uvloop is installed) do not
    # derive from asyncio.BaseTransport.
    close = getattr(transport, "close", None)
    if not callable(close):
        raise ConnectionDropped("Server disconnected without sending a response.")
    close()
    # Wait for uvicorn to see the connection lost: an app that returns before that without
    # an answer gets a 500 written (to nobody) and an error logged.
    await _disconnected(receive)
