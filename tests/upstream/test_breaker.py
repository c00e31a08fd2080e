"""Circuit breakers: the state machine on an injected clock, then the client's breakers
against the emulator switched into an outage."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from daemon.upstream import (
    OPERATIONS,
    BadRequest,
    BreakerPolicy,
    CircuitOpen,
    ConnectionFailed,
    CorruptResponse,
    InvalidResponse,
    NotFound,
    RateLimited,
    RequestTimeout,
    ServerError,
    ServiceClient,
    ServiceError,
    Timeout,
    Unauthorized,
    is_transient,
    surely_not_carried_out,
)
from daemon.upstream.breaker import Breaker, Breakers, State, Ticket, means_down
from tests.support import Service

POLICY = BreakerPolicy(threshold=3, first_open=1.0, max_open=4.0, jitter=0.0, probe_poll=0.5)
DOWN = ServerError("unavailable", status=503)
START = 100.0


class Clock:
    """Monotonic seconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Watched:
    """A breaker on a clock of the test's, with every change of state it announced."""

    def __init__(self, policy: BreakerPolicy = POLICY, rand: float = 0.0) -> None:
        self.clock = Clock()
        self.changes: list[tuple[str, State]] = []
        self.breaker = Breaker(
            "resume",
            policy,
            clock=self.clock,
            rand=lambda: rand,
            on_change=lambda operation, state: self.changes.append((operation, state)),
        )

    def attempt(self, error: ServiceError | None) -> None:
        """One admitted attempt with `error` as its outcome (None: success)."""
        ticket = self.breaker.admit()
        assert ticket is not None, "the attempt was held back"
        self.breaker.record(ticket, error)

    def fail(self, times: int) -> None:
        for _ in range(times):
            self.attempt(DOWN)

    def open_for(self) -> float:
        """Seconds the open breaker holds calls back from now."""
        retry_at = self.breaker.retry_at()
        assert self.breaker.state == "open"
        assert retry_at is not None
        return retry_at - self.clock.now

    def probe(self) -> Ticket:
        """Wait out the open interval and take the probe's ticket."""
        self.clock.now += self.open_for()
        ticket = self.breaker.admit()
        assert ticket is not None
        assert ticket.probe
        return ticket


# -- the state machine ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "down"),
    [
        (ServerError("x", status=500), True),
        (RequestTimeout("x", status=408), True),
        (Timeout("x"), True),
        (ConnectionFailed("x"), True),
        (CorruptResponse("x"), True),
        (None, False),
        (BadRequest("x", status=400), False),
        (Unauthorized("x", status=401), False),
        (NotFound("x", status=404), False),
        (RateLimited("x"), False),
        (InvalidResponse("x"), False),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, bool) else str(value),
)
def test_only_signs_of_an_outage_count_against_the_service(
    error: ServiceError | None, down: bool
) -> None:
    """5xx, 408 and transport failures count; any other answer shows the service is up,
    and a 429 is the rate limiter's business."""
    assert means_down(error) is down


def test_opens_after_the_threshold_of_transient_failures_in_a_row() -> None:
    """One failure short of the threshold it still lets calls go; the next opens it."""
    watched = Watched()
    watched.fail(POLICY.threshold - 1)
    assert watched.breaker.state == "closed"
    assert watched.breaker.retry_at() is None
    watched.fail(1)
    assert watched.breaker.state == "open"
    assert watched.changes == [("resume", "open")]


@pytest.mark.parametrize(
    "outcome",
    [None, NotFound("x", status=404), BadRequest("x", status=400), RateLimited("x")],
    ids=["success", "404", "400", "429"],
)
def test_a_success_or_an_answer_that_is_no_outage_starts_the_count_over(
    outcome: ServiceError | None,
) -> None:
    """Only failures in a row open the breaker: anything that shows the service up breaks
    the row."""
    watched = Watched()
    watched.fail(POLICY.threshold - 1)
    watched.attempt(outcome)
    watched.fail(POLICY.threshold - 1)
    assert watched.breaker.state == "closed"
    watched.fail(1)
    assert watched.breaker.state == "open"


def test_an_open_breaker_refuses_calls_until_its_interval_is_over() -> None:
    """Open: retry_at is in the future, no call is admitted, and the refusal is a
    CircuitOpen that was never sent."""
    watched = Watched()
    watched.fail(POLICY.threshold)
    assert watched.breaker.retry_at() == START + POLICY.first_open
    watched.clock.now += POLICY.first_open - 0.01
    assert watched.breaker.admit() is None
    refusal = watched.breaker.refusal()
    assert isinstance(refusal, CircuitOpen)
    assert (refusal.operation, refusal.retry_at) == ("resume", START + POLICY.first_open)
    assert refusal.request_sent is False
    assert is_transient(refusal)
    assert surely_not_carried_out(refusal)


