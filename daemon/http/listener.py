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
  room by closing one that is lingering (refused already), else the one that has waited
  longest without sending a request (an idle keep-alive, or a slowloris), and is refused
  with 503 only when every connection is busy with a request; requests in flight always
  finish.
* requests per connection: uvicorn's `limit_max_requests` stops the whole server. Here
  the last allowed answer says `connection: close`.
* keep-alive idle time: uvicorn's own `timeout_keep_alive`, set from the limits. Its 5 s
  default is shorter than its clients' (httpx keeps an idle connection 5 s, Go's
  net/http 90 s, nginx and cloud load balancers 60 s): a server that closes first races
  the request a client sends on the connection as it closes, and that request fails.
* lingering close: a connection closed with its request still arriving (a refusal, an
  early 401 or 413) sends its answer, shuts its side, and reads and drops what still
  comes for up to two seconds (or 8 MiB), as nginx's `lingering_close` does: closed at once, the
  kernel would reset the connection and the client might never see the answer.

Every refusal is counted (`recoveryd_listener_refusals_total`) and logged, at most one
line a reason every ten seconds with the count of those not logged, so an attack cannot
flood the logs.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal, cast

import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from daemon.settings import ListenerLimits

log = structlog.get_logger(__name__)

# A lingering close reads and drops what still comes for this long, or this much.
LINGER_SECONDS = 2.0
LINGER_BYTES = 8 * 1024 * 1024  # a body a client wrote whole before reading
# How often a listener's deadlines are checked: how late a refusal may come.
SWEEP_SECONDS = 0.25

_STATUS_LINES = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\n",
}


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


# Why a connection was refused or closed: the reasons of recoveryd_listener_refusals_total.
Refusal = Literal[
    "header_too_large", "header_timeout", "body_timeout", "over_connections", "evicted",
    "idle_timeout",
]  # fmt: skip


