"""The retry policy as a table: from what the service answered to retry-or-not and the wait."""

from __future__ import annotations

import httpx
import pytest

from daemon.upstream.errors import (
    BadRequest,
    CircuitOpen,
    ConnectionFailed,
    CorruptResponse,
    InvalidResponse,
    NotFound,
    RateLimited,
    RequestTimeout,
    ServerError,
    ServiceError,
    Timeout,
    TransportError,
    Unauthorized,
    error_from_response,
    from_httpx,
    is_transient,
    server_wait,
    surely_not_carried_out,
)
from daemon.upstream.retry import RetryPolicy

NOW = 1_763_712_000.0  # Unix seconds, the wall clock of every row
POLICY = RetryPolicy(base_delay=0.5, max_delay=30.0, max_attempts=6, max_elapsed=120.0)
HALF = 0.5  # rand() for every row, so full jitter is half the ceiling
REQUEST = httpx.Request("POST", "https://service.test/v2/workflows/dlq/resume")


def answer(status: int, **headers: str) -> ServiceError | None:
    response = httpx.Response(status, headers=headers, json={"error": "x"}, request=REQUEST)
    return error_from_response(response, operation="resume", now=NOW)


def refused(status: int, **headers: str) -> ServiceError:
    error = answer(status, **headers)
    assert error is not None
    return error


def failure(exc: type[httpx.RequestError]) -> ServiceError:
    return from_httpx(exc("boom", request=REQUEST), operation="resume")


# Held back by the resume's circuit breaker: nothing was sent.
HELD_BACK = CircuitOpen("circuit open", operation="resume", retry_at=12.0)


# (what happened, idempotent call?, expected wait before attempt 2 or None for "give up")
TABLE = [
    ("400 bad request", refused(400), True, None),
    ("401 unauthorized", refused(401), True, None),
    ("404 not found", refused(404), True, None),
    ("429 with Retry-After", refused(429, **{"Retry-After": "7"}), True, 7.0),
    (
        "429 with Retry-After date",
        answer(429, **{"Retry-After": "Fri, 21 Nov 2025 08:00:04 GMT"}),
        True,
        4.0,
    ),
    (
        "429 with reset only",
        refused(429, **{"Burst-RateLimit-Reset": str(int(NOW) + 3)}),
        True,
        3.0,
    ),
    # No usable wait named: base_delay plus the jittered backoff (0.25), never a hot loop.
    ("429 with neither", refused(429), True, 0.75),
    ("429 with Retry-After 0", refused(429, **{"Retry-After": "0"}), True, 0.75),
    (
        "429 with a reset already past",
        refused(429, **{"Burst-RateLimit-Reset": str(int(NOW) - 9)}),
        True,
        0.75,
    ),
    ("429 on the token reset", refused(429), False, 0.75),
    ("500", refused(500), True, 0.25),
    ("502", refused(502), True, 0.25),
    ("503", refused(503), True, 0.25),
    ("503 on the token reset", refused(503), False, None),
    ("503 with Retry-After", refused(503, **{"Retry-After": "4"}), True, 4.0),
    ("503 with Retry-After under the backoff", refused(503, **{"Retry-After": "0.1"}), True, 0.25),
    ("503 with Retry-After on the token reset", refused(503, **{"Retry-After": "4"}), False, None),
    ("408 request timeout", refused(408), True, 0.25),
    ("408 on the token reset", refused(408), False, None),
    ("read timeout", failure(httpx.ReadTimeout), True, 0.25),
    ("read timeout on the token reset", failure(httpx.ReadTimeout), False, None),
    ("connect timeout on the token reset", failure(httpx.ConnectTimeout), False, 0.25),
    ("connection reset", failure(httpx.ReadError), True, 0.25),
    ("connection dropped mid-response", failure(httpx.RemoteProtocolError), True, 0.25),
    ("connection refused on the token reset", failure(httpx.ConnectError), False, 0.25),
    ("corrupt answer", failure(httpx.DecodingError), True, 0.25),
    ("corrupt answer on the token reset", failure(httpx.DecodingError), False, None),
    ("circuit open", HELD_BACK, True, None),
    ("circuit open on the token reset", HELD_BACK, False, None),
]


def test_success_is_not_an_error() -> None:
    """A 200 yields no error, so nothing is retried."""
    assert answer(200) is None


