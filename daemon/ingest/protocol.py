"""`POST /callbacks` answered by the public listener's HTTP protocol itself, not by ASGI.

uvicorn runs each request as an ASGI cycle: a task, a scope, receive and send coroutines,
the proxy-headers middleware, checks on every header of the answer. For the callback, the
hot path when a bad hour downstream sends thousands a second, that cycle cost more than
all of the receiver's checks together (bench/ingest, issue 20). Here the protocol hands a
callback's headers to `CallbackReceiver.admit` once they are in, its body to `finish`,
and writes the answer itself when the receiver has it (when the store has the callback on
disk). Every other request, and the few callbacks that need what only the ASGI cycle does
(one pipelined behind a request not yet answered, `Expect: 100-continue`, an upgrade),
go the ASGI way.

uvicorn and the listener's limits (daemon/http/listener.py) see such a request through its
`_Cycle`, which has the fields of uvicorn's RequestResponseCycle that they read and set:
so deadlines, lingering close, keep-alive, pipelining and graceful shutdown hold for it
as for any request.
"""

from __future__ import annotations

from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from daemon.ingest.receiver import Admitted, Answer, CallbackReceiver

PATH = b"/callbacks"
_WITH_QUERY = PATH + b"?"


class _Unawaited:
    """A cycle's `message_event`: uvicorn and the listener set it to wake a reader that
    waits for the body or a disconnect; here nothing waits, the protocol calls instead."""

    def set(self) -> None:
        return None


_UNAWAITED = _Unawaited()


class _Cycle:
    """One callback answered by the protocol, as uvicorn's RequestResponseCycle shows it."""

    __slots__ = (
        "admitted",
        "chunks",
        "disconnected",
        "keep_alive",
        "more_body",
        "response_complete",
        "response_started",
        "size",
    )
    message_event = _UNAWAITED

    def __init__(self, keep_alive: bool) -> None:
        self.admitted: Admitted | None = None  # None: refused from its headers
        self.chunks: list[bytes] = []
        self.size = 0
        self.keep_alive = keep_alive
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False


def callback_protocol(receiver: CallbackReceiver) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `POST /callbacks` answered by `receiver`
    directly; give it to listener.limited_protocol as its `route`."""
    protocol: type[HttpToolsProtocol] = type(
        "CallbackHttpToolsProtocol", (_CallbackRoute,), {"receiver": receiver}
    )
    return protocol


class _CallbackRoute(HttpToolsProtocol):
    receiver: ClassVar[CallbackReceiver]
    # The message being parsed, when this protocol answers it. Not `self.cycle`: a
    # request uvicorn makes no cycle for (an upgrade) leaves the previous one there.
    _direct: _Cycle | None = None

    def on_message_begin(self) -> None:
        # An answer given during the previous read (a refusal, at once) armed the
        # keep-alive timer, which only the next read stops: this request is not idle time.
        self._unset_keepalive_if_required()
        self._direct = None
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if not self._is_direct():
            super().on_headers_complete()
            return
        parser = self.parser
        cycle = _Cycle(keep_alive=parser.get_http_version() != "1.0" and parser.should_keep_alive())
        self.cycle = self._direct = cycle  # type: ignore[assignment]  # see _Cycle
        admitted = self.receiver.admit(self.headers)
        if isinstance(admitted, Answer):
            self._answer(cycle, admitted)
        else:
            cycle.admitted = admitted

    def _is_direct(self) -> bool:
        """A callback this protocol answers: one that needs nothing of the ASGI cycle."""
        url = self.url
        previous = self.cycle
        return (
            (url == PATH or url.startswith(_WITH_QUERY))
            and self.parser.get_method() == b"POST"
            and (previous is None or previous.response_complete)  # else it waits its turn
            and not self.expect_100_continue
            and not self.parser.should_upgrade()
        )

    def on_body(self, body: bytes) -> None:
        cycle = self._direct
        if cycle is None:
            super().on_body(body)
            return
        if cycle.admitted is None or cycle.response_started:
            return  # answered already: the rest is not read
        cycle.size += len(body)
        if cycle.size > self.receiver.max_body_bytes:
            self._answer(cycle, self.receiver.too_large(cycle.admitted))
            return
        cycle.chunks.append(body)

    def on_message_complete(self) -> None:
        cycle = self._direct
        if cycle is None:
            super().on_message_complete()
            return
        cycle.more_body = False
        if cycle.admitted is None or cycle.response_started:
            return
        body = b"".join(cycle.chunks)
        cycle.chunks = []
        self.receiver.finish(cycle.admitted, body, lambda answer: self._answer(cycle, answer))

    def _answer(self, cycle: _Cycle, answer: Answer) -> None:
        """Write `answer`, then carry on as uvicorn does once an answer is complete."""
        if cycle.disconnected:
            return  # the client is gone: nobody to tell
        cycle.response_started = True
        if answer.close:
            cycle.keep_alive = False
        head = [STATUS_LINE[answer.status]]
        for name, value in self.server_state.default_headers:  # `date`, `server`
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(answer.body))
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head += (b"\r\n", answer.body)
        self.transport.write(b"".join(head))
        cycle.response_complete = True
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()
