"""The override headers of a bulk resume or restart (spec 4.6): validated and parsed.

Formats are QStash's: `Delay` and a flow-control `period` are `<integer><unit>` with unit
s, m, h or d (a bare integer period means seconds); `Retry-Delay` is an arithmetic
expression over `retried` with QStash's functions; `Flow-Control-Value` is comma-separated
`parallelism=<n>`, `rate=<n>`, `period=<duration>` (any of them, each once) and needs a
`Flow-Control-Key`; `Label` is comma-separated. A malformed header is a 400 naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from daemon.emulator.errors import BadRequest
from daemon.emulator.headers import canonical

_DURATION = re.compile(r"^([0-9]+)([smhd])$")
_COUNT = re.compile(r"^[0-9]+$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LABEL = re.compile(r"^[A-Za-z0-9_.\-]+$")
_RETRY_DELAY_CHARS = re.compile(r"^[0-9a-z_+\-*/(),. ]+$")
_RETRY_DELAY_NAMES = frozenset(
    {"retried", "pow", "sqrt", "abs", "exp", "floor", "ceil", "round", "min", "max"}
)
SUFFIXES = (
    "Retries",
    "Delay",
    "Retry-Delay",
    "Flow-Control-Key",
    "Flow-Control-Value",
    "Label",
    "Failure-Callback",
)


@dataclass(frozen=True)
class FlowControl:
    parallelism: int | None = None
    rate: int | None = None
    period: str | None = None

    def to_json(self) -> dict[str, Any]:
        values = {"parallelism": self.parallelism, "rate": self.rate, "period": self.period}
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class Overrides:
    """What a bulk call overrides, parsed; `raw_headers` holds the headers as received."""

    retries: int | None = None
    delay: str | None = None
    retry_delay: str | None = None
    flow_control_key: str | None = None
    flow_control: FlowControl | None = None
    labels: tuple[str, ...] | None = None
    failure_callback: str | None = None
    raw_headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def delay_seconds(self) -> float:
        return 0.0 if self.delay is None else float(duration_seconds(self.delay))

    def to_json(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "retries": self.retries,
            "delay": self.delay,
            "retryDelay": self.retry_delay,
            "flowControlKey": self.flow_control_key,
            "flowControlValue": self.flow_control.to_json() if self.flow_control else None,
            "labels": list(self.labels) if self.labels is not None else None,
            "failureCallback": self.failure_callback,
        }
        return {key: value for key, value in values.items() if value is not None}


def is_http_url(value: str) -> bool:
    """An absolute http(s) URL with a host, the only kind the service sends requests to."""
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        return False
    return url.scheme in ("http", "https") and bool(url.host)


def is_count(value: str) -> bool:
    """Only ASCII digits (str.isdigit also takes `²`, which int() refuses)."""
    return _COUNT.match(value) is not None


def duration_seconds(value: str) -> int:
    """Seconds in a `<integer><unit>` duration; ValueError otherwise."""
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r}")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def parse_overrides(headers: Iterable[tuple[str, str]], prefix: str) -> Overrides:
    """The overrides among `headers` (any spelling of the names); 400 naming a bad header."""
    wanted = {canonical(f"{prefix}-{suffix}").lower(): suffix for suffix in SUFFIXES}
    raw: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, value in headers:
        suffix = wanted.get(name.lower())
        if suffix is None:
            continue
        header = canonical(f"{prefix}-{suffix}")
        if header in raw:
            raise BadRequest(f"{header} must be given once")
        raw[header] = value
        text = value.strip()
        if not text:
            raise BadRequest(f"{header} must not be empty")
        values[suffix] = _PARSERS[suffix](text, header)
    if "Flow-Control-Value" in values and "Flow-Control-Key" not in values:
        raise BadRequest(f"{canonical(prefix + '-Flow-Control-Value')} needs a Flow-Control-Key")
    return Overrides(
        retries=values.get("Retries"),
        delay=values.get("Delay"),
        retry_delay=values.get("Retry-Delay"),
        flow_control_key=values.get("Flow-Control-Key"),
        flow_control=values.get("Flow-Control-Value"),
        labels=values.get("Label"),
        failure_callback=values.get("Failure-Callback"),
        raw_headers=raw,
    )


def _retries(value: str, header: str) -> int:
    if not is_count(value):
        raise BadRequest(f"{header} must be a non-negative integer")
    return int(value)


def _delay(value: str, header: str) -> str:
    if not _DURATION.match(value):
        raise BadRequest(f"{header} must be <integer><unit> with unit s, m, h or d, e.g. 30s")
    return value


def _retry_delay(value: str, header: str) -> str:
    if not _RETRY_DELAY_CHARS.match(value) or not _balanced(value):
        raise BadRequest(f"{header} is not an arithmetic expression, e.g. pow(2, retried) * 1000")
    unknown = sorted(set(re.findall(r"[a-z_]+", value)) - _RETRY_DELAY_NAMES)
    if unknown:
        raise BadRequest(f"{header}: unknown name {unknown[0]!r}")
    return value


def _balanced(expression: str) -> bool:
    depth = 0
    for char in expression:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _text(value: str, header: str) -> str:
    return value


def _flow_control(value: str, header: str) -> FlowControl:
    parts: dict[str, str] = {}
    for item in value.split(","):
        key, equals, setting = (piece.strip() for piece in item.partition("="))
        if not equals or key not in ("parallelism", "rate", "period") or not setting:
            raise BadRequest(f"{header} must be parallelism=<n>, rate=<n>, period=<duration>")
        if key in parts:
            raise BadRequest(f"{header} gives {key} twice")
        parts[key] = setting
    for key in ("parallelism", "rate"):
        if key in parts and (not is_count(parts[key]) or int(parts[key]) < 1):
            raise BadRequest(f"{header}: {key} must be a positive integer")
    period = parts.get("period")
    if period is not None and not (is_count(period) or _DURATION.match(period)):
        raise BadRequest(f"{header}: period must be a duration such as 1m")
    return FlowControl(
        parallelism=int(parts["parallelism"]) if "parallelism" in parts else None,
        rate=int(parts["rate"]) if "rate" in parts else None,
        period=period,
    )


def _labels(value: str, header: str) -> tuple[str, ...]:
    labels = tuple(label.strip() for label in value.split(","))
    if not all(_LABEL.match(label) for label in labels):
        raise BadRequest(f"{header} must be labels of letters, digits, `-`, `_`, `.`, by commas")
    return labels


def _failure_callback(value: str, header: str) -> str:
    if not is_http_url(value):
        raise BadRequest(f"{header} must be an absolute http(s) URL")
    return value


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "Retries": _retries,
    "Delay": _delay,
    "Retry-Delay": _retry_delay,
    "Flow-Control-Key": _text,
    "Flow-Control-Value": _flow_control,
    "Label": _labels,
    "Failure-Callback": _failure_callback,
}
