"""The account's max_requests_per_second, enforced in fixed windows of the emulator clock,
and its max_requests_per_day, enforced per UTC day."""

from __future__ import annotations

import httpx
import pytest

from daemon.emulator import Emulator
from tests.emulator.support import PASSWORD, START, USERNAME, FakeClock, basic

RESET = str(int(START) + 1)
MIDNIGHT = (int(START) // 86_400 + 1) * 86_400  # the UTC midnight after START


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
    assert stats == {"rate_limited": 2, "daily_used": 0, "max_requests_in_window": 4, "calls": 5}


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


@pytest.fixture
def budgeted(emulator: Emulator) -> Emulator:
    emulator.max_requests_per_day = 2
    return emulator


def daily_headers(response: httpx.Response) -> tuple[str | None, ...]:
    names = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
    return tuple(response.headers.get(name) for name in names)


@pytest.mark.usefixtures("budgeted")
async def test_a_spent_daily_budget_is_429_with_the_daily_headers(
    client: httpx.AsyncClient,
) -> None:
    """Each answer shows what is left of the day; once none is, 429 until UTC midnight."""
    served = [await client.get("/v2/dlq/1-0") for _ in range(2)]
    assert [r.status_code for r in served] == [404, 404]
    assert [daily_headers(r) for r in served] == [
        ("2", "1", str(MIDNIGHT)),
        ("2", "0", str(MIDNIGHT)),
    ]
    refused = await client.get("/v2/dlq/1-0")
    assert refused.status_code == 429
    assert refused.json() == {"error": "daily request limit exceeded"}
    assert daily_headers(refused) == ("2", "0", str(MIDNIGHT))
    assert (await client.get("/_emulator/stats")).json()["daily_used"] == 2


@pytest.mark.usefixtures("budgeted")
async def test_the_daily_budget_starts_over_at_utc_midnight(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    for _ in range(3):
        await client.get("/v2/dlq/1-0")
    clock.now = MIDNIGHT
    response = await client.get("/v2/dlq/1-0")
    assert response.status_code == 404
    assert daily_headers(response) == ("2", "1", str(MIDNIGHT + 86_400))


@pytest.mark.usefixtures("limited", "budgeted")
async def test_a_burst_429_carries_no_daily_header_and_spends_nothing(
    client: httpx.AsyncClient,
) -> None:
    """The SDKs take a 429 with `RateLimit-Limit` for the daily limit's: a burst 429 must
    not carry it. A refused call is not charged to the day."""
    for _ in range(2):
        await client.get("/v2/dlq/1-0")
    budget = await client.post("/_emulator/account", json={"max_requests_per_day": 3})
    assert budget.json()["max_requests_per_day"] == 3
    refused = await client.get("/v2/dlq/1-0")
    assert refused.status_code == 429
    assert refused.headers["Burst-RateLimit-Limit"] == "2"
    assert daily_headers(refused) == (None, None, None)
    assert (await client.get("/_emulator/stats")).json()["daily_used"] == 2


@pytest.mark.usefixtures("budgeted")
async def test_a_call_with_a_bad_token_spends_none_of_the_day(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient
) -> None:
    statuses = [(await anonymous.get("/v2/dlq/1-0")).status_code for _ in range(3)]
    assert statuses == [401] * 3
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


async def test_the_daily_limit_is_set_lifted_and_shown_in_the_account_record(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient
) -> None:
    """Set with POST /_emulator/account (a field left out keeps its value; null lifts it);
    the token reset's record shows the limit in force."""
    await client.post("/_emulator/account", json={"max_requests_per_second": 5})
    answer = await client.post("/_emulator/account", json={"max_requests_per_day": 1})
    assert answer.json()["max_requests_per_second"] == 5
    record = await anonymous.post("/service/user/rotatetoken", headers=basic(USERNAME, PASSWORD))
    assert record.json()["max_requests_per_day"] == 1
    assert (await client.get("/v2/dlq/1-0")).status_code == 401  # the token was reset
    await client.post("/_emulator/account", json={"max_requests_per_day": None})
    assert (await client.get("/_emulator/account")).json()["max_requests_per_day"] is None


async def test_a_service_that_announces_its_limit_on_429s_only(
    client: httpx.AsyncClient, clock: FakeClock, emulator: Emulator
) -> None:
    """POST /_emulator/account `rate_limit_headers: on_429` and `rate_limit_window:
    sliding`: answers let through say nothing of the limit, a 429 says it all; the count
    is of the second before each call, across the clock's seconds; a reset brings the
    config's way back."""
    answer = await client.post(
        "/_emulator/account",
        json={
            "max_requests_per_second": 2,
            "rate_limit_headers": "on_429",
            "rate_limit_window": "sliding",
        },
    )
    assert answer.json()["rate_limit_headers"] == "on_429"
    assert answer.json()["rate_limit_window"] == "sliding"
    clock.advance(0.8 - clock() % 1)  # late in a second of the clock
    first = await client.get("/v2/dlq/1-0")
    second = await client.get("/v2/dlq/1-0")
    clock.advance(0.3)  # early in the next one: a fixed window would start over
    refused = await client.get("/v2/dlq/1-0")
    assert [first.status_code, second.status_code, refused.status_code] == [404, 404, 429]
    assert "Burst-RateLimit-Limit" not in first.headers
    assert refused.headers["Burst-RateLimit-Limit"] == "2"
    assert refused.headers["Burst-RateLimit-Remaining"] == "0"
    await client.post("/_emulator/reset")
    assert (await client.get("/_emulator/account")).json()["rate_limit_headers"] == "always"
    assert emulator.rate_limit_window == "fixed"
