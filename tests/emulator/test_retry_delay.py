"""`Retry-Delay` expressions evaluated as the service does."""

from __future__ import annotations

import pytest

from daemon.emulator.retry_delay import milliseconds


@pytest.mark.parametrize(
    ("expression", "retried", "expected"),
    [
        ("pow(2, retried) * 1000", 0, 1000.0),
        ("pow(2, retried) * 1000", 3, 8000.0),
        ("1000 * (1 + retried)", 2, 3000.0),
        ("max(10, min(sqrt(retried) * 100, 150)) - 1", 4, 149.0),
    ],
)
def test_expression_gives_milliseconds_after_retried_retries(
    expression: str, retried: int, expected: float
) -> None:
    """An expression over `retried` with QStash's functions gives the delay in ms."""
    assert milliseconds(expression, retried) == expected


@pytest.mark.parametrize(
    "expression", ["__import__('os').getpid()", "retried.real", "1 / 0", "exp(1000)", "2 **", ""]
)
def test_what_is_not_a_delay_gives_none(expression: str) -> None:
    """Anything but arithmetic over `retried`, or arithmetic that fails, gives no delay."""
    assert milliseconds(expression, 1) is None
