"""The one error tree of the service client; each error's `reason` is also its metric label.

    ServiceError
    ├── ResponseError          the service answered with an error status
    │   ├── BadRequest         400 (and other 4xx not listed below): our request is wrong
    │   ├── Unauthorized       401, 403: token or basic credentials refused
    │   ├── NotFound           404: e.g. the DLQ message was removed
    │   ├── RequestTimeout     408: the service gave up waiting for our request
    │   ├── RateLimited        429: carries the wait the service told us, if any
    │   └── ServerError        5xx
    ├── InvalidResponse        a success status with a body that is not what the spec says
    ├── InvalidRequest         httpx refused to make the request (bad URL or header)
    └── TransportError         no usable answer
        ├── Timeout            connect, read, write or pool timeout
        ├── ConnectionFailed   refused, reset or dropped mid-response
        ├── CorruptResponse    an answer whose bytes do not decode (e.g. a broken gzip body)
        ├── CircuitOpen        not sent: the operation's circuit breaker holds calls back
        └── Fenced             not sent: the caller may no longer make it (its lease lapsed)

httpx errors are translated once, in `from_httpx`, and never leak past the client. The
pipeline acts on two questions asked of any error: `is_transient` (will a later try
do better?) and `surely_not_carried_out` (can the service have acted on it?).
"""

from __future__ import annotations

from typing import Final

import httpx

from daemon.upstream.headers import retry_after as header_retry_after
from daemon.upstream.headers import server_limit, server_wait

_MESSAGE_LIMIT = 300
# Everything httpx raises from a request: its own tree, plus the two outside it.
HTTPX_ERRORS: Final = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError)


class ServiceError(Exception):
    """Base of every error the service client raises."""

    reason = "error"

    def __init__(self, message: str, *, operation: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation


class ResponseError(ServiceError):
    reason = "response"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        operation: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, operation=operation)
        self.status = status
        # Seconds the service asked us to wait before trying again (Retry-After; on a
        # 429 also Burst-RateLimit-Reset), if it said.
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.operation or 'call'}: {self.status} {self.message}"


class BadRequest(ResponseError):
    reason = "bad_request"


class Unauthorized(ResponseError):
    reason = "unauthorized"


class NotFound(ResponseError):
    reason = "not_found"


class RequestTimeout(ResponseError):
    """408: the service (or a proxy before it) stopped waiting for our request. Whether
    it acted is unknown, as after a 5xx; a later try usually works."""

    reason = "request_timeout"


class RateLimited(ResponseError):
    reason = "rate_limited"

    def __init__(
        self,
        message: str,
        *,
        status: int = 429,
        operation: str = "",
        retry_after: float | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message, status=status, operation=operation, retry_after=retry_after)
        self.limit = limit  # the service's requests-per-second limit, when it said so


class ServerError(ResponseError):
    reason = "server_error"


class InvalidResponse(ServiceError):
    """The service said yes but its answer does not parse: a bug or an incompatible
    service version, not something a retry fixes."""

    reason = "invalid_response"


class InvalidRequest(ServiceError):
    """httpx refused to build or send the request (an invalid URL, header or scheme): a
    bug or bad configuration, and the request never left."""

    reason = "invalid_request"


class TransportError(ServiceError):
    reason = "transport"

    def __init__(self, message: str, *, operation: str = "", request_sent: bool = True) -> None:
        super().__init__(message, operation=operation)
        # False only when the request certainly never reached the service (connect failed),
        # which makes even a non-idempotent call safe to repeat.
        self.request_sent = request_sent

    def __str__(self) -> str:
        return f"{self.operation or 'call'}: {self.message}"


class Timeout(TransportError):
    reason = "timeout"


class ConnectionFailed(TransportError):
    reason = "connection"


class CorruptResponse(TransportError):
    """An answer came but its bytes do not decode: a gzip body that does not inflate, or
    one that is not text at all. Something on the way (a proxy) broke it; the service
    may have acted on the request."""

    reason = "decode"


class CircuitOpen(TransportError):
    """The operation's circuit breaker holds calls back after repeated transient failures;
    nothing was sent. Not retried by the client: the caller reschedules the work for
    `retry_at` (monotonic clock), or polls again then while a probe call is out."""

    reason = "circuit_open"

    def __init__(self, message: str, *, operation: str, retry_at: float) -> None:
        super().__init__(message, operation=operation, request_sent=False)
        self.retry_at = retry_at


