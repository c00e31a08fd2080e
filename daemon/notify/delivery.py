"""What an attempt's answer means, and when to try again: pure, so a table test covers it.

A 2xx is delivered. A receiver that is down, slow, overloaded or failing (no answer,
408, 425, 429, 5xx) is tried again after a backoff that doubles up to a cap, jittered,
honouring its Retry-After; after `max_attempts` attempts or `max_age` seconds the
notification ends `failed` with the last reason. Any other answer is final at once: a
3xx (a POST is not followed to another URL: put the final URL in the rule), a 4xx (the
receiver refuses this request, and would refuse it again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx

from daemon.pipeline.failures import backoff
from daemon.store.records import NotificationResult

_RETRIED = frozenset({408, 425, 429})


@dataclass(frozen=True)
class NotifyTiming:
    """How notifications are sent; the defaults suit production, tests make them short.
    With these a receiver that stays down is tried about 20 times over one to two hours."""

    timeout: float = 10.0  # one attempt, from connecting to the answer's status line
    base: float = 1.0  # the first retry's delay; it doubles each attempt
    cap: float = 600.0  # the longest delay between two attempts
    max_attempts: int = 20
    max_age: float = 86_400.0  # from queued to `failed`, however few the attempts
    per_receiver: int = 2  # attempts under way to one receiver (scheme, host and port)
    concurrency: int = 16  # attempts under way in all
    poll: float = 1.0  # how often the store is asked for due notifications
    drain: float = 5.0  # at shutdown, for attempts under way (an attempt cut short is made again)


@dataclass(frozen=True)
class Verdict:
    """What one attempt came to. `reason` is short and holds no part of the URL."""

    result: NotificationResult
    status: int | None
    reason: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Next:
    """What the store records after an attempt: `next_at` for a retry."""

    result: NotificationResult
    reason: str
    next_at: float | None = None


def judge_answer(status: int, retry_after: str | None = None, now: float = 0.0) -> Verdict:
    """The verdict on an answer with `status` (and its Retry-After header, if any)."""
    if 200 <= status < 300:
        return Verdict("sent", status, f"answered {status}")
    if status in _RETRIED or status >= 500:
        return Verdict("retry", status, f"answered {status}", _seconds(retry_after, now))
    if 300 <= status < 400:
        reason = f"answered {status}: a redirect is not followed; put the final URL in the rule"
        return Verdict("failed", status, reason)
    return Verdict("failed", status, f"refused: answered {status}")


def judge_error(error: Exception) -> Verdict:
    """The verdict on an attempt that got no answer. The message is ours, never the
    library's: some name the URL."""
    if isinstance(error, TimeoutError | httpx.TimeoutException):
        reason = "no answer in time"
    elif isinstance(error, httpx.ConnectError):
        reason = "could not connect"
    elif isinstance(error, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        reason = "the connection broke"
    else:
        reason = f"no answer: {type(error).__name__}"
    return Verdict("retry", None, reason)


def next_step(
    verdict: Verdict,
    attempts: int,
    queued_at: float,
    now: float,
    timing: NotifyTiming,
    rand: Callable[[], float],
) -> Next:
    """After attempt number `attempts` of a notification queued at `queued_at`: sent,
    failed, or tried again at `next_at` unless that passes a limit."""
    if verdict.result != "retry":
        return Next(verdict.result, verdict.reason)
    delay = retry_delay(attempts, timing, rand, verdict.retry_after)
    if attempts >= timing.max_attempts or now + delay > queued_at + timing.max_age:
        reason = (
            f"gave up after {attempts} attempt{'s' if attempts != 1 else ''} over "
            f"{now - queued_at:.0f}s; the last {verdict.reason}"
        )
        return Next("failed", reason)
    return Next("retry", verdict.reason, now + delay)


def retry_delay(
    attempts: int, timing: NotifyTiming, rand: Callable[[], float], retry_after: float | None = None
) -> float:
    """The wait after attempt number `attempts`: doubling from `base`, at most `cap`,
    jittered, and never shorter than the receiver asked (up to `cap`)."""
    delay = backoff(attempts, timing.base, timing.cap, rand)
    if retry_after is not None:
        delay = max(delay, min(retry_after, timing.cap))
    return delay


def _seconds(retry_after: str | None, now: float) -> float | None:
    """Retry-After as seconds from now: a number of seconds or an HTTP date."""
    if not retry_after:
        return None
    text = retry_after.strip()
    if text.isdigit():
        return float(text)
    try:
        return max(0.0, parsedate_to_datetime(text).timestamp() - now)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
