"""The journal: every call to the service API, with credentials redacted."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

# Headers whose value is a credential; only the scheme word (Bearer, Basic) is kept.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})
# Enough of a body to see what a client sent, without keeping a huge upload around.
_MAX_BODY = 64 * 1024


def redact(name: str, value: str) -> str:
    """`Bearer tok_x` -> `Bearer <redacted>`; other headers are kept as they are."""
    if name.lower() not in _SECRET_HEADERS:
        return value
    scheme, space, _ = value.strip().partition(" ")
    return f"{scheme} <redacted>" if space else "<redacted>"


def journal_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as a map of lowercased names; repeated headers joined with `, `."""
    result: dict[str, str] = {}
    for raw_name, raw_value in raw:
        name = raw_name.decode("latin-1").lower()
        value = redact(name, raw_value.decode("latin-1"))
        result[name] = f"{result[name]}, {value}" if name in result else value
    return result


@dataclass
class Call:
    """One call to the service API, filled in as it is answered."""

    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    at: float
    status: int | None = None
    fault: str | None = None
    outage: str | None = None  # the outage's mode, when the call met one
    carried_out: bool | None = None  # said of a corrupt answer: did the service act first?
    body: bytearray = field(default_factory=bytearray)

    def add_body(self, chunk: bytes) -> None:
        room = _MAX_BODY - len(self.body)
        if room > 0:
            self.body.extend(chunk[:room])

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "method": self.method,
            "path": self.path,
            "query": [[key, value] for key, value in self.query],
            "headers": self.headers,
            "status": self.status,
            "at": self.at,
        }
        if self.body:
            entry["body"] = self.body.decode("utf-8", errors="replace")
        if self.fault is not None:
            entry["fault"] = self.fault
        if self.carried_out is not None:
            entry["carriedOut"] = self.carried_out
        if self.outage is not None:
            entry["outage"] = self.outage
        return entry


def new_call(scope: MutableMapping[str, Any], at: float) -> Call:
    query = scope.get("query_string", b"").decode("latin-1")
    return Call(
        method=scope["method"],
        path=scope["path"],
        query=parse_qsl(query, keep_blank_values=True),
        headers=journal_headers(list(scope.get("headers", []))),
        at=at,
    )


class Journal:
    """Calls in the order they were answered (a call held by latency comes after later ones)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def record(self, call: Call) -> None:
        self.calls.append(call)

    def clear(self) -> None:
        self.calls.clear()

    def to_json(self) -> list[dict[str, Any]]:
        return [call.to_json() for call in self.calls]
