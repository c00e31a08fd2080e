"""How the client behaves when the service misbehaves: faults injected into the emulator."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from daemon.upstream import (
    BadRequest,
    BulkFilter,
    CallRecord,
    ConnectionFailed,
    CorruptResponse,
    Credentials,
    CredentialsHolder,
    EndpointRef,
    Fenced,
    InvalidResponse,
    NotFound,
    RateLimited,
    RateLimiter,
    RequestTimeout,
    RetryPolicy,
    ServerError,
    ServiceClient,
    Timeout,
    Unauthorized,
    surely_not_carried_out,
)
from tests.support import FAST_RETRY, TOKEN, USERNAME, Service, eventually, workflows

# Bounds a wait that should take seconds, so a test that goes wrong fails instead of hanging.
GUARD = 10.0


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
    refused = asyncio.Event()
    client = service.client_with(observe=lambda call: call.status == 429 and refused.set())
    await service.fault(kind="rate_limit", retryAfter=0.4, times=1)
    first = asyncio.create_task(client.get_dlq_message("1-0"))
    await refused.wait()  # `first` drew the 429; the limiter is paused for everyone
    started = time.monotonic()
    with pytest.raises(NotFound):
        await client.get_dlq_message("2-0")
    assert time.monotonic() - started >= 0.3
    with pytest.raises(NotFound):
        await first


async def test_a_spent_daily_budget_holds_every_call_until_its_reset(service: Service) -> None:
    """The day's budget spent (a 429 with `RateLimit-Remaining: 0`), the client waits for
    the daily reset (hours away: as long as it may), not for the next second's window."""
    await service.control.post(
        "/_emulator/account", json={"max_requests_per_second": 100, "max_requests_per_day": 1}
    )
    client = service.client_with(
        limiter=RateLimiter(max_pause=1.5), retry=RetryPolicy(max_attempts=2, max_server_wait=1.5)
    )
    with pytest.raises(NotFound):
        await client.get_dlq_message("1-0")
    started = time.monotonic()
    with pytest.raises(RateLimited):
        await client.get_dlq_message("2-0")
    assert time.monotonic() - started >= 1.4  # a burst reset would be under a second
    assert [c["status"] for c in await service.journal()] == [404, 429, 429]


async def test_limit_announced_by_the_service_is_learned(service: Service) -> None:
    """Burst-RateLimit-Limit on an answer sets the limiter's rate, and its pace."""
    await service.control.post("/_emulator/account", json={"max_requests_per_second": 37})
    assert service.client.limiter.pace is None  # not paced before anything is known
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1-0")
    assert service.client.limiter.rate == service.client.limiter.pace == 37


async def test_call_refused_during_a_rotation_waits_for_the_new_token(service: Service) -> None:
    """A call sent with the old token, that outlasts the rotation's wait for calls in
    flight and is refused while the new token is being saved, waits for the swap and
    tries once more, instead of failing."""
    refused = asyncio.Event()
    client = service.client_with(observe=lambda call: call.status == 401 and refused.set())
    # The reset must be carried out while the emulator holds the call, before it checks
    # the call's token: 3 s is ample for it, and short of the client's 5 s timeout.
    await service.fault(kind="latency", seconds=3.0, times=1, paths=["/v2/dlq"])
    pending = asyncio.create_task(client.get_dlq_message("1-0"))
    # The call is out, with the old token, and held.
    await eventually(service.faults_taken, GUARD, "the call to be held")
    async with service.credentials.rotating(drain_seconds=0):
        record = await client.rotate_token()
        try:
            async with asyncio.timeout(GUARD):
                await refused.wait()  # the old token was refused while the new one is not in
        except TimeoutError:
            answered = [(c["path"], c["status"]) for c in await service.journal()]
            pytest.fail(f"the held call was not refused; the service answered {answered}")
        assert record.token is not None
        assert record.password is not None
        service.credentials.replace(
            Credentials(
                record.token.get_secret_value(), USERNAME, record.password.get_secret_value()
            )
        )
    with pytest.raises(NotFound):  # authorised on the second try; the id is just unknown
        await pending
    statuses = [(c["path"], c["status"]) for c in await service.journal()]
    assert statuses == [
        ("/service/user/rotatetoken", 200),
        ("/v2/dlq/1-0", 401),
        ("/v2/dlq/1-0", 404),
    ]