def test_after_the_interval_exactly_one_probe_goes() -> None:
    """Once the interval is over the next call is the probe (half-open); everyone else is
    refused, told to look again after a short poll, until it returns."""
    watched = Watched()
    watched.fail(POLICY.threshold)
    watched.clock.now += POLICY.first_open
    assert watched.breaker.retry_at() is None
    probe = watched.breaker.admit()
    assert probe is not None
    assert probe.probe
    assert watched.breaker.state == "half_open"
    assert watched.breaker.admit() is None
    assert watched.breaker.admit() is None
    assert watched.breaker.retry_at() == watched.clock.now + POLICY.probe_poll
    assert "probe" in watched.breaker.refusal().message


@pytest.mark.parametrize(
    "outcome", [None, NotFound("x", status=404)], ids=["success", "404: the service is up"]
)
def test_a_probe_that_finds_the_service_up_closes_the_breaker(
    outcome: ServiceError | None,
) -> None:
    """The probe's success closes the breaker, and it starts over: a full threshold of
    failures to open it again, for the first interval again."""
    watched = Watched()
    watched.fail(POLICY.threshold)
    watched.breaker.record(watched.probe(), outcome)
    assert watched.breaker.state == "closed"
    assert watched.breaker.retry_at() is None
    watched.fail(POLICY.threshold - 1)
    assert watched.breaker.state == "closed"
    watched.fail(1)
    assert watched.open_for() == POLICY.first_open


def test_a_failed_probe_reopens_for_twice_as_long_up_to_the_cap() -> None:
    """Open intervals of 1, 2, 4 s, then max_open (4 s) however often the probe fails."""
    watched = Watched()
    watched.fail(POLICY.threshold)
    intervals = [watched.open_for()]
    for _ in range(3):
        watched.breaker.record(watched.probe(), DOWN)
        intervals.append(watched.open_for())
    assert intervals == [1.0, 2.0, 4.0, 4.0]


def test_jitter_shortens_each_interval_by_up_to_its_fraction() -> None:
    """So that breakers opened together do not all probe together."""
    policy = BreakerPolicy(threshold=1, first_open=10.0, max_open=10.0, jitter=0.2)
    watched = Watched(policy, rand=1.0)
    watched.fail(1)
    assert watched.open_for() == pytest.approx(8.0)


def test_an_abandoned_probe_lets_the_next_caller_probe_at_once() -> None:
    """A probe cancelled with no outcome frees its place without growing the interval."""
    watched = Watched()
    watched.fail(POLICY.threshold)
    watched.breaker.abandon(watched.probe())
    assert watched.breaker.state == "open"
    assert watched.breaker.retry_at() is None
    again = watched.breaker.admit()
    assert again is not None
    assert again.probe
    watched.breaker.record(again, DOWN)
    assert watched.open_for() == 2 * POLICY.first_open


def test_abandoning_an_ordinary_call_changes_nothing() -> None:
    """A cancelled call that was not the probe neither counts nor changes the state."""
    watched = Watched()
    ticket = watched.breaker.admit()
    assert ticket is not None
    watched.breaker.abandon(ticket)
    assert watched.breaker.state == "closed"
    assert watched.changes == []


def test_outcomes_of_calls_let_through_before_a_change_are_ignored() -> None:
    """A call admitted before the breaker opened, that fails after it closed again, says
    nothing about the service since: its failure does not count toward the next opening."""
    watched = Watched()
    slow = watched.breaker.admit()
    assert slow is not None
    watched.fail(POLICY.threshold)
    watched.breaker.record(watched.probe(), None)
    watched.fail(POLICY.threshold - 1)
    watched.breaker.record(slow, DOWN)
    assert watched.breaker.state == "closed"


def test_on_change_is_told_of_changes_of_state_only() -> None:
    """Successes, failures under the threshold and refusals are not reported; each
    change of state is, once."""
    watched = Watched()
    watched.attempt(None)
    watched.fail(POLICY.threshold)
    assert watched.breaker.admit() is None  # refused: no change
    watched.breaker.record(watched.probe(), DOWN)
    watched.breaker.record(watched.probe(), None)
    watched.attempt(None)
    watched.fail(1)
    assert [state for _, state in watched.changes] == [
        "open",
        "half_open",
        "open",
        "half_open",
        "closed",
    ]


