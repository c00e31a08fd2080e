"""The account's max_requests_per_second, enforced in fixed windows of the emulator clock."""

from __future__ import annotations

import httpx
import pytest

from daemon.emulator import Emulator
from tests.emulator.support import PASSWORD, START, USERNAME, FakeClock, basic

RESET = str(int(START) + 1)


@pytest.fixture
def limited(emulator: Emulator) -> Emulator:
    emulator.max_requests_per_second = 2
    return emulator


@pytest.mark.usefixtures("limited")
async def test_over_the_limit_is_429_with_burst_headers(client: httpx.AsyncClient) -> None:
    """The third call in a 2/s window: 429, the Burst headers, and no Retry-After."""
    for _ in range(2):
        await client.get("/v2/dlq/1-0")
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 429
    assert set(response.json()) == {"error"}
    assert response.headers["Burst-RateLimit-Limit"] == "2"
    assert response.headers["Burst-RateLimit-Remaining"] == "0"
    assert response.headers["Burst-RateLimit-Reset"] == RESET
    assert "Retry-After" not in response.headers


@pytest.mark.usefixtures("limited")
async def test_answers_within_the_limit_carry_the_burst_headers(client: httpx.AsyncClient) -> None:
    """A call let through shows the limit, what remains and the window's end."""
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 404
    assert response.headers["Burst-RateLimit-Limit"] == "2"
    assert response.headers["Burst-RateLimit-Remaining"] == "1"
    assert response.headers["Burst-RateLimit-Reset"] == RESET


@pytest.mark.usefixtures("limited")
async def test_next_window_lets_calls_through_again(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    """Once the clock passes the window's end, the count starts over."""
    statuses = [(await client.get("/v2/dlq/1-0")).status_code for _ in range(3)]
    clock.advance(1)
    statuses.append((await client.get("/v2/dlq/1-0")).status_code)
    assert statuses == [404, 404, 429, 404]


@pytest.mark.usefixtures("limited")
async def test_stats_count_429s_and_the_busiest_window(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    """rate_limited counts 429s sent; max_requests_in_window counts every arrival."""
    for _ in range(4):
        await client.get("/v2/dlq/1-0")
    clock.advance(1)
    await client.get("/v2/dlq/1-0")
    stats = (await client.get("/_emulator/stats")).json()
    assert stats == {"rate_limited": 2, "max_requests_in_window": 4, "calls": 5}


@pytest.mark.usefixtures("limited")
async def test_account_endpoint_counts_toward_the_limit(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient
) -> None:
    """The token reset is rate-limited with the message operations."""
    for _ in range(2):
        await client.get("/v2/dlq/1-0")
    response = await anonymous.post("/service/user/rotatetoken", headers=basic(USERNAME, PASSWORD))
    assert response.status_code == 429


@pytest.mark.usefixtures("limited")
async def test_unauthenticated_calls_do_not_count(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient
) -> None:
    """A call without the account's credentials is a 401 and uses none of its quota."""
    statuses = [(await anonymous.get("/v2/dlq/1-0")).status_code for _ in range(5)]
    assert statuses == [401] * 5
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


@pytest.mark.usefixtures("limited")
async def test_control_api_is_not_limited(client: httpx.AsyncClient) -> None:
    """/_emulator/* calls neither count nor get refused."""
    statuses = {(await client.get("/_emulator/stats")).status_code for _ in range(5)}
    assert statuses == {200}
    assert (await client.get("/_emulator/stats")).json()["calls"] == 0


async def test_limit_is_set_at_runtime(client: httpx.AsyncClient) -> None:
    """POST /_emulator/account sets the limit; null lifts it."""
    set_one = await client.post("/_emulator/account", json={"max_requests_per_second": 1})
    assert set_one.json()["max_requests_per_second"] == 1
    statuses = [(await client.get("/v2/dlq/1-0")).status_code for _ in range(2)]
    await client.post("/_emulator/account", json={"max_requests_per_second": None})
    statuses.append((await client.get("/v2/dlq/1-0")).status_code)
    assert statuses == [404, 429, 404]


async def test_no_limit_no_burst_headers(client: httpx.AsyncClient) -> None:
    """Without a limit the answers do not announce one."""
    response = await client.get("/v2/dlq/1-0")
    assert "Burst-RateLimit-Limit" not in response.headers