async def test_a_rotation_lets_calls_in_flight_finish_and_holds_new_ones(
    service: Service,
) -> None:
    """The reset waits for the call in flight; a call started during the rotation goes
    out after the swap, with the new token: no call is refused."""
    client = service.client
    await service.fault(kind="latency", seconds=0.3, times=1, paths=["/v2/dlq"])
    in_flight = asyncio.create_task(client.get_dlq_message("in-flight"))
    for _ in range(3):  # let it take the old token and go out
        await asyncio.sleep(0)
    async with service.credentials.rotating(drain_seconds=5):
        assert in_flight.done()  # the rotation waited for it
        held = asyncio.create_task(client.get_dlq_message("held"))
        record = await client.rotate_token()
        assert record.token is not None
        await asyncio.sleep(0.05)
        assert not held.done()  # held back until the swap
        service.credentials.replace(Credentials(record.token.get_secret_value(), USERNAME))
    with pytest.raises(NotFound):
        await held
    statuses = [(c["path"], c["status"]) for c in await service.journal()]
    assert statuses == [
        ("/v2/dlq/in-flight", 404),
        ("/service/user/rotatetoken", 200),
        ("/v2/dlq/held", 404),
    ]


async def test_a_lockout_holds_every_call_until_unlocked(service: Service) -> None:
    """After a lockout no call goes out (each could only be refused) until credentials
    that work are unlocked in; the token check passes the gate."""
    client = service.client
    service.credentials.replace(Credentials("refused-token"))
    assert await client.token_works() is False
    service.credentials.lock_out()
    held = asyncio.create_task(client.get_dlq_message("held"))
    await asyncio.sleep(0.1)
    assert not held.done()
    assert await client.token_works(Credentials(TOKEN)) is True
    service.credentials.unlock(Credentials(TOKEN, USERNAME))
    with pytest.raises(NotFound):
        await held
    statuses = [(c["path"], c["status"]) for c in await service.journal()]
    assert statuses == [
        ("/v2/dlq/recoveryd-token-check", 401),
        ("/v2/dlq/recoveryd-token-check", 404),
        ("/v2/dlq/held", 404),
    ]


async def test_refused_token_without_a_rotation_fails_at_once(service: Service) -> None:
    """A 401 with no rotation under way or done is final: no retry, no wait."""
    service.credentials.replace(Credentials("revoked"))
    with pytest.raises(Unauthorized):
        await service.client.get_dlq_message("1-0")
    assert len(await service.journal()) == 1


async def test_rotation_adopts_the_account_rate_limit(service: Service) -> None:
    """The reset's account record sets the limiter to max_requests_per_second."""
    assert service.client.limiter.rate is None
    record = await service.client.rotate_token()
    assert record.max_requests_per_second is not None
    assert service.client.limiter.rate == record.max_requests_per_second


async def test_bulk_by_filter_is_not_repeated_after_a_server_error(service: Service) -> None:
    """A repeat would act on the next matching runs, so a 503 is raised, not retried."""
    await service.seed(*workflows(3))
    await service.fault(kind="status", status=503, times=1)
    with pytest.raises(ServerError):
        await service.client.bulk("resume", filter=BulkFilter(), count=2)
    assert len(await service.journal()) == 1


async def test_a_bulk_call_by_ids_is_not_sent_again_after_a_server_error(
    service: Service,
) -> None:
    """A 503 may come after the service acted: the call is not repeated blind, the error
    is raised for the caller to check what it did."""
    ids = await service.seed(*workflows(2))
    await service.fault(kind="status", status=503, times=1)
    with pytest.raises(ServerError):
        await service.client.bulk("resume", dlq_ids=ids)
    assert [c["status"] for c in await service.journal()] == [503]


async def test_a_refused_bulk_call_by_ids_is_sent_again(service: Service) -> None:
    """A 429 is answered before the service acts: the same call again, which works."""
    ids = await service.seed(*workflows(2))
    await service.fault(kind="rate_limit", times=2, retryAfter=0.01)
    result = await service.client.bulk("resume", dlq_ids=ids)
    assert len(result.workflow_runs) == 2
    assert [c["status"] for c in await service.journal()] == [429, 429, 200]