class Fenced(TransportError):
    """Not sent: the caller's fence said no right before the attempt went out. A replica
    whose lease in the shared store may have passed to another must not send for the
    work it held (daemon/runtime/replicas.py). Not retried: the caller decides what comes next."""

    reason = "fenced"

    def __init__(self, message: str, *, operation: str) -> None:
        super().__init__(message, operation=operation, request_sent=False)


_CLIENT_ERRORS: dict[int, type[ResponseError]] = {
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    408: RequestTimeout,
}


def error_for_status(
    status: int,
    message: str,
    *,
    operation: str,
    retry_after: float | None = None,
    limit: int | None = None,
) -> ResponseError:
    """The typed error for an HTTP error status."""
    if status == 429:
        return RateLimited(
            message, status=status, operation=operation, retry_after=retry_after, limit=limit
        )
    kind = ServerError if status >= 500 else _CLIENT_ERRORS.get(status, BadRequest)
    return kind(message, status=status, operation=operation, retry_after=retry_after)


def from_httpx(
    exc: httpx.HTTPError | httpx.InvalidURL | httpx.StreamError, *, operation: str
) -> ServiceError:
    """Translate anything httpx raises (`HTTPX_ERRORS`); the message never carries
    request headers or the URL, which may hold credentials."""
    detail = type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return Timeout(f"connect timeout ({detail})", operation=operation, request_sent=False)
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"timed out ({detail})", operation=operation)
    if isinstance(exc, httpx.ConnectError):
        return ConnectionFailed(
            f"cannot connect ({detail})", operation=operation, request_sent=False
        )
    if isinstance(exc, httpx.DecodingError):
        return CorruptResponse(f"answer does not decode ({detail})", operation=operation)
    if isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return InvalidRequest(f"request refused by httpx ({detail})", operation=operation)
    if isinstance(exc, httpx.RequestError):
        return ConnectionFailed(f"connection failed ({detail})", operation=operation)
    # A StreamError (a body read twice) or an HTTPStatusError: our own misuse of httpx,
    # after the request may have gone out.
    return TransportError(f"client failure ({detail})", operation=operation)


def refused(status: int) -> bool:
    """Whether an error status says the service refused the call without acting on it:
    any but a 5xx or a 408, which may come after the change was made."""
    return status < 500 and status != 408


def surely_not_carried_out(error: ServiceError) -> bool:
    """Whether the service certainly did not act on the failed call: it refused it (4xx
    but 408), or the request never left. A 5xx, a 408 or a lost or corrupt answer may
    come after the change was made."""
    if isinstance(error, ResponseError):
        return refused(error.status)
    if isinstance(error, InvalidRequest):
        return True
    return isinstance(error, TransportError) and not error.request_sent


def is_transient(error: ServiceError) -> bool:
    """Whether a later try may do better: the network, the service's health or its rate
    limit failed the call (transport errors, undecodable answers, 5xx, 408, 429, an
    open circuit), not the request itself. Other 4xx and an answer that does not parse
    would fail the same way again."""
    if isinstance(error, TransportError):
        return True
    return isinstance(error, ServerError | RequestTimeout | RateLimited)


def error_from_response(
    response: httpx.Response, *, operation: str, now: float
) -> ResponseError | None:
    """The typed error for a response, or None when it succeeded. `now`: Unix seconds."""
    if response.is_success:
        return None
    status = response.status_code
    headers = response.headers
    # A 429's wait may come from the rate-limit reset; any other status only asks for
    # one with Retry-After.
    told = server_wait(headers, now) if status == 429 else header_retry_after(headers, now)
    return error_for_status(
        status,
        _message(response),
        operation=operation,
        retry_after=told,
        limit=server_limit(headers),
    )


def _message(response: httpx.Response) -> str:
    """The service's `{"error": ...}` message, or the start of whatever it sent."""
    try:
        body = response.json()
    except (ValueError, RecursionError):  # not JSON, not text, or absurdly nested
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message: str = body["error"]
    else:
        message = response.text or response.reason_phrase
    return message[:_MESSAGE_LIMIT]
