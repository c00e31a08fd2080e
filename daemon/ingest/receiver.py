"""`POST /callbacks` (PRODUCT.md §2): check a failure callback and store it before the 2xx.

A plain ASGI app rather than a FastAPI route: this is the hot path when a bad hour
downstream sends thousands of callbacks a second, and FastAPI's request parsing costs
about four times the rest of the work. Checks run cheapest first, and nothing is parsed
before the signature holds. The token is checked from the headers before the body is
read: anyone can connect, and only the service's signed requests are worth buffering a
body for. An answer given before the body was read closes the connection (the body need
not be read either).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, NamedTuple

import structlog

from daemon.ingest.callback import CallbackError, parse_callback
from daemon.ingest.signature import SignatureError, Verifier, check_body
from daemon.metrics import CallbackResult, Metrics
from daemon.store import Added, Callback, Store, StoreUnavailable

log = structlog.get_logger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


class _ClientGone(Exception):
    """The sender hung up before its body arrived: there is no one to answer."""


class _Answer(NamedTuple):
    status: int
    result: CallbackResult
    body: bytes
    close: bool = False  # given before the body was read: the connection ends with it


def _stored(result: Added, dlq_id: str) -> _Answer:
    # Built by hand: json.dumps of the whole dict was a tenth of the request's own time.
    body = b'{"status":"%s","dlqId":%s}' % (result.encode(), _json_string(dlq_id).encode())
    return _Answer(200, result, body)


def _error(
    status: int,
    result: CallbackResult,
    message: str,
    field: str | None = None,
    *,
    close: bool = False,
) -> _Answer:
    error = {"error": message} if field is None else {"error": message, "field": field}
    return _Answer(status, result, json.dumps(error).encode(), close)


class CallbackReceiver:
    """The ASGI app behind `POST /callbacks`.

    `verifier` is None only when the daemon runs unsigned (RECOVERYD_ALLOW_UNSIGNED with
    no keys); with keys and unsigned allowed, a callback without a signature is taken but
    one with a bad signature is still refused. `on_accepted` hears of each new dlqId once
    it is stored.
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
        self._max_body_bytes = max_body_bytes
        self._wall_clock = wall_clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if scope["method"] != "POST":
            await _respond(send, 405, b'{"error":"use POST"}', allow=b"POST")
            return
        try:
            answer = await self._answer(scope, receive)
        except _ClientGone:
            return
        await _respond(send, answer.status, answer.body, close=answer.close)
        self._metrics.callbacks[answer.result].inc()
        self._metrics.callback_seconds.observe(time.perf_counter() - started)

    async def _answer(self, scope: Scope, receive: Receive) -> _Answer:
        length, content_type, signature = self._headers(scope)
        if length is not None and length > self._max_body_bytes:
            return self._too_large()
        if not _is_json(content_type):
            message = "Content-Type must be application/json"
            return _error(415, "unsupported_media_type", message, close=True)
        claims, refused = self._check_token(signature)
        if refused is not None:
            return refused
        body = await _read_body(receive, self._max_body_bytes)
        if body is None:
            return self._too_large()
        if claims is not None:
            try:
                check_body(claims, body)
            except SignatureError as exc:
                return self._bad_signature(exc, close=False)
        try:
            callback = parse_callback(body)
        except CallbackError as exc:
            log.info("callback refused", reason=str(exc), field=exc.field)
            return _error(400, "invalid", str(exc), exc.field)
        try:
            added = await self._store.add_callback(
                Callback(callback.dlq_id, body, self._wall_clock(), verified=claims is not None)
            )
        except StoreUnavailable as exc:
            log.warning("callback not stored", dlq_id=callback.dlq_id, reason=str(exc))
            return _error(503, "unavailable", f"cannot store the callback now: {exc}")
        log.debug("callback stored", dlq_id=callback.dlq_id, result=added)
        if added == "accepted":
            self._on_accepted(callback.dlq_id)
        return _stored(added, callback.dlq_id)

    def _headers(self, scope: Scope) -> tuple[int | None, bytes, bytes | None]:
        length: int | None = None
        content_type = b""
        signature: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                # A length too long to be real is left for the read to refuse.
                length = int(value) if value.isdigit() and len(value) < 19 else None
            elif name == b"content-type":
                content_type = value
            elif name == self._signature_header and signature is None:
                signature = value
        return length, content_type, signature

    def _check_token(self, signature: bytes | None) -> tuple[dict[str, Any] | None, _Answer | None]:
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

    def _bad_signature(self, exc: SignatureError, *, close: bool) -> _Answer:
        log.info("callback signature refused", reason=str(exc))
        message = f"bad {self._signature_name}: {exc}"
        return _error(401, "unauthorized", message, close=close)

    def _too_large(self) -> _Answer:
        # Refused from its Content-Length, or part way through: the rest is never read.
        limit = self._max_body_bytes
        return _error(413, "too_large", f"the body is over the limit of {limit} bytes", close=True)


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