@pytest.mark.parametrize(
    ("error", "idempotent", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_retry_table(error: ServiceError, idempotent: bool, expected: float | None) -> None:
    """Each kind of failure is retried (with its wait) or given up, as the table says."""
    delay = POLICY.next_delay(
        error, attempt=1, elapsed=0.0, rand=lambda: HALF, idempotent=idempotent
    )
    assert delay == pytest.approx(expected) if expected is not None else delay is None


def test_transport_errors_are_typed() -> None:
    """Timeouts and connection failures map to their own error types."""
    assert isinstance(failure(httpx.ReadTimeout), Timeout)
    assert isinstance(failure(httpx.ReadError), ConnectionFailed)
    assert failure(httpx.ConnectError).request_sent is False
    assert failure(httpx.ReadTimeout).request_sent is True


def test_answers_and_failures_are_typed() -> None:
    """A 408 is RequestTimeout; an answer that does not decode is CorruptResponse, "decode",
    sent; CircuitOpen is a transport error that was never sent."""
    assert isinstance(refused(408), RequestTimeout)
    corrupt = failure(httpx.DecodingError)
    assert isinstance(corrupt, CorruptResponse)
    assert isinstance(corrupt, TransportError)
    assert (corrupt.reason, corrupt.request_sent) == ("decode", True)
    assert isinstance(HELD_BACK, TransportError)
    assert (HELD_BACK.reason, HELD_BACK.request_sent, HELD_BACK.retry_at) == (
        "circuit_open",
        False,
        12.0,
    )


# (error, will a later try do better?, surely not carried out?)
CLASSES = [
    ("400", BadRequest("x", status=400), False, True),
    ("401", Unauthorized("x", status=401), False, True),
    ("404", NotFound("x", status=404), False, True),
    ("408", RequestTimeout("x", status=408), True, False),
    ("429", RateLimited("x"), True, True),
    ("503", ServerError("x", status=503), True, False),
    ("invalid answer", InvalidResponse("x"), False, False),
    ("read timeout", failure(httpx.ReadTimeout), True, False),
    ("connect refused", failure(httpx.ConnectError), True, True),
    ("corrupt answer", failure(httpx.DecodingError), True, False),
    ("circuit open", HELD_BACK, True, True),
]


@pytest.mark.parametrize(
    ("error", "transient", "not_carried_out"),
    [row[1:] for row in CLASSES],
    ids=[row[0] for row in CLASSES],
)
def test_errors_are_classified_once(
    error: ServiceError, transient: bool, not_carried_out: bool
) -> None:
    """The two questions the pipeline asks of any error: retry later, and did it act?"""
    assert is_transient(error) is transient
    assert surely_not_carried_out(error) is not_carried_out


def test_backoff_ceiling_doubles_up_to_the_cap() -> None:
    """With rand() at its top, the waits double per attempt and stop at max_delay."""
    policy = RetryPolicy(base_delay=1.0, max_delay=10.0, max_attempts=99, max_elapsed=1e9)
    waits = [
        policy.next_delay(refused(503), attempt=n, elapsed=0, rand=lambda: 1.0) for n in range(1, 7)
    ]
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_full_jitter_spans_zero_to_ceiling() -> None:
    """Full jitter: rand() = 0 waits nothing, so many clients do not retry in step."""
    assert POLICY.next_delay(refused(503), attempt=3, elapsed=0, rand=lambda: 0.0) == 0.0


def test_attempts_are_bounded() -> None:
    """After max_attempts the policy gives up even on a retryable failure."""
    assert POLICY.next_delay(refused(503), attempt=6, elapsed=0, rand=lambda: HALF) is None


def test_total_time_is_bounded() -> None:
    """A wait that would end past max_elapsed is not taken."""
    late = POLICY.next_delay(
        answer(429, **{"Retry-After": "30"}),
        attempt=1,
        elapsed=100.0,
        rand=lambda: HALF,
    )
    assert late is None


def test_server_wait_is_capped() -> None:
    """A Retry-After of an hour is cut to max_server_wait rather than obeyed blindly."""
    delay = RetryPolicy(max_elapsed=1e9).next_delay(
        answer(429, **{"Retry-After": "3600"}),
        attempt=1,
        elapsed=0,
        rand=lambda: HALF,
    )
    assert delay == 60.0


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"Retry-After": "2", "Burst-RateLimit-Reset": str(int(NOW) + 9)}, 2.0),
        ({"Retry-After": "soon", "Burst-RateLimit-Reset": str(int(NOW) + 9)}, 9.0),
        ({"Burst-RateLimit-Reset": str(int(NOW * 1000) + 1500)}, 1.5),
        ({"Burst-RateLimit-Reset": "2"}, 2.0),
        ({"Burst-RateLimit-Reset": str(int(NOW) - 5)}, 0.0),
        ({}, None),
        (
            {
                "Burst-RateLimit-Reset": str(int(NOW) + 1),
                "RateLimit-Remaining": "0",
                "RateLimit-Reset": str(int(NOW) + 7200),
            },
            7200.0,
        ),
        (
            {
                "Burst-RateLimit-Reset": str(int(NOW) + 1),
                "RateLimit-Remaining": "5",
                "RateLimit-Reset": str(int(NOW) + 7200),
            },
            1.0,
        ),
        ({"Retry-After": "3", "RateLimit-Remaining": "0", "RateLimit-Reset": "7200"}, 3.0),
    ],
    ids=[
        "retry-after wins",
        "bad retry-after falls back",
        "reset in ms",
        "reset as seconds",
        "reset in the past",
        "no hint",
        "a spent day waits for its reset",
        "a day not spent is the burst's 429",
        "retry-after wins over the day",
    ],
)
def test_server_wait_reads_the_headers(headers: dict[str, str], wait: float | None) -> None:
    """Retry-After first, then the daily reset once the day is spent, then
    Burst-RateLimit-Reset; a reset in seconds, milliseconds or as a delta."""
    assert server_wait(httpx.Headers(headers), NOW) == wait
