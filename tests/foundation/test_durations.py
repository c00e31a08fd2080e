"""Durations as users write them."""

from __future__ import annotations

import pytest

from daemon.foundation.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("30s", 30), ("5m", 300), ("24h", 86400), ("7d", 604800), ("1.5s", 1.5)],
)
def test_units(text: str, seconds: float) -> None:
    """Each unit converts to seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30 seconds", "", "s", "-5s", "5w", "1e3s"])
def test_malformed_duration_says_what_is_expected(text: str) -> None:
    """A malformed duration names the expected form and echoes the input."""
    with pytest.raises(ValueError, match=r"e\.g\. 30s; got"):
        parse_duration(text)
