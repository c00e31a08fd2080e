"""What the pages show, made from the store's values without I/O: the sparkline's
points, a failure's timeline, its message with secrets masked and the body cut short,
and how times and ages read."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from daemon.foundation.schedule import parse_schedule

BODY_SHOWN = 4096  # characters of a message body a page shows
# Header names whose values may be secrets (an endpoint's credentials forwarded with the
# message, a signature, a cookie): shown as MASK (docs/console.md, One failure).
SECRET_HEADER = re.compile(r"authorization|cookie|token|secret|signature|password|api-?key", re.I)
MASK = "••••••"
SPARK_WIDTH, SPARK_HEIGHT = 240, 32


def sparkline(counts: Sequence[int]) -> str:
    """The SVG polyline points of `counts` (oldest first) in SPARK_WIDTH by SPARK_HEIGHT."""
    if not counts:
        return ""
    top = max(max(counts), 1)
    step = SPARK_WIDTH / max(len(counts) - 1, 1)
    return " ".join(
        f"{index * step:.1f},{SPARK_HEIGHT - 1 - (SPARK_HEIGHT - 2) * count / top:.1f}"
        for index, count in enumerate(counts)
    )


def when(at: float | None) -> str:
    """A Unix time as UTC to the second, ISO 8601; `-` for none."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def age(seconds: float | None) -> str:
    """A duration as an operator reads it: 45s, 12m, 3h 5m, 2d 4h."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if hours == 0:
        return f"{minutes}m"
    if days == 0:
        return f"{hours}h {minutes % 60}m"
    return f"{days}d {hours % 24}h"


def masked(headers: Any) -> list[tuple[str, str]]:
    """A message's headers (name -> list of values) as (name, value) rows, the values of
    names that may carry a secret masked."""
    if not isinstance(headers, Mapping):
        return []
    rows = []
    for name, values in headers.items():
        shown = values if isinstance(values, list) else [values]
        for value in shown:
            rows.append((str(name), MASK if SECRET_HEADER.search(str(name)) else str(value)))
    return rows


def body_text(encoded: Any) -> tuple[str, bool]:
    """A callback's base64 body as text (UTF-8, else the base64 as sent), cut at
    BODY_SHOWN characters; and whether it was cut."""
    if not isinstance(encoded, str):
        return "", False
    try:
        text = base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        text = encoded
    return text[:BODY_SHOWN], len(text) > BODY_SHOWN


@dataclass(frozen=True)
class Step:
    """One step of a failure's timeline."""

    at: float | None
    what: str
    detail: str = ""


def timeline(record: Mapping[str, Any]) -> list[Step]:
    """A dlqId's way through the pipeline, from its record: received, each move of its
    history, each call of its batches with status and latency, oldest first."""
    steps = [Step(record.get("receivedAt"), "callback received")]
    for event in record.get("history") or []:
        if not isinstance(event, Mapping) or event.get("state") == "received":
            continue
        detail = ", ".join(
            f"{key} {value}" for key, value in event.items() if key not in ("state", "at")
        )
        steps.append(Step(event.get("at"), str(event.get("state")), detail))
    for batch in record.get("batches") or []:
        for call in batch.get("calls") or [] if isinstance(batch, Mapping) else []:
            steps.append(Step(call.get("at"), f"batch {batch.get('id')} call", _call(call)))
    for call in record.get("calls") or []:
        if isinstance(call, Mapping):
            steps.append(Step(call.get("at"), "fetched", _call(call)))
    return sorted(steps, key=lambda step: step.at if step.at is not None else 0.0)


def _call(call: Mapping[str, Any]) -> str:
    parts = [str(call.get(key)) for key in ("method", "path") if call.get(key)]
    if call.get("status") is not None:
        parts.append(f"status {call['status']}")
    if call.get("error"):
        parts.append(str(call["error"]))
    if isinstance(call.get("seconds"), int | float):
        parts.append(f"{call['seconds'] * 1000:.0f} ms")
    return " ".join(parts)


def next_fire(schedule: str | None, now: float) -> float | None:
    """When `schedule` (a cron or an interval, foundation/schedule.py) fires next after
    `now`; None without one."""
    if not schedule:
        return None
    fire = parse_schedule(schedule).get_next_fire_time(None, datetime.fromtimestamp(now, UTC))
    return fire.timestamp() if fire is not None else None