async def test_a_fenced_bulk_call_goes_out_no_more(service: Service) -> None:
    """The fence is asked before each attempt: a 429, then the fence says no, and the
    retry is not sent (Fenced, surely not carried out)."""
    ids = await service.seed(*workflows(2))
    await service.fault(kind="rate_limit", times=1, retryAfter=0.01)
    asked: list[bool] = []

    def fence() -> bool:
        asked.append(not asked)  # yes to the first attempt, no to the next
        return asked[-1]

    with pytest.raises(Fenced) as raised:
        await service.client.bulk("resume", dlq_ids=ids, fence=fence)
    assert surely_not_carried_out(raised.value)
    assert asked == [True, False]
    assert [c["status"] for c in await service.journal()] == [429]
    assert len((await service.control.get("/_emulator/dlq")).json()) == 2


async def test_a_call_that_may_have_acted_says_so_though_its_last_try_was_refused(
    service: Service,
) -> None:
    """A 503 to an idempotent call that acts (removing endpoints: the service may have),
    then 429s until the retries run out: the error raised is the 503's, so the caller
    checks before acting again."""
    group = {"name": "orders", "endpoints": [{"name": "a", "url": "https://a.example.com/"}]}
    (await service.control.post("/_emulator/url-groups", json=group)).raise_for_status()
    await service.fault(kind="status", status=503, times=1)
    await service.fault(kind="rate_limit", times=10, retryAfter=0.01)
    with pytest.raises(ServerError):
        await service.client.remove_endpoints("orders", [EndpointRef(name="a")])
    statuses = [c["status"] for c in await service.journal()]
    assert statuses[0] == 503
    assert set(statuses[1:]) == {429}


async def test_a_final_answer_after_an_uncertain_try_is_raised_as_it_is(
    service: Service,
) -> None:
    """A 503, then a 404: the 404 is the service's last word, raised as NotFound."""
    await service.fault(kind="status", status=503, times=1)
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1-0")


async def test_malformed_answer_is_invalid_response(service: Service) -> None:
    """A 200 that is not the spec's JSON raises InvalidResponse, and is not retried."""
    await service.fault(kind="malformed", times=5)
    with pytest.raises(InvalidResponse):
        await service.client.get_dlq_message("1-0")
    assert len(await service.journal()) == 1


async def test_a_408_is_retried(service: Service) -> None:
    """The service gave up waiting for the request: a later try usually works."""
    [dlq_id] = await service.seed({"url": "https://a.example.com"})
    await service.fault(kind="status", status=408, times=1)
    assert (await service.client.get_dlq_message(dlq_id)).dlq_id == dlq_id
    assert [c["status"] for c in await service.journal()] == [408, 200]


async def test_a_408_to_a_bulk_by_filter_is_not_repeated(service: Service) -> None:
    """As after a 5xx, whether the service acted is unknown: a repeat could act twice."""
    await service.seed(*workflows(3))
    await service.fault(kind="status", status=408, times=1)
    with pytest.raises(RequestTimeout):
        await service.client.bulk("resume", filter=BulkFilter(), count=2)
    assert len(await service.journal()) == 1


async def test_an_answer_that_does_not_decode_is_corrupt_response(service: Service) -> None:
    """A body whose gzip does not inflate: CorruptResponse ("decode"), sent, outcome unknown."""
    records: list[CallRecord] = []
    client = service.client_with(observe=records.append, retry=RetryPolicy(max_attempts=1))
    await service.fault(kind="corrupt_gzip", times=1)
    with pytest.raises(CorruptResponse) as raised:
        await client.get_dlq_message("1-0")
    assert raised.value.reason == "decode"
    assert raised.value.request_sent is True
    assert not surely_not_carried_out(raised.value)
    assert [(r.status, r.error) for r in records] == [(None, "decode")]


async def test_a_corrupt_answer_is_retried_by_an_idempotent_call(service: Service) -> None:
    """The read's answer is mangled on the way once; the next try reads it."""
    [dlq_id] = await service.seed({"url": "https://a.example.com"})
    await service.fault(kind="corrupt_gzip", times=1)
    assert (await service.client.get_dlq_message(dlq_id)).dlq_id == dlq_id
    calls = await service.journal()
    assert [(c["status"], c.get("fault"), c.get("carriedOut")) for c in calls] == [
        (200, "corrupt_gzip", True),
        (200, None, None),
    ]


