"""The one error tree of the service client; each error's `reason` is also its metric label.

    ServiceError
    ├── ResponseError          the service answered with an error status
    │   ├── BadRequest         400 (and other 4xx not listed below): our request is wrong
    │   ├── Unauthorized       401: token or basic credentials refused
    │   ├── NotFound           404: e.g. the DLQ message was removed
    │   ├── RateLimited        429: carries the wait the service told us, if any
    │   └── ServerError        5xx
    ├── InvalidResponse        a success status with a body that is not what the spec says
    └── TransportError         no usable answer
        ├── Timeout            connect, read, write or pool timeout
        └── ConnectionFailed   refused, reset or dropped mid-response

httpx errors are translated once, in `from_httpx`, and never leak past the client.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping

import httpx

# A reset header above this is a Unix time in milliseconds, between it and
# _SECONDS_EPOCH a Unix time in seconds, below it a number of seconds to wait.
_MILLIS_EPOCH = 1e11
_SECONDS_EPOCH = 1e8
_MESSAGE_LIMIT = 300


class ServiceError(Exception):
    """Base of every error the service client raises."""

    reason = "error"

    def __init__(self, message: str, *, operation: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation


class ResponseError(ServiceError):
    reason = "response"

    def __init__(self, message: str, *, status: int, operation: str = "") -> None:
        super().__init__(message, operation=operation)
        self.status = status

    def __str__(self) -> str:
        return f"{self.operation or 'call'}: {self.status} {self.message}"


class BadRequest(ResponseError):
    reason = "bad_request"


class Unauthorized(ResponseError):
    reason = "unauthorized"


class NotFound(ResponseError):
    reason = "not_found"


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
        super().__init__(message, status=status, operation=operation)
        self.retry_after = retry_after  # seconds to wait, as told by the service
        self.limit = limit  # the service's requests-per-second limit, when it said so


class ServerError(ResponseError):
    reason = "server_error"


class InvalidResponse(ServiceError):
    """The service said yes but its answer does not parse: a bug or an incompatible
    service version, not something a retry fixes."""

    reason = "invalid_response"


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
    if status >= 500:
        return ServerError(message, status=status, operation=operation)
    kind = {401: Unauthorized, 403: Unauthorized, 404: NotFound}.get(status, BadRequest)
    return kind(message, status=status, operation=operation)


def from_httpx(exc: httpx.TransportError, *, operation: str) -> TransportError:
    """Translate an httpx transport error; the message never carries request headers."""
    detail = type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return Timeout(f"connect timeout ({detail})", operation=operation, request_sent=False)
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"timed out ({detail})", operation=operation)
    if isinstance(exc, httpx.ConnectError):
        return ConnectionFailed(
            f"cannot connect ({detail})", operation=operation, request_sent=False
        )
    return ConnectionFailed(f"connection failed ({detail})", operation=operation)


def surely_not_carried_out(error: ServiceError) -> bool:
    """Whether the service certainly did not act on the failed call: it refused it (4xx),
    or the request never left. A 5xx or a lost answer may come after the change was made."""
    if isinstance(error, ResponseError):
        return not isinstance(error, ServerError)
    return isinstance(error, TransportError) and not error.request_sent


def error_from_response(
    response: httpx.Response, *, operation: str, now: float
) -> ResponseError | None:
    """The typed error for a response, or None when it succeeded. `now`: Unix seconds."""
    if response.is_success:
        return None
    status = response.status_code
    return error_for_status(
        status,
        _message(response),
        operation=operation,
        retry_after=server_wait(response.headers, now) if status == 429 else None,
        limit=server_limit(response.headers),
    )


def _message(response: httpx.Response) -> str:
    """The service's `{"error": ...}` message, or the start of whatever it sent."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message: str = body["error"]
    else:
        message = response.text or response.reason_phrase
    return message[:_MESSAGE_LIMIT]


def server_wait(headers: Mapping[str, str], now: float) -> float | None:
    """The wait a 429 asks for: `Retry-After` when present, else `Burst-RateLimit-Reset`.

    `headers` is case-insensitive (httpx.Headers); `now` is the Unix time in seconds.
    Retry-After is seconds or an HTTP date (RFC 9110). The reset header is a Unix
    time (QStash sends seconds); a small number is read as seconds to wait.
    """
    retry_after = headers.get("retry-after")
    if retry_after is not None:
        wait = _parse_retry_after(retry_after.strip(), now)
        if wait is not None:
            return wait
    reset = _parse_number(headers.get("burst-ratelimit-reset"))
    if reset is None:
        return None
    if reset >= _MILLIS_EPOCH:
        return max(reset / 1000 - now, 0.0)
    if reset >= _SECONDS_EPOCH:
        return max(reset - now, 0.0)
    return max(reset, 0.0)


def server_limit(headers: Mapping[str, str]) -> int | None:
    """The requests-per-second limit the service announces, if any."""
    limit = _parse_number(headers.get("burst-ratelimit-limit"))
    return int(limit) if limit is not None and limit >= 1 else None


def _parse_retry_after(value: str, now: float) -> float | None:
    seconds = _parse_number(value)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now, 0.0)


def _parse_number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and number not in (float("inf"), float("-inf")) else None