def limited_protocol(
    limits: ListenerLimits,
    listener: str,
    on_refusal: Callable[[Refusal], None],
    route: type[HttpToolsProtocol] = HttpToolsProtocol,
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits`, for one listener (its connections are
    counted apart from the other listener's); `on_refusal(reason)` counts each refusal.
    `route`, a subclass of uvicorn's protocol that answers some requests itself
    (ingest/protocol.py), runs under the limits."""
    protocol: type[HttpToolsProtocol] = type(
        "LimitedHttpToolsProtocol",
        (_LimitedHttp, route),
        {
            "limits": limits,
            "listener": listener,
            "on_refusal": staticmethod(on_refusal),
            "idle": {},
            "lingering": {},
            "sweeper": None,
            "throttle": _Throttle(),
        },
    )
    return protocol


Deadline = Literal["header", "body", "linger"]


class _LimitedHttp(HttpToolsProtocol):
    """Each connection has at most one deadline at a time, for what the client owes:

    * a new connection's first request, from the connection's start until its headers
      are in: `header`. Expired with no byte sent, the connection is closed without a
      word; part way, 408.
    * a kept-alive connection's next request, from its first byte until its headers are
      in: `header`, 408. Until that byte, only uvicorn's keep-alive timer runs, and
      closes the connection without a word (RFC 9112 §9.6).
    * the active request's body, until it is all in: `body` (408; if the request was
      already answered, the connection is just closed).
    * none while the application answers, or while a pipelined request waits its turn
      (uvicorn has stopped reading then): that time is not the client's.
    * a lingering close: `linger`.

    Deadlines are times checked by one sweep a listener every SWEEP_SECONDS: cheaper
    per request than a timer each, and as precise as 10 s and 30 s limits need.
    """

    limits: ClassVar[ListenerLimits]
    listener: ClassVar[str]
    on_refusal: ClassVar[staticmethod[[Refusal], None]]
    # This listener's connections waiting for a request, longest first (a dict keeps
    # insertion order), and those closing: when room is needed, the lingering go first.
    idle: ClassVar[dict[_LimitedHttp, None]]
    lingering: ClassVar[dict[_LimitedHttp, None]]
    sweeper: ClassVar[asyncio.TimerHandle | None]
    throttle: ClassVar[_Throttle]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn declares whole seconds; a fraction rounds up.
        self.timeout_keep_alive = math.ceil(self.limits.keepalive_timeout)
        self._deadline: float | None = None  # on the loop's clock
        self._deadline_kind: Deadline | None = None
        self._in_headers = False  # a request has begun and its headers are not all in
        self._began_in_read = False  # ...and it began in the read being parsed
        self._read_size = 0
        self._header_bytes = 0  # the request's header bytes from earlier reads
        self._requests = 0
        self._closed_early = False  # refused or lingering: what still arrives is dropped
        self._deferred: tuple[int, Refusal, str] | None = None  # a refusal after this answer
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
        self._deadline = None
        self.idle.pop(self, None)
        self.lingering.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closed_early:
            self._drop(len(data))
            return
        # A read that starts inside a request's headers is all header until they end; the
        # read a request begins in is measured exactly once its headers are in.
        continues_headers = self._in_headers
        self._began_in_read = False
        self._read_size = len(data)
        super().data_received(data)
        if continues_headers and self._in_headers and not self._began_in_read:
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes and not self._closed_early:
                self._refuse_header_too_large()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._deferred is not None and not self.pipeline and self not in self.lingering:
            status, reason, message = self._deferred
            self._deferred = None
            self._refuse(status, reason, message)
            return
        self._next_deadline()

    # The parser's callbacks; once refused, the rest of the read is ignored.

    def on_message_begin(self) -> None:
        if self._closed_early:
            return
        super().on_message_begin()
        self._in_headers = self._began_in_read = True
        self._header_bytes = 0
        self._next_deadline()

    def on_headers_complete(self) -> None:
        if self._closed_early:
            return
        self._in_headers = False
        # Only a read over the limit can hold headers over it: most requests skip the sum.
        if self._header_bytes + self._read_size > self.limits.max_header_bytes:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self.limits.max_header_bytes:
                self._refuse_header_too_large()
                return
        self.idle.pop(self, None)
        self._requests += 1
        super().on_headers_complete()
        if self._requests >= self.limits.max_requests_per_connection and self.cycle is not None:
            self.cycle.keep_alive = False  # uvicorn says `connection: close` and closes
        self._next_deadline()

    def on_body(self, body: bytes) -> None:
        if not self._closed_early:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closed_early:
            return
        super().on_message_complete()
        self._next_deadline()

    # Deadlines.

    def _next_deadline(self) -> None:
        """Set the deadline the connection's state calls for (see the class's docstring)."""
        if self._closed_early:
            return
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.pipeline:
            if self._deadline_kind != "body":
                self._set_deadline(self.limits.body_timeout, "body")
        elif self._answering():
            self._deadline = self._deadline_kind = None
        elif self._in_headers:
            if self._deadline_kind != "header":
                self._set_deadline(self.limits.header_timeout, "header")
        else:
            self._await_request()

    def _answering(self) -> bool:
        """An earlier request is still being answered, or waits its turn to be."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def _await_request(self) -> None:
        """Nothing owed either way: waiting for a request, and first to go for room."""
        self.idle[self] = None
        if self._requests:
            self._deadline = self._deadline_kind = None  # kept alive: uvicorn's timer
        else:
            self._set_deadline(self.limits.header_timeout, "header")

    def _set_deadline(self, seconds: float, kind: Deadline) -> None:
        self._deadline = self.loop.time() + seconds
        self._deadline_kind = kind
        cls = type(self)
        if cls.sweeper is None:
            cls.sweeper = self.loop.call_later(
                SWEEP_SECONDS, cls._sweep, self.loop, self.connections
            )

    @classmethod
    def _sweep(cls, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        now = loop.time()
        for connection in list(connections):
            if connection._deadline is not None and connection._deadline <= now:
                connection._expire()
        cls.sweeper = (
            loop.call_later(SWEEP_SECONDS, cls._sweep, loop, connections) if connections else None
        )

    def _expire(self) -> None:
        kind, self._deadline, self._deadline_kind = self._deadline_kind, None, None
        if kind == "linger":
            self._close_now()
        elif kind == "body" and self.cycle is not None and self.cycle.response_started:
            self._close_quietly("body_timeout")  # answered already: no second answer
        elif kind == "body":
            seconds = self.limits.body_timeout
            self._refuse(408, "body_timeout", f"the request's body took over {seconds:g} s")
        elif self._in_headers:
            seconds = self.limits.header_timeout
            self._refuse(408, "header_timeout", f"the request's headers took over {seconds:g} s")
        else:
            self._close_quietly("idle_timeout")

    # Refusals and closing.

    def _make_room(self) -> bool:
        """Close a lingering connection, else the one that has waited longest for a
        request; False if every other connection has a request in flight."""
        for waiting in (self.lingering, self.idle):
            for other in waiting:
                if other is not self:
                    other._close_quietly("evicted")
                    return True
        return False

    def _refuse_header_too_large(self) -> None:
        limit = self.limits.max_header_bytes
        message = f"the request's headers are over {limit} bytes"
        if self._answering():
            # An earlier request is still being answered: the refusal follows its answer.
            self._deferred = (431, "header_too_large", message)
            self._closed_early = True
            self._deadline = self._deadline_kind = None
            return
        self._refuse(431, "header_too_large", message)

    def _refuse(self, status: int, reason: Refusal, message: str) -> None:
        """Answer `status` (unless an answer has begun), close lingering, count, log."""
        if self._stop_request() and not self.transport.is_closing():
            body = json.dumps({"error": message}).encode()
            self.transport.write(
                _STATUS_LINES[status]
                + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
                + b"connection: close\r\n\r\n"
                + body
            )
        self._linger()
        self._report(reason, status)

    def _close_quietly(self, reason: Refusal) -> None:
        """Close at once, without an answer: a connection with no request in flight (HTTP
        lets a server close an idle one, and clients retry on a new one), or one that was
        answered already. At once, with no lingering: the point is to free its place."""
        self._stop_request()
        self._close_now()
        self._report(reason, None)

    def _stop_request(self) -> bool:
        """Stop reading; a request in flight hears that its client is gone. True when an
        answer can still be written."""
        self._closed_early = True
        self._deadline = self._deadline_kind = None
        self.idle.pop(self, None)
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        cycle.disconnected = True
        cycle.message_event.set()
        return not cycle.response_started

    def _close(self) -> None:
        """uvicorn's close: lingering when the client may still be sending this request."""
        if self._raw is None or self._raw.is_closing() or self in self.lingering:
            return
        unread = self._in_headers or (self.cycle is not None and self.cycle.more_body)
        if unread:
            self._linger()
        else:
            self._close_now()

    def _linger(self) -> None:
        """Shut our side, then read and drop what still comes for up to LINGER_SECONDS or
        LINGER_BYTES, so that a client still sending reads its answer, not a reset."""
        raw = self._raw
        if raw is None or raw.is_closing() or self in self.lingering:
            return
        if not raw.can_write_eof():
            raw.close()
            return
        self._closed_early = True
        self.idle.pop(self, None)
        self.lingering[self] = None
        raw.write_eof()
        self.flow.resume_reading()  # uvicorn pauses reading under a large body
        self._set_deadline(LINGER_SECONDS, "linger")

    def _close_now(self) -> None:
        self._closed_early = True
        self._deadline = self._deadline_kind = None
        if self._raw is not None:
            self._raw.close()

    def _drop(self, size: int) -> None:
        self._dropped += size
        if self._dropped > LINGER_BYTES and self in self.lingering:
            self._close_now()  # not reading its answer: no more waiting for it

    def _report(self, reason: Refusal, status: int | None) -> None:
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
