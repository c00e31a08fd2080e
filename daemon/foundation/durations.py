"""Durations as users write them (`30s`, `5m`, `24h`, `7d`), parsed in one place."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in `text`; a ValueError that shows the expected form otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"a duration is a number followed by ms, s, m, h or d, e.g. 30s; got {text!r}"
        )
    return float(match[1]) * _UNITS[match[2]]


def shown_duration(seconds: float) -> str:
    """`seconds` as users write it: `10m`, `36h`, `90s`, `1.5s`; the largest whole unit."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