def test_each_operation_has_its_own_breaker() -> None:
    """Breakers are made for the operations listed, and on first use for others; one
    opening leaves the others closed."""
    breakers = Breakers(["resume", "restart"], BreakerPolicy(threshold=1))
    assert breakers.states() == {"resume": "closed", "restart": "closed"}
    ticket = breakers["resume"].admit()
    assert ticket is not None
    breakers["resume"].record(ticket, DOWN)
    assert breakers["other"] is breakers["other"]
    assert breakers.states() == {"resume": "open", "restart": "closed", "other": "closed"}


def test_a_probe_that_finds_the_service_back_makes_the_other_open_breakers_probe_now() -> None:
    """The operations are one service's: once one's probe finds it back, another still
    open probes at its next call, not at the end of its interval (whose growth stands
    if that probe fails); a closed one is left as it is."""
    clock = Clock()
    breakers = Breakers(["get_dlq_message", "restart", "resume"], POLICY, clock=clock,
                        rand=lambda: 0.0)  # fmt: skip

    def attempt(operation: str, error: ServiceError | None) -> None:
        ticket = breakers[operation].admit()
        assert ticket is not None, f"{operation} held back"
        breakers[operation].record(ticket, error)

    for _ in range(POLICY.threshold):
        attempt("get_dlq_message", DOWN)
        attempt("restart", DOWN)
    clock.now += POLICY.first_open
    attempt("get_dlq_message", DOWN)  # its probe fails: open 2 s more
    assert breakers["get_dlq_message"].retry_at() == clock.now + 2 * POLICY.first_open
    attempt("restart", None)  # restart's probe finds the service back
    assert breakers.states() == {"get_dlq_message": "open", "restart": "closed",
                                 "resume": "closed"}  # fmt: skip
    assert breakers["get_dlq_message"].retry_at() is None
    attempt("get_dlq_message", DOWN)  # the probe, at once; it fails: open for 4 s
    assert breakers["get_dlq_message"].retry_at() == clock.now + 4 * POLICY.first_open


