"""How the client behaves when the service misbehaves: faults injected into the emulator."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from daemon.upstream import (
    BadRequest,
    CallRecord,
    ConnectionFailed,
    Credentials,
    CredentialsHolder,
    NotFound,
    RateLimiter,
    RetryPolicy,
    ServerError,
    ServiceClient,
    Timeout,
)
from tests.support import FAST_RETRY, TOKEN, USERNAME, Service


async def test_server_errors_are_retried_until_success(service: Service) -> None:
    """Two 503s, then the real answer: the caller sees only the answer."""
    [dlq_id] = await service.seed({"url": "https://a.example.com"})
    await service.fault(kind="status", status=503, times=2)
    assert (await service.client.get_dlq_message(dlq_id)).dlq_id == dlq_id
    assert [c["status"] for c in await service.journal()] == [503, 503, 200]


async def test_server_errors_give_up_after_the_attempt_bound(service: Service) -> None:
    """A service that keeps failing is given up on after max_attempts, not hammered."""
    await service.fault(kind="status", status=500, times=100)
    with pytest.raises(ServerError):
        await service.client.get_dlq_message("1-0")
    assert len(await service.journal()) == FAST_RETRY.max_attempts


async def test_client_errors_are_not_retried(service: Service) -> None:
    """A 400 would fail the same way again, so it is raised at once."""
    await service.fault(kind="status", status=400, times=5)
    with pytest.raises(BadRequest):
        await service.client.get_dlq_message("1-0")
    assert len(await service.journal()) == 1


async def test_rate_limited_call_waits_as_told(service: Service) -> None:
    """A 429 with Retry-After holds the call that long, then it goes through."""
    await service.fault(kind="rate_limit", retryAfter=0.3, times=1)
    started = time.monotonic()
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1-0")
    assert time.monotonic() - started >= 0.3
    assert [c["status"] for c in await service.journal()] == [429, 404]


async def test_a_429_slows_every_caller(service: Service) -> None:
    """After one caller is told to wait, the others wait too instead of piling on."""
    await service.fault(kind="rate_limit", retryAfter=0.4, times=1)
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1-0")  # draws the 429, pauses the limiter
    started = time.monotonic()
    await service.client.limiter.acquire()
    assert time.monotonic() - started == pytest.approx(0, abs=0.05)  # the pause is over
    await service.fault(kind="rate_limit", retryAfter=0.4, times=1)
    first = asyncio.create_task(service.client.get_dlq_message("1-0"))
    await asyncio.sleep(0.1)  # `first` has drawn its 429 by now
    started = time.monotonic()
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("2-0")
    assert time.monotonic() - started >= 0.2
    with pytest.raises(NotFound):
        await first


async def test_limit_announced_by_the_service_is_learned(service: Service) -> None:
    """Burst-RateLimit-Limit on an answer sets the limiter's rate."""
    await service.control.post("/_emulator/account", json={"max_requests_per_second": 37})
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1-0")
    assert service.client.limiter.rate == 37


async def test_token_rotated_in_flight_is_retried_once_with_the_new_one(service: Service) -> None:
    """A call sent with the old token while a rotation lands gets one more try."""
    await service.fault(kind="latency", seconds=0.3, times=1, paths=["/v2/dlq"])
    pending = asyncio.create_task(service.client.get_dlq_message("1-0"))
    await asyncio.sleep(0.1)  # the call is in the emulator, holding the old token
    record = await service.client.rotate_token()
    assert record.token is not None
    assert record.password is not None
    service.credentials.replace(
        Credentials(record.token.get_secret_value(), USERNAME, record.password.get_secret_value())
    )
    with pytest.raises(NotFound):  # authorised on the second try; the id is just unknown
        await pending
    statuses = [(c["path"], c["status"]) for c in await service.journal()]
    assert statuses == [
        ("/service/user/rotatetoken", 200),
        ("/v2/dlq/1-0", 401),
        ("/v2/dlq/1-0", 404),
    ]


SOCKET_ONLY = pytest.mark.parametrize("service", ["socket"], indirect=True)


@SOCKET_ONLY
async def test_calls_stay_under_the_service_limit(service: Service) -> None:
    """60 concurrent calls, the limiter pinned at the account's 20/s: the service
    counts no window over 20 and answers no 429."""
    await service.control.post("/_emulator/account", json={"max_requests_per_second": 20})
    client = service.client_with(
        limiter=RateLimiter(20, pinned=True), retry=RetryPolicy(max_attempts=1)
    )

    async def one(i: int) -> None:
        with pytest.raises(NotFound):
            await client.get_dlq_message(f"{i}-0")

    await asyncio.gather(*(one(i) for i in range(60)))
    stats = (await service.control.get("/_emulator/stats")).json()
    assert stats["rate_limited"] == 0
    assert stats["max_requests_in_window"] <= 20


@SOCKET_ONLY
async def test_dropped_connection_is_retried(service: Service) -> None:
    """The service drops the connection mid-answer once; the retry succeeds."""
    records: list[CallRecord] = []
    client = service.client_with(observe=records.append)
    await service.fault(kind="drop", times=1)
    with pytest.raises(NotFound):
        await client.get_dlq_message("1-0")
    assert [(r.error, r.status) for r in records] == [("connection", None), ("not_found", 404)]


@SOCKET_ONLY
async def test_timeout_is_raised_as_timeout(service: Service) -> None:
    """A service slower than the client's timeout ends in Timeout after the retries."""
    async with service.http(timeout=0.05) as http:
        client = service.client_with(http=http, retry=RetryPolicy(max_attempts=2, base_delay=0.01))
        await service.fault(kind="latency", seconds=0.5, times=2)
        with pytest.raises(Timeout):
            await client.get_dlq_message("1-0")


async def test_refused_connection_is_connection_failed() -> None:
    """Nothing listening: ConnectionFailed, after the bounded retries."""
    async with httpx.AsyncClient() as http:
        client = ServiceClient(
            http,
            base_url="http://127.0.0.1:9",
            credentials=CredentialsHolder(Credentials(TOKEN)),
            retry=RetryPolicy(max_attempts=2, base_delay=0.01),
        )
        with pytest.raises(ConnectionFailed):
            await client.get_dlq_message("1-0")
