"""Limits on every connection to the daemon's listeners, enforced as bytes arrive.

The public listener is the service's webhook target, so anyone can connect to it. uvicorn
has settings for some limits and not others, and its httptools parser (the fast one,
which the ingest path needs) takes none at all:

* header size: uvicorn's `h11_max_incomplete_event_size` exists for h11 only, and its
  refusal is a 400. Counted here as the bytes arrive (a header that never ends is cut
  off at the limit, not read whole) and answered 431.
* time to send the headers, then the body: uvicorn has none (an idle connection that
  never sends a byte stays open forever). Deadlines here, answered 408.
* concurrent connections: uvicorn's `limit_concurrency` answers 503 only once a request's
  headers have arrived, and keeps the connection. Here a connection over the limit makes
  room by closing the one that has waited longest without sending a request (an idle
  keep-alive, or a slowloris), and is refused with 503 only when every connection is busy
  with a request; requests in flight always finish.
* requests per connection: uvicorn's `limit_max_requests` stops the whole server. Here
  the last allowed answer says `connection: close`.
* keep-alive idle time: uvicorn's own `timeout_keep_alive` (left at its 5 s).
* lingering close: a connection closed with its request still arriving (a refusal, an
  early 401 or 413) sends its answer, shuts its side, and reads and drops what still
  comes for up to two seconds, as nginx's `lingering_close` does: closed at once, the
  kernel would reset the connection and the client might never see the answer.

Every refusal is counted (`recoveryd_listener_refusals_total`) and logged, at most one
line a reason every ten seconds with the count of those not logged, so an attack cannot
flood the logs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

log = structlog.get_logger(__name__)

# A lingering close reads and drops what still comes for this long, or this much.
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024

_STATUS_LINES = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\n",
}


@dataclass(frozen=True)
class ListenerLimits:
    """What one connection may take; the settings of the same names (docs/settings.md)."""

    max_header_bytes: int = 16 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1024
    max_requests_per_connection: int = 1000


class _Throttle:
    """One log line per reason per `every` seconds; the lines held back are counted."""

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def held_back(self, reason: str) -> int | None:
        """None to stay quiet, else how many were not logged since the last line."""
        now = self._clock()
        if now - self._last.get(reason, -self._every) < self._every:
            self._held[reason] = self._held.get(reason, 0) + 1
            return None
        self._last[reason] = now
        return self._held.pop(reason, 0)


def limited_protocol(
    limits: ListenerLimits, listener: str, on_refusal: Callable[[str], None]
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits`, for one listener (its connections are
    counted apart from the other listener's); `on_refusal(reason)` counts each refusal."""
    protocol: type[HttpToolsProtocol] = type(
        "LimitedHttpToolsProtocol",
        (_LimitedHttp,),
        {
            "limits": limits,
            "listener": listener,
            "on_refusal": staticmethod(on_refusal),
            "waiting": {},
            "throttle": _Throttle(),
        },
    )
    return protocol


