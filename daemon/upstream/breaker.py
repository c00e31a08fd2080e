"""Circuit breakers, one per operation: stop calling a service that keeps failing, and probe it.

Pure state over an injected clock and random source; the client asks a breaker before
each attempt and reports the attempt's outcome to it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from daemon.upstream.errors import CircuitOpen, RateLimited, ServiceError, is_transient

State = Literal["closed", "open", "half_open"]
OnChange = Callable[[str, State], None]


@dataclass(frozen=True)
class BreakerPolicy:
    """When a breaker opens and how long it stays open."""

    threshold: int = 5  # transient failures in a row that open it
    first_open: float = 1.0  # seconds open after the first opening
    # The open interval doubles per failed probe, up to this. Short: it is how long work
    # may wait after the service is back, and one probe call every few seconds costs
    # nothing (under 1% of a limit of 100 calls/s, and none while no work waits).
    max_open: float = 5.0
    jitter: float = 0.2  # each interval is shortened by up to this fraction, at random
    probe_poll: float = 0.5  # while a probe is out, how soon a caller should look again

    def __post_init__(self) -> None:
        if self.threshold < 1:
            raise ValueError(f"threshold must be at least 1, got {self.threshold}")
        if not 0 < self.first_open <= self.max_open:
            raise ValueError("need 0 < first_open <= max_open")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")


@dataclass(frozen=True)
class Ticket:
    """Leave to make one attempt; hand it back with the attempt's outcome."""

    generation: int  # the breaker's state change it was issued after
    probe: bool


def means_down(error: ServiceError | None) -> bool:
    """Whether an attempt's outcome counts against the service's health. Any answer but
    a 5xx or 408 shows it is up: a 404 or a 400 is about the request, and a 429 is the
    rate limiter's business (it pauses every caller), not a sign of an outage."""
    return error is not None and is_transient(error) and not isinstance(error, RateLimited)


class Breaker:
    """One operation's circuit breaker.

    Closed: every call goes. `threshold` transient failures in a row (a success or any
    non-transient answer resets the count) open it. Open: calls are refused at once
    with CircuitOpen, for an interval that starts at `first_open` and doubles after
    each failed probe up to `max_open`, jittered so that breakers opened together do
    not probe together. When the interval is over, the next call is the probe
    (half-open): it alone goes, everyone else is still refused until it returns. Its
    success closes the breaker; its transient failure opens it again, for longer.

    Outcomes of calls let through before the last change of state are ignored: they
    say nothing about the service since then.

    `probe_now` ends the open interval early: another operation's breaker found the
    service back (Breakers), so the next call is the probe.
    """

    def __init__(
        self,
        operation: str,
        policy: BreakerPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        on_change: OnChange | None = None,
    ) -> None:
        self.operation = operation
        self._policy = policy or BreakerPolicy()
        self._clock = clock
        self._rand = rand
        self._on_change = on_change
        self._state: State = "closed"
        self._generation = 0
        self._failures = 0  # transient failures in a row, while closed
        self._openings = 0  # openings since it was last closed: the interval's exponent
        self._open_until = 0.0

    @property
    def state(self) -> State:
        return self._state

    def retry_at(self) -> float | None:
        """None when a call would go now (closed, or open with its interval over: the
        call would be the probe). Otherwise when to look again, on the clock: the end
        of the open interval, or, while a probe is out, a short poll from now."""
        now = self._clock()
        if self._state == "closed" or (self._state == "open" and now >= self._open_until):
            return None
        if self._state == "open":
            return self._open_until
        return now + self._policy.probe_poll

    def admit(self) -> Ticket | None:
        """Leave for one attempt, or None when calls are held back. Taking the leave
        when the open interval is over makes the attempt the probe."""
        if self._state == "closed":
            return Ticket(self._generation, probe=False)
        if self._state == "open" and self._clock() >= self._open_until:
            self._change("half_open")
            return Ticket(self._generation, probe=True)
        return None

    def refusal(self) -> CircuitOpen:
        """The error for a call held back now."""
        now = self._clock()
        retry_at = self.retry_at() or now
        if self._state == "half_open":
            why = "a probe call is out to see whether the service is back"
        else:
            why = f"the service failed it repeatedly; next try in {retry_at - now:.1f} s"
        return CircuitOpen(f"circuit open: {why}", operation=self.operation, retry_at=retry_at)

    def record(self, ticket: Ticket, error: ServiceError | None) -> None:
        """The outcome of an admitted attempt: None for a success, else its error."""
        if ticket.generation != self._generation:
            return
        down = means_down(error)
        if self._state == "closed":
            self._failures = self._failures + 1 if down else 0
            if self._failures >= self._policy.threshold:
                self._open(self._clock())
        elif ticket.probe:
            if down:
                self._open(self._clock())
            else:
                self._failures = self._openings = 0
                self._change("closed")

    def probe_now(self) -> None:
        """When open, let the next call be the probe without waiting out the interval."""
        if self._state == "open":
            self._open_until = min(self._open_until, self._clock())

    def abandon(self, ticket: Ticket) -> None:
        """An admitted attempt ended with no outcome (cancelled). A probe's place goes to
        the next caller at once; the interval does not grow."""
        if ticket.probe and ticket.generation == self._generation:
            self._open_until = self._clock()
            self._change("open")

    def _open(self, now: float) -> None:
        policy = self._policy
        nominal = min(policy.max_open, policy.first_open * 2.0**self._openings)
        self._openings += 1
        self._open_until = now + nominal * (1 - policy.jitter * self._rand())
        self._failures = 0
        self._change("open")

    def _change(self, state: State) -> None:
        self._generation += 1
        self._state = state
        if self._on_change is not None:
            self._on_change(self.operation, state)


class Breakers:
    """The breakers of every operation; one for an operation not listed is made on first use.

    The operations are one service's: when a probe finds it back for one, the others
    still open probe at their next call rather than at the end of their interval.
    """

    def __init__(
        self,
        operations: Iterable[str] = (),
        policy: BreakerPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        on_change: OnChange | None = None,
    ) -> None:
        self._policy = policy or BreakerPolicy()
        self._clock = clock
        self._rand = rand
        self._on_change = on_change
        self._breakers: dict[str, Breaker] = {}
        for operation in operations:
            self[operation]

    @property
    def probe_interval(self) -> float:
        """The longest an open circuit waits between probes: how soon a service that came
        back is found so."""
        return self._policy.max_open

    def __getitem__(self, operation: str) -> Breaker:
        breaker = self._breakers.get(operation)
        if breaker is None:
            breaker = Breaker(
                operation,
                self._policy,
                clock=self._clock,
                rand=self._rand,
                on_change=self._changed,
            )
            self._breakers[operation] = breaker
        return breaker

    def _changed(self, operation: str, state: State) -> None:
        if state == "closed":
            for other in self._breakers.values():
                other.probe_now()
        if self._on_change is not None:
            self._on_change(operation, state)

    def states(self) -> dict[str, State]:
        """Each operation's state, for metrics and the status page."""
        return {operation: breaker.state for operation, breaker in self._breakers.items()}
