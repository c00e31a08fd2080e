"""The outage switch: the whole service API answering 503, dropping or hanging its calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from daemon.emulator import Emulator, create_app
from daemon.emulator.outage import MAX_HOLD_SECONDS
from tests.emulator.support import (
    BEARER,
    PASSWORD,
    TOKEN,
    USERNAME,
    FakeClock,
    basic,
    seed,
    workflow,
)

RESUME = "/v2/workflows/dlq/resume"
ROTATE = "/service/user/rotatetoken"


async def outage(client: httpx.AsyncClient, **spec: Any) -> dict[str, Any]:
    response = await client.post("/_emulator/outage", json=spec)
    assert response.status_code == 200, response.text
    state: dict[str, Any] = response.json()
    return state


async def journal(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = (await client.get("/_emulator/journal")).json()
    return calls


async def held(client: httpx.AsyncClient, count: int) -> None:
    """Wait until the outage holds `count` calls."""
    for _ in range(500):
        if (await client.get("/_emulator/outage")).json()["held"] == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the outage never held {count} calls")


async def test_503_outage_answers_every_service_path(anonymous: httpx.AsyncClient) -> None:
    """Message operations, the account endpoint and unknown paths: 503 with {"error"}."""
    await outage(anonymous, mode="503")
    responses = [
        await anonymous.get("/v2/dlq/1-0", headers=BEARER),
        await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD)),
        await anonymous.get("/no/such/path"),
    ]
    assert [r.status_code for r in responses] == [503, 503, 503]
    assert all(set(r.json()) == {"error"} for r in responses)


async def test_control_api_stays_up_during_an_outage(client: httpx.AsyncClient) -> None:
    """/_emulator/* answers as usual while the service is down."""
    await outage(client, mode="drop")
    assert (await client.get("/_emulator/stats")).status_code == 200


async def test_503_outage_sends_retry_after_when_asked(client: httpx.AsyncClient) -> None:
    """retryAfter puts a Retry-After on the outage's 503s; without it there is none."""
    await outage(client, mode="503", retryAfter=30)
    assert (await client.get("/v2/dlq/1-0")).headers["Retry-After"] == "30"
    await outage(client, mode="503")
    assert "Retry-After" not in (await client.get("/v2/dlq/1-0")).headers


async def test_outage_changes_nothing_in_the_service(
    anonymous: httpx.AsyncClient, emulator: Emulator
) -> None:
    """A resume and a token reset refused by the outage take nothing out and rotate nothing."""
    [dlq_id] = await seed(anonymous, workflow("wfr_1"))
    await outage(anonymous, mode="503")
    await anonymous.post(RESUME, params={"dlqIds": dlq_id}, headers=BEARER)
    await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD))
    assert [m["dlqId"] for m in (await anonymous.get("/_emulator/dlq")).json()] == [dlq_id]
    assert (await anonymous.get("/_emulator/runs")).json() == []
    assert emulator.account.token == TOKEN


async def test_outage_calls_do_not_count_toward_the_rate_limit(
    client: httpx.AsyncClient, emulator: Emulator
) -> None:
    """Refused calls use no quota: the first call after the outage is let through."""
    emulator.max_requests_per_second = 1
    await outage(client, mode="503")
    for _ in range(3):
        await client.get("/v2/dlq/1-0")
    await client.delete("/_emulator/outage")
    assert (await client.get("/v2/dlq/1-0")).status_code == 404
    assert (await client.get("/_emulator/stats")).json()["calls"] == 1


async def test_outage_leaves_armed_faults_for_after(client: httpx.AsyncClient) -> None:
    """A fault armed before the outage still applies to the first call after it."""
    await client.post("/_emulator/faults", json={"kind": "status", "status": 502})
    await outage(client, mode="503")
    await client.get("/v2/dlq/1-0")
    await client.delete("/_emulator/outage")
    assert (await client.get("/v2/dlq/1-0")).status_code == 502


async def test_outage_calls_are_journaled_with_their_mode(client: httpx.AsyncClient) -> None:
    """Each call met by an outage is journaled with "outage": mode, its status and body."""
    await client.get("/v2/dlq/1-0")
    await outage(client, mode="503")
    await client.post(RESUME, params={"dlqIds": "1-0"}, content=b"{}")
    await outage(client, mode="drop")
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/v2/dlq/1-0")
    calls = await journal(client)
    assert [(c["status"], c.get("outage")) for c in calls] == [
        (404, None),
        (503, "503"),
        (0, "drop"),
    ]
    assert calls[1]["body"] == "{}"


async def test_outage_counts_the_calls_it_met(client: httpx.AsyncClient) -> None:
    """GET /_emulator/outage reports the calls met by the outage switched on last."""
    await outage(client, mode="503", seconds=60)
    for _ in range(2):
        await client.get("/v2/dlq/1-0")
    assert (await client.get("/_emulator/outage")).json() == {
        "active": True,
        "mode": "503",
        "seconds": 60,
        "remaining": 60,
        "retryAfter": None,
        "calls": 2,
        "held": 0,
    }


async def test_outage_ends_after_its_seconds_on_the_emulator_clock(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    """With seconds, the service is back once the emulator's clock has moved that far."""
    await outage(client, mode="503", seconds=180)
    clock.advance(179.5)
    assert (await client.get("/v2/dlq/1-0")).status_code == 503
    clock.advance(0.5)
    assert (await client.get("/v2/dlq/1-0")).status_code == 404
    assert (await client.get("/_emulator/outage")).json()["active"] is False


async def test_outage_without_seconds_lasts_until_deleted(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    """No seconds: down however far the clock moves, until DELETE /_emulator/outage."""
    await outage(client, mode="503")
    clock.advance(86_400)
    assert (await client.get("/v2/dlq/1-0")).status_code == 503
    ended = await client.delete("/_emulator/outage")
    assert ended.json()["active"] is False
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


async def test_new_outage_replaces_the_one_in_force(client: httpx.AsyncClient) -> None:
    """A second POST changes the mode and starts its own timer."""
    await outage(client, mode="drop", seconds=5)
    state = await outage(client, mode="503", seconds=90)
    assert (state["mode"], state["remaining"]) == ("503", 90)
    assert (await client.get("/v2/dlq/1-0")).status_code == 503


async def test_reset_ends_the_outage(client: httpx.AsyncClient) -> None:
    """POST /_emulator/reset brings the service back too."""
    await outage(client, mode="503")
    await client.post("/_emulator/reset")
    assert (await client.get("/v2/dlq/1-0")).status_code == 404


@pytest.mark.parametrize(
    "spec",
    [{"mode": "down"}, {"mode": "drop", "retryAfter": 5}, {"seconds": 0}, {"minutes": 3}],
)
async def test_invalid_outage_is_400(client: httpx.AsyncClient, spec: dict[str, Any]) -> None:
    """An unknown mode or field, a Retry-After with nothing to carry it, a zero length."""
    response = await client.post("/_emulator/outage", json=spec)
    assert response.status_code == 400
    assert (await client.get("/_emulator/outage")).json()["active"] is False


async def test_outage_mode_may_be_given_as_a_number(client: httpx.AsyncClient) -> None:
    """{"mode": 503} is taken for "503"."""
    assert (await outage(client, mode=503))["mode"] == "503"


async def test_drop_outage_is_a_protocol_error_in_process(client: httpx.AsyncClient) -> None:
    """Through ASGITransport the client sees httpx.RemoteProtocolError."""
    await outage(client, mode="drop")
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/v2/dlq/1-0")


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """What uvicorn logs, which its own logging setup keeps from reaching the root logger."""
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


async def test_drop_outage_closes_a_real_connection_without_an_answer(
    served: httpx.AsyncClient, server_log: pytest.LogCaptureFixture
) -> None:
    """Over a socket: not even a status line (no 500 from uvicorn), journaled as 0."""
    await outage(served, mode="drop")
    for _ in range(2):  # the second on a new connection, as the first was closed
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await served.post(RESUME, content=b"{}")
    assert [(c["status"], c["outage"]) for c in await journal(served)] == [(0, "drop")] * 2
    assert server_log.records == []


async def test_hang_outage_times_out_a_real_client(served: httpx.AsyncClient) -> None:
    """Over a socket the call gets no answer; the client's timeout ends it, and the held
    call is let go and journaled as 0 once the client has gone."""
    await outage(served, mode="hang")
    with pytest.raises(httpx.ReadTimeout):
        await served.get("/v2/dlq/1-0", timeout=0.2)
    await held(served, 0)
    assert [(c["status"], c["outage"]) for c in await journal(served)] == [(0, "hang")]


async def test_hang_outage_drops_its_calls_when_switched_off(client: httpx.AsyncClient) -> None:
    """Held calls are dropped, not served, when the outage ends: the service never acts."""
    await outage(client, mode="hang")
    waiting = asyncio.create_task(client.get("/v2/dlq/1-0"))
    await held(client, 1)
    await client.delete("/_emulator/outage")
    with pytest.raises(httpx.RemoteProtocolError):
        await waiting
    assert [c["status"] for c in await journal(client)] == [0]


async def test_hang_in_process_ends_with_the_callers_cancellation(
    client: httpx.AsyncClient,
) -> None:
    """httpx has no timeout in-process; a caller's asyncio timeout ends the hold."""
    await outage(client, mode="hang")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await client.get("/v2/dlq/1-0")
    assert [(c["status"], c["outage"]) for c in await journal(client)] == [(0, "hang")]
    assert (await client.get("/_emulator/outage")).json()["held"] == 0


@pytest.fixture
async def slept(app: FastAPI) -> AsyncIterator[tuple[httpx.AsyncClient, list[float]]]:
    """A client to an emulator whose sleeps return at once, and the seconds asked of them."""
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)

    emulator: Emulator = app.state.emulator
    fast = create_app(emulator.config, clock=emulator.clock, sleep=sleep)
    transport = httpx.ASGITransport(app=fast)
    async with httpx.AsyncClient(transport=transport, base_url="http://e", headers=BEARER) as c:
        yield c, asked


async def test_hang_outage_holds_through_the_injected_sleep(
    slept: tuple[httpx.AsyncClient, list[float]],
) -> None:
    """A timed hang waits out the outage's remaining seconds with the emulator's sleep."""
    client, asked = slept
    await outage(client, mode="hang", seconds=180)
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/v2/dlq/1-0")
    assert asked == [180]


async def test_hang_without_an_end_is_held_at_most_the_limit(
    slept: tuple[httpx.AsyncClient, list[float]],
) -> None:
    """A hang with no end holds each call for MAX_HOLD_SECONDS at most."""
    client, asked = slept
    await outage(client, mode="hang")
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/v2/dlq/1-0")
    assert asked == [MAX_HOLD_SECONDS]
