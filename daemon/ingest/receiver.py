"""`POST /callbacks`: check a failure callback and store it before the 2xx (docs/api.md).

The checks and the answers, apart from how the bytes come and go: the public listener's
HTTP protocol calls `admit` when a request's headers are in and `finish` with its body
(ingest/protocol.py), without ASGI, because this is the hot path when a bad hour
downstream sends thousands of callbacks a second and an ASGI request cycle cost as much as
all the checks together. The same steps also serve as a plain ASGI app, for the requests
the protocol leaves to ASGI (a request pipelined behind another, `Expect: 100-continue`).

Checks run cheapest first, and nothing is parsed before the signature holds. The token is
checked from the headers before the body is read: anyone can connect, and only the
service's signed requests are worth buffering a body for. An answer given before the body
was read closes the connection (the body need not be read either).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, NamedTuple

import structlog

from daemon.ingest.callback import CallbackError, parse_callback
from daemon.ingest.signature import SignatureError, Verifier, check_body
from daemon.metrics import CallbackResult, Metrics
from daemon.store import Added, Callback, Store, StoreUnavailable
from daemon.store.listing import listed

log = structlog.get_logger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
Headers = Iterable[tuple[bytes, bytes]]


class Answer(NamedTuple):
    status: int
    result: CallbackResult
    body: bytes
    close: bool = False  # given before the body was read: the connection ends with it


@dataclass(slots=True)
class Admitted:
    """A request whose headers passed the checks: its body is worth reading."""

    claims: dict[str, Any] | None  # the token's, or None when unsigned callbacks are taken
    started: float  # perf_counter() when its headers were in


def _stored(result: Added, dlq_id: str) -> Answer:
    # Built by hand: json.dumps of the whole dict was a tenth of the request's own time.
    body = b'{"status":"%s","dlqId":%s}' % (result.encode(), _json_string(dlq_id).encode())
    return Answer(200, result, body)


def _error(
    status: int,
    result: CallbackResult,
    message: str,
    field: str | None = None,
    *,
    close: bool = False,
) -> Answer:
    error = {"error": message} if field is None else {"error": message, "field": field}
    return Answer(status, result, json.dumps(error).encode(), close)


class CallbackReceiver:
    """What `POST /callbacks` answers, and the callbacks it stores.

    `verifier` is None only when the daemon runs unsigned (RECOVERYD_ALLOW_UNSIGNED with
    no keys); with keys and unsigned allowed, a callback without a signature is taken but
    one with a bad signature is still refused. `on_accepted` hears of each new dlqId once
    it is stored. Each answer is counted in the metrics as it is made.
    """

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        verifier: Verifier | None,
        allow_unsigned: bool,
        header_prefix: str,
        max_body_bytes: int,
        wall_clock: Callable[[], float] = time.time,
        on_accepted: Callable[[str], None] = lambda dlq_id: None,
    ) -> None:
        self._store = store
        self._on_accepted = on_accepted
        self._metrics = metrics
        self._verifier = verifier
        self._allow_unsigned = allow_unsigned
        self._signature_name = f"{header_prefix}-Signature"
        self._signature_header = self._signature_name.lower().encode("latin-1")
        self.max_body_bytes = max_body_bytes
        self._wall_clock = wall_clock

    def admit(self, headers: Headers) -> Admitted | Answer:
        """Check a request from its headers (lower-case names): Admitted if its body is
        worth reading, else the answer, which closes the connection."""
        started = time.perf_counter()
        length, content_type, signature = self._headers(headers)
        if length is not None and length > self.max_body_bytes:
            return self._answered(self._too_large(), started)
        if not _is_json(content_type):
            message = "Content-Type must be application/json"
            return self._answered(
                _error(415, "unsupported_media_type", message, close=True), started
            )
        claims, refused = self._check_token(signature)
        if refused is not None:
            return self._answered(refused, started)
        return Admitted(claims, started)

    def too_large(self, admitted: Admitted) -> Answer:
        """The answer to a body that grew past max_body_bytes as it came: the rest is
        never read, so the connection closes."""
        return self._answered(self._too_large(), admitted.started)

    def finish(self, admitted: Admitted, body: bytes, reply: Callable[[Answer], None]) -> None:
        """Check `body` and store the callback; `reply` gets the answer, exactly once: at
        once when it is refused, or when the store has the callback on disk."""
        checked = self._checked(admitted, body)
        if isinstance(checked, Answer):
            reply(self._answered(checked, admitted.started))
            return
        try:
            stored = self._store.add_callback(checked)
        except Exception as exc:  # every request is answered, whatever went wrong
            reply(self._answered(self._not_stored(checked.dlq_id, exc), admitted.started))
            return
        # A callback on the future, not a task awaiting it: one object less per request.
        stored.add_done_callback(
            lambda done: self._reply_stored(done, checked.dlq_id, admitted, reply)
        )

    def _checked(self, admitted: Admitted, body: bytes) -> Callback | Answer:
        """The callback to store, or the refusal of `body`."""
        if admitted.claims is not None:
            try:
                check_body(admitted.claims, body)
            except SignatureError as exc:
                return self._bad_signature(exc, close=False)
        try:
            callback = parse_callback(body)
        except CallbackError as exc:
            log.info("callback refused", reason=str(exc), field=exc.field)
            return _error(400, "invalid", str(exc), exc.field)
        verified = admitted.claims is not None
        # Listed from this parse: the store's writer need not parse the body again.
        fields = (callback.url, callback.topic_name, callback.endpoint_name, callback.status)
        return Callback(
            callback.dlq_id, body, self._wall_clock(), verified=verified, listed=listed(*fields)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The same steps as an ASGI app."""
        if scope["method"] != "POST":
            await _respond(send, 405, b'{"error":"use POST"}', allow=b"POST")
            return
        admitted = self.admit(scope["headers"])
        if isinstance(admitted, Answer):
            await _respond(send, admitted.status, admitted.body, close=admitted.close)
            return
        try:
            body = await _read_body(receive, self.max_body_bytes)
        except _ClientGone:
            return
        if body is None:
            answer = self.too_large(admitted)
        else:
            answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

            def reply(answer: Answer) -> None:
                if not answered.done():  # cancelled: uvicorn gave up on it at shutdown
                    answered.set_result(answer)

            self.finish(admitted, body, reply)
            answer = await answered
        await _respond(send, answer.status, answer.body, close=answer.close)

    def _reply_stored(
        self,
        stored: asyncio.Future[Added],
        dlq_id: str,
        admitted: Admitted,
        reply: Callable[[Answer], None],
    ) -> None:
        try:
            answer = self._outcome(stored, dlq_id)
        except Exception as exc:  # a defect after the commit: still an answer, never silence
            answer = self._not_stored(dlq_id, exc)
        reply(self._answered(answer, admitted.started))

    def _outcome(self, stored: asyncio.Future[Added], dlq_id: str) -> Answer:
        if stored.cancelled():
            return self._not_stored(dlq_id, StoreUnavailable("the store is shutting down"))
        if (error := stored.exception()) is not None:
            return self._not_stored(dlq_id, error)
        added = stored.result()
        log.debug("callback stored", dlq_id=dlq_id, result=added)
        if added == "accepted":
            self._on_accepted(dlq_id)
        return _stored(added, dlq_id)

    def _not_stored(self, dlq_id: str, exc: BaseException) -> Answer:
        if isinstance(exc, StoreUnavailable):
            log.warning("callback not stored", dlq_id=dlq_id, reason=str(exc))
            return _error(503, "unavailable", f"cannot store the callback now: {exc}")
        # A defect: said loudly with its traceback; the service retries the callback.
        log.error("callback not stored", dlq_id=dlq_id, exc_info=exc)
        return _error(500, "error", "recoveryd failed to store the callback", close=True)

    def _answered(self, answer: Answer, started: float) -> Answer:
        self._metrics.callbacks[answer.result].inc()
        self._metrics.callback_seconds.observe(time.perf_counter() - started)
        return answer

    def _headers(self, headers: Headers) -> tuple[int | None, bytes, bytes | None]:
        length: int | None = None
        content_type = b""
        signature: bytes | None = None
        for name, value in headers:
            if name == b"content-length":
                # A length too long to be real is left for the read to refuse.
                length = int(value) if value.isdigit() and len(value) < 19 else None
            elif name == b"content-type":
                content_type = value
            elif name == self._signature_header and signature is None:
                signature = value
        return length, content_type, signature

    def _check_token(self, signature: bytes | None) -> tuple[dict[str, Any] | None, Answer | None]:
        """The token's claims (None when there is nothing to check), or the refusal."""
        if signature is None:
            if self._allow_unsigned:
                return None, None
            missing = f"missing {self._signature_name} header"
            return None, _error(401, "unauthorized", missing, close=True)
        if self._verifier is None:  # unsigned mode without keys: nothing to check against
            return None, None
        try:
            return self._verifier.claims(signature, self._wall_clock()), None
        except SignatureError as exc:
            return None, self._bad_signature(exc, close=True)

    def _bad_signature(self, exc: SignatureError, *, close: bool) -> Answer:
        log.info("callback signature refused", reason=str(exc))
        message = f"bad {self._signature_name}: {exc}"
        return _error(401, "unauthorized", message, close=close)

    def _too_large(self) -> Answer:
        # Refused from its Content-Length, or part way through: the rest is never read.
        limit = self.max_body_bytes
        return _error(413, "too_large", f"the body is over the limit of {limit} bytes", close=True)


class _ClientGone(Exception):
    """The sender hung up before its body arrived: there is no one to answer."""


def _is_json(content_type: bytes) -> bool:
    media_type = content_type.partition(b";")[0].strip().lower()
    return media_type == b"application/json" or (
        media_type.startswith(b"application/") and media_type.endswith(b"+json")
    )


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it grows past `limit` (a lying Content-Length,
    or none at all with chunked encoding, must not make us buffer more)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(
    send: Send, status: int, body: bytes, allow: bytes = b"", *, close: bool = False
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if allow:
        headers.append((b"allow", allow))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
