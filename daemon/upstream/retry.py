"""When to retry a failed service call and how long to wait: pure functions, no I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from daemon.upstream.errors import (
    CircuitOpen,
    Fenced,
    RateLimited,
    RequestTimeout,
    ResponseError,
    ServerError,
    ServiceError,
    TransportError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts and in total time.

    Retried: 429 (always: the service refused before doing anything), 5xx, 408 and
    transport failures, undecodable answers included. A call that is not idempotent
    (the token reset, a bulk call by filter) is repeated only when it certainly never
    reached the service, because repeating it could act twice. Everything else (400,
    401, 404, ...) is final: the same request would fail the same way. An open circuit
    is not retried here either: the caller reschedules the work for when it closes; nor
    is a call its caller's fence stopped.

    A 429 waits exactly as long as the service said (Retry-After, else the rate-limit
    reset), capped at `max_server_wait`; when it said nothing usable (no header, or a
    wait of zero, which clocks that disagree can produce) it waits `base_delay` plus
    the jittered backoff, so a refusal never turns into a hot loop. A 5xx or 408 with
    Retry-After waits at least that long.
    """

    max_attempts: int = 6
    max_elapsed: float = 120.0  # seconds, from the first attempt
    base_delay: float = 0.5
    max_delay: float = 30.0
    max_server_wait: float = 60.0  # ceiling on a wait the service asks for

    def is_retryable(self, error: ServiceError, *, idempotent: bool = True) -> bool:
        if isinstance(error, RateLimited):
            return True
        if isinstance(error, CircuitOpen | Fenced):
            return False
        if isinstance(error, TransportError):
            return idempotent or not error.request_sent
        if isinstance(error, ServerError | RequestTimeout):
            return idempotent
        return False

    def backoff(self, attempt: int, rand: Callable[[], float]) -> float:
        """Full jitter: uniform in [0, min(max_delay, base * 2**(attempt-1)))."""
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** (attempt - 1))
        return rand() * ceiling

    def next_delay(
        self,
        error: ServiceError,
        *,
        attempt: int,
        elapsed: float,
        rand: Callable[[], float],
        idempotent: bool = True,
    ) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None to give up.

        `attempt` counts the attempts made so far (1 after the first failure).
        """
        if attempt >= self.max_attempts or not self.is_retryable(error, idempotent=idempotent):
            return None
        delay = self.backoff(attempt, rand)
        told = self._told(error)
        if isinstance(error, RateLimited):
            delay = told if told is not None else self.base_delay + delay
        elif told is not None:
            delay = max(delay, told)
        if elapsed + delay > self.max_elapsed:
            return None
        return delay

    def _told(self, error: ServiceError) -> float | None:
        """The wait the service asked for, capped; None when it asked for none."""
        if not isinstance(error, ResponseError) or not error.retry_after:
            return None
        return min(error.retry_after, self.max_server_wait)