def test_the_default_probe_interval_stays_short_in_a_long_outage() -> None:
    """1, 2, 4 s, then 5 s however long the outage: work waits at most that long for
    the service once it is back, for one call every few seconds meanwhile."""
    watched = Watched(BreakerPolicy(jitter=0.0))
    watched.fail(BreakerPolicy().threshold)
    intervals = [watched.open_for()]
    for _ in range(5):
        watched.breaker.record(watched.probe(), DOWN)
        intervals.append(watched.open_for())
    assert intervals == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"threshold": 0}, "threshold"),
        ({"first_open": 0}, "first_open"),
        ({"first_open": 5, "max_open": 1}, "first_open <= max_open"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(settings: dict[str, Any], complaint: str) -> None:
    """A threshold under 1, an empty or inverted interval, or jitter outside [0, 1)."""
    with pytest.raises(ValueError, match=complaint):
        BreakerPolicy(**settings)


# -- the client's breakers, against the emulator ---------------------------------------

OPERATION = "get_dlq_message"
# Real seconds a test may take before it counts as hung.
GUARD = 10.0


class Recorded:
    """A client with `policy` for its breakers, and each change they announced."""

    def __init__(self, service: Service, policy: BreakerPolicy) -> None:
        self.changes: list[tuple[str, str]] = []
        self.client: ServiceClient = service.client_with(
            breaker=policy,
            on_breaker_change=lambda operation, state: self.changes.append((operation, state)),
        )


async def outage(service: Service, **spec: Any) -> None:
    (await service.control.post("/_emulator/outage", json=spec)).raise_for_status()


async def outage_calls(service: Service) -> int:
    """Calls the outage switched on last has met."""
    calls: int = (await service.control.get("/_emulator/outage")).json()["calls"]
    return calls


def retry_at(client: ServiceClient) -> float:
    """When the open circuit of OPERATION lets a probe through."""
    moment = client.retry_at(OPERATION)
    assert moment is not None, "the circuit is not holding calls back"
    return moment


async def wait_until(moment: float) -> None:
    """Sleep until `moment` of the monotonic clock, and a little more."""
    await asyncio.sleep(max(0.0, moment - time.monotonic()) + 0.01)


@pytest.mark.parametrize("mode", ["503", "drop"])
async def test_an_outage_opens_the_circuit_and_calls_stop_reaching_the_service(
    service: Service, mode: str
) -> None:
    """The service down: after the threshold of failed attempts the operation's calls
    fail at once with CircuitOpen and nothing more reaches the service; the other
    operations' breakers stay closed."""
    policy = BreakerPolicy(threshold=3, first_open=30.0, max_open=30.0, jitter=0.0)
    recorded = Recorded(service, policy)
    client = recorded.client
    await outage(service, mode=mode)
    async with asyncio.timeout(GUARD):
        # The 4th attempt is held back; the call raises what its attempts that reached
        # the service got, since those may have been carried out.
        with pytest.raises(ServiceError) as first:
            await client.get_dlq_message("1-0")
        assert not isinstance(first.value, CircuitOpen)
        with pytest.raises(CircuitOpen) as held:
            await client.get_dlq_message("1-0")
        for _ in range(4):
            with pytest.raises(CircuitOpen):
                await client.get_dlq_message("1-0")
    assert await outage_calls(service) == policy.threshold
    assert held.value.request_sent is False
    assert held.value.retry_at == client.retry_at(OPERATION)
    assert held.value.retry_at > time.monotonic() + 20
    states = client.breaker_states()
    assert states[OPERATION] == "open"
    assert {states[op] for op in OPERATIONS if op != OPERATION} == {"closed"}
    assert recorded.changes == [(OPERATION, "open")]


async def test_one_operations_open_circuit_does_not_hold_back_the_others(
    service: Service,
) -> None:
    """Reads of DLQ messages keep failing and their circuit opens; the URL Group read
    still goes to the service and succeeds."""
    recorded = Recorded(service, BreakerPolicy(threshold=2, first_open=30.0, max_open=30.0))
    client = recorded.client
    await service.fault(kind="status", status=503, times=100, paths=["/v2/dlq"])
    await service.control.post(
        "/_emulator/url-groups", json={"name": "g", "endpoints": [{"url": "https://a.test"}]}
    )
    async with asyncio.timeout(GUARD):
        with pytest.raises(ServerError):  # what the attempts that reached the service got
            await client.get_dlq_message("1-0")
        with pytest.raises(CircuitOpen):
            await client.get_dlq_message("1-0")
        group = await client.get_url_group("g")
    assert [e.url for e in group.endpoints] == ["https://a.test"]
    assert [c["status"] for c in await service.journal()] == [503, 503, 200]
    assert client.retry_at("get_url_group") is None
    assert recorded.changes == [(OPERATION, "open")]


async def test_after_the_outage_one_probe_closes_the_circuit(service: Service) -> None:
    """A probe during the outage fails and reopens the circuit for twice as long; the
    first probe after the outage succeeds and closes it."""
    # Reopened for 2 s: the control calls below and the call that must find the circuit
    # still open have ample time, even on a loaded machine.
    policy = BreakerPolicy(threshold=3, first_open=1.0, max_open=5.0, jitter=0.0)
    recorded = Recorded(service, policy)
    client = recorded.client
    [dlq_id] = await service.seed({"url": "https://a.example.com"})
    await outage(service, mode="503")
    async with asyncio.timeout(GUARD):
        with pytest.raises(ServerError):  # then held back: the circuit opened
            await client.get_dlq_message(dlq_id)
        await wait_until(retry_at(client))
        before = time.monotonic()
        with pytest.raises(ServerError):  # the probe met the outage
            await client.get_dlq_message(dlq_id)
        after = time.monotonic()
        # Reopened for twice as long, from some moment during the probe: bounded by the
        # clock on either side of it, however long the probe or what follows took.
        reopen = 2 * policy.first_open
        assert before + reopen <= retry_at(client) <= after + reopen
        assert await outage_calls(service) == policy.threshold + 1
        (await service.control.delete("/_emulator/outage")).raise_for_status()
        with pytest.raises(CircuitOpen):  # still open, though the service is back
            await client.get_dlq_message(dlq_id)
        await wait_until(retry_at(client))
        message = await client.get_dlq_message(dlq_id)
    assert message.dlq_id == dlq_id
    assert client.breaker_states()[OPERATION] == "closed"
    assert client.retry_at(OPERATION) is None
    assert [state for _, state in recorded.changes] == [
        "open",
        "half_open",
        "open",
        "half_open",
        "closed",
    ]
    met = [(c["status"], c.get("outage")) for c in await service.journal()]
    assert met == [(503, "503")] * (policy.threshold + 1) + [(200, None)]