class _LimitedHttp(HttpToolsProtocol):
    limits: ClassVar[ListenerLimits]
    listener: ClassVar[str]
    on_refusal: ClassVar[staticmethod[[str], None]]
    # This listener's connections waiting for a request's headers, longest-waiting first
    # (a dict keeps insertion order): the first to close when room is needed.
    waiting: ClassVar[dict[_LimitedHttp, None]]
    throttle: ClassVar[_Throttle]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_headers = False  # a request has begun and its headers are not all here
        self._header_bytes = 0
        self._requests = 0
        self._closed_early = False  # refused or lingering: what still arrives is dropped
        self._lingering = False
        self._dropped = 0
        self._raw: asyncio.Transport | None = None

    # The connection.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = cast(asyncio.Transport, transport)
        # uvicorn closes the transport it was given; this one closes lingering.
        super().connection_made(cast(asyncio.Transport, _Lingering(self._raw, self._close)))
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._refuse(503, "over_connections", "too many connections; try again shortly")
            return
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.waiting.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closed_early:
            self._drop(len(data))
            return
        # A chunk that starts inside a request's headers is all header until they end;
        # one that starts a request is checked exactly when its headers are complete.
        counted = self._in_headers
        super().data_received(data)
        if counted and self._in_headers and not self._closed_early:
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse_header_too_large()

    def on_response_complete(self) -> None:
        # A pipelined request starts now (its headers are in), or the next one has begun
        # and has its deadline: only an empty connection waits for a request.
        busy = bool(self.pipeline) or self._in_headers
        super().on_response_complete()
        if not busy and not self.transport.is_closing():
            self._await_request()

    # The parser's callbacks; once refused, the rest of the read is ignored.

    def on_message_begin(self) -> None:
        if self._closed_early:
            return
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0
        if self._deadline is None:  # a pipelined request: its headers get a deadline too
            self._arm(self.limits.header_timeout, self._header_timeout)

    def on_url(self, url: bytes) -> None:
        if not self._closed_early:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._closed_early:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._closed_early:
            return
        self._in_headers = False
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            self._refuse_header_too_large()
            return
        self.waiting.pop(self, None)
        self._arm(self.limits.body_timeout, self._body_timeout)
        self._requests += 1
        super().on_headers_complete()
        if self._requests >= self.limits.max_requests_per_connection and self.cycle is not None:
            self.cycle.keep_alive = False  # uvicorn says `connection: close` and closes

    def on_body(self, body: bytes) -> None:
        if not self._closed_early:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closed_early:
            return
        self._cancel_deadline()
        super().on_message_complete()

    # The limits.

    def _await_request(self) -> None:
        """Ready for a request: its headers must arrive within the header deadline."""
        self.waiting[self] = None
        self._arm(self.limits.header_timeout, self._header_timeout)

    def _make_room(self) -> bool:
        """Close the connection that has waited longest without a request; False if every
        other connection is busy with one."""
        for other in self.waiting:
            if other is not self:
                other._close_quietly("evicted")
                return True
        return False

    def _header_timeout(self) -> None:
        self._deadline = None
        seconds = self.limits.header_timeout
        self._refuse(408, "header_timeout", f"the request's headers took over {seconds:g} s")

    def _body_timeout(self) -> None:
        self._deadline = None
        seconds = self.limits.body_timeout
        self._refuse(408, "body_timeout", f"the request's body took over {seconds:g} s")

    def _refuse_header_too_large(self) -> None:
        limit = self.limits.max_header_bytes
        self._refuse(431, "header_too_large", f"the request's headers are over {limit} bytes")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer `status` (unless an answer has begun), close, count and log it."""
        answering = self._stop_request()
        if answering and not self.transport.is_closing():
            body = json.dumps({"error": message}).encode()
            self.transport.write(
                _STATUS_LINES[status]
                + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
                + b"connection: close\r\n\r\n"
                + body
            )
        self.transport.close()
        self._report(reason, status)

    def _close_quietly(self, reason: str) -> None:
        """Close a connection with no request in flight: HTTP lets a server close an idle
        connection without a word (RFC 9112 §9.6), and clients retry on a new one. At
        once, with no lingering: the point is to free its place."""
        self._stop_request()
        if self._raw is not None:
            self._raw.close()
        self._report(reason, None)

    def _drop(self, size: int) -> None:
        self._dropped += size
        if self._lingering and self._dropped > LINGER_BYTES and self._raw is not None:
            self._raw.close()  # not reading its answer: no more waiting for it

    def _close(self) -> None:
        """Close, lingering when the client may still be sending this request."""
        raw = self._raw
        if raw is None or raw.is_closing() or (self._closed_early and self._lingering):
            return
        unread = self._in_headers or (self.cycle is not None and self.cycle.more_body)
        if not unread or not raw.can_write_eof():
            raw.close()
            return
        self._closed_early = self._lingering = True
        self._cancel_deadline()
        raw.write_eof()
        self.loop.call_later(LINGER_SECONDS, raw.close)

    def _stop_request(self) -> bool:
        """Stop reading; a request in flight hears that its client is gone. True when an
        answer can still be written."""
        self._closed_early = True
        self._cancel_deadline()
        self.waiting.pop(self, None)
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        cycle.disconnected = True
        cycle.message_event.set()
        return not cycle.response_started

    def _report(self, reason: str, status: int | None) -> None:
        self.on_refusal(reason)
        held_back = self.throttle.held_back(reason)
        if held_back is not None:
            log.warning(
                "connection refused" if status else "connection closed",
                listener=self.listener,
                reason=reason,
                status=status,
                client=self.client[0] if self.client else None,
                not_logged_since_last=held_back,
            )

    def _arm(self, seconds: float, handler: Callable[[], None]) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(seconds, handler)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class _Lingering:
    """A transport whose `close` is the protocol's (lingering) close, and which counts as
    closing from then on (uvicorn then leaves it alone); all else passes through."""

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self._transport = transport
        self._close = close
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._close()

    def is_closing(self) -> bool:
        return self._closed or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