async def test_a_corrupt_answer_to_a_bulk_by_filter_is_not_repeated(service: Service) -> None:
    """The service resumed the run but its answer was lost: a repeat would resume the next
    matching run too, so the call fails with CorruptResponse after one try."""
    await service.seed(*workflows(2))
    await service.fault(kind="corrupt_gzip", times=1)
    with pytest.raises(CorruptResponse):
        await service.client.bulk("resume", filter=BulkFilter(), count=1)
    [call] = await service.journal()
    assert call["carriedOut"] is True
    assert len((await service.control.get("/_emulator/runs")).json()) == 1


async def test_a_corrupt_answer_to_a_bulk_by_ids_is_raised_not_sent_again(
    service: Service,
) -> None:
    """The first try acted (the journal says so) and its runs were in the answer that
    could not be read: the call is not repeated, which would report no run at all (or
    be refused, by a service that refuses dlqIds no longer in its DLQ)."""
    ids = await service.seed(*workflows(2))
    await service.fault(kind="corrupt_gzip", times=1)
    with pytest.raises(CorruptResponse):
        await service.client.bulk("resume", dlq_ids=ids)
    calls = await service.journal()
    assert [(c["status"], c.get("carriedOut")) for c in calls] == [(200, True)]
    assert len((await service.control.get("/_emulator/runs")).json()) == 2


async def test_a_lost_answer_to_a_bulk_by_ids_is_raised_not_sent_again(
    service: Service,
) -> None:
    """A 504 after the service acted, and a reset after it acted: each raised as an
    outcome that may have acted, with one call made."""
    ids = await service.seed(*workflows(2))
    await service.fault(kind="lost_answer", status=504, times=1)
    await service.fault(kind="lost_answer", reset=True, times=1)
    with pytest.raises(ServerError) as first:
        await service.client.bulk("resume", dlq_ids=ids[:1])
    with pytest.raises(ConnectionFailed) as second:
        await service.client.bulk("resume", dlq_ids=ids[1:])
    assert not surely_not_carried_out(first.value)
    assert not surely_not_carried_out(second.value)
    assert [c["status"] for c in await service.journal()] == [504, 0]
    assert len((await service.control.get("/_emulator/runs")).json()) == 2


@pytest.mark.parametrize("name", ["", ".", "..", "a\nb"])
async def test_path_walking_names_are_refused_before_any_call(service: Service, name: str) -> None:
    """An id or group name that would change the URL's path is refused up front."""
    with pytest.raises(ValueError, match="not a usable id or name"):
        await service.client.get_dlq_message(name)
    with pytest.raises(ValueError, match="not a usable id or name"):
        await service.client.remove_endpoints(name, [EndpointRef(name="a")])
    assert await service.journal() == []


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
async def test_a_call_counts_from_when_its_headers_go_out(service: Service) -> None:
    """At 2/s over one connection, the first answer takes 0.9 s, so the second call, let
    go at once, only goes out then. Counted from its send (httpx's trace), it keeps the
    fourth call back until 1.05 s after it: the service never sees 3 calls within a
    second, and refuses none."""
    await service.control.post("/_emulator/account", json={"max_requests_per_second": 2})
    await service.fault(kind="latency", seconds=0.9, times=1)
    async with service.http(limits=httpx.Limits(max_connections=1), timeout=5.0) as http:
        client = service.client_with(
            http=http, limiter=RateLimiter(2), retry=RetryPolicy(max_attempts=1)
        )

        async def one(i: int) -> None:
            with pytest.raises(NotFound):
                await client.get_dlq_message(f"{i}-0")

        async with asyncio.timeout(10):
            await asyncio.gather(*(one(i) for i in range(4)))
    arrivals = sorted(c["at"] for c in await service.journal())
    assert len(arrivals) == 4
    assert arrivals[1] - arrivals[0] >= 0.85  # the second call did wait for the connection
    assert max(sum(1 for t in arrivals if s <= t < s + 1.0) for s in arrivals) == 2
    stats = (await service.control.get("/_emulator/stats")).json()
    assert stats["rate_limited"] == 0
    assert stats["max_requests_in_window"] <= 2


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
