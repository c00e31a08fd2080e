"""What an answer's headers say about waiting: `Retry-After`, `Burst-RateLimit-*` (the
per-second limit) and `RateLimit-*` (the daily one), parsed.

Pure functions over a case-insensitive header mapping (httpx.Headers) and the Unix time;
what to do with the values is the retry policy's and the rate limiter's business.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from dataclasses import dataclass

# A reset header above this is a Unix time in milliseconds, between it and
# _SECONDS_EPOCH a Unix time in seconds, below it a number of seconds to wait.
_MILLIS_EPOCH = 1e11
_SECONDS_EPOCH = 1e8


@dataclass(frozen=True)
class RateHint:
    """The rate-limit headers of one answer; None where a header is absent or unreadable."""

    limit: int | None = None  # Burst-RateLimit-Limit: requests per second
    remaining: int | None = None  # Burst-RateLimit-Remaining: left in the current window
    reset_in: float | None = None  # seconds until Burst-RateLimit-Reset (0 when past)
    retry_after: float | None = None  # Retry-After, in seconds from now (0 when past)
    daily_reset_in: float | None = None  # seconds until RateLimit-Reset, once the day is spent


def rate_hint(headers: Mapping[str, str], now: float) -> RateHint:
    """Every rate-limit header of an answer; `now` is the Unix time in seconds."""
    remaining = _parse_number(headers.get("burst-ratelimit-remaining"))
    return RateHint(
        limit=server_limit(headers),
        remaining=int(remaining) if remaining is not None and remaining >= 0 else None,
        reset_in=reset_wait(headers, now),
        retry_after=retry_after(headers, now),
        daily_reset_in=daily_wait(headers, now),
    )


def server_wait(headers: Mapping[str, str], now: float) -> float | None:
    """The wait a 429 asks for: `Retry-After` when present, else the daily limit's reset
    when the day's budget is spent (a call before it is refused whatever the second),
    else `Burst-RateLimit-Reset`."""
    for told in (retry_after(headers, now), daily_wait(headers, now)):
        if told is not None:
            return told
    return reset_wait(headers, now)


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """`Retry-After` in seconds from now: seconds or an HTTP date (RFC 9110)."""
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _parse_number(value.strip())
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now, 0.0)


def reset_wait(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds until `Burst-RateLimit-Reset`."""
    return _wait_until(_parse_number(headers.get("burst-ratelimit-reset")), now)


def daily_wait(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds until `RateLimit-Reset` when `RateLimit-Remaining` is 0: the account's
    daily budget is spent (the SDKs tell its 429 from a burst one by `RateLimit-Limit`)."""
    if _parse_number(headers.get("ratelimit-remaining")) != 0:
        return None
    return _wait_until(_parse_number(headers.get("ratelimit-reset")), now)


def _wait_until(reset: float | None, now: float) -> float | None:
    """Seconds until a reset header's time. It is a Unix time (QStash sends seconds, in
    milliseconds it is recognised by its size); a small number is seconds to wait."""
    if reset is None:
        return None
    if reset >= _MILLIS_EPOCH:
        return max(reset / 1000 - now, 0.0)
    if reset >= _SECONDS_EPOCH:
        return max(reset - now, 0.0)
    return max(reset, 0.0)


def server_limit(headers: Mapping[str, str]) -> int | None:
    """The requests-per-second limit the service announces, if any."""
    limit = _parse_number(headers.get("burst-ratelimit-limit"))
    return int(limit) if limit is not None and limit >= 1 else None


def _parse_number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and number not in (float("inf"), float("-inf")) else None
