"""The fields a condition can test and a message's values for them (docs/rules.md).

A message becomes its *facts* once, before any rule looks at it: the DLQ message's own
fields, the derived ones, and header maps keyed by lower-case name. A field that is
absent, null, "" or empty is left out of the facts, so "missing" is decided here, once.
Values are kept as the service sent them: a field of an unexpected type is not coerced,
it simply satisfies no operator that needs the right type.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any


class Kind(Enum):
    """What a field holds, which decides the operators it takes."""

    TEXT = "text"
    NUMBER = "number"
    BOOLEAN = "boolean"
    LIST = "list"  # of text
    HEADERS = "headers"  # header name -> list of text

    @property
    def article(self) -> str:
        return {"text": "a text", "list": "a list", "headers": "a header"}.get(
            self.value, f"a {self.value}"
        )


_TEXT = (
    "messageId topicName endpointName url method body bodyBase64 callback failureCallback "
    "scheduleId callerIP dlqId queueName responseBody responseBodyBase64 label "
    "workflowRunId flowControlKey"
)
FIELDS: Mapping[str, Kind] = {
    **dict.fromkeys(_TEXT.split(), Kind.TEXT),
    **dict.fromkeys(("maxRetries", "notBefore", "createdAt", "responseStatus"), Kind.NUMBER),
    "workflow": Kind.BOOLEAN,
    "labels": Kind.LIST,
    "header": Kind.HEADERS,
    "responseHeader": Kind.HEADERS,
}


# The fields that may be large (a message's and a response's bodies): a decision keeps
# them only when a rule in force reads them (`kept`).
BULKY: frozenset[str] = frozenset({"body", "bodyBase64", "responseBody", "responseBodyBase64"})


def facts(message: Mapping[str, Any], header_prefix: str = "Service") -> dict[str, Any]:
    """The values rules test for `message`, a DLQ message as JSON (spec 2.1)."""
    # Presence tested inline: a call per field was a fifth of this function's time
    # (bench/rules). Of JSON's values only null, "", [], {}, 0 and false are falsy, so
    # `value or value == 0` leaves out exactly the first four: half the time of
    # comparing each value with them.
    found = {
        name: value for name, value in message.items() if name in FIELDS and (value or value == 0)
    }
    for name in ("header", "responseHeader"):
        headers = _header_map(message.get(name))
        found.pop(name, None)
        if headers:
            found[name] = headers
    headers = found.get("header", {})
    prefix = header_prefix.lower()
    derived = {
        "workflowRunId": _first(headers.get(f"{prefix}-workflow-runid")),
        "flowControlKey": _first(headers.get(f"{prefix}-flow-control-key")),
        "labels": _labels(message, headers.get(f"{prefix}-label", ())),
    }
    # The message's own fields win: the real service sends them when they apply.
    for name, value in derived.items():
        if name not in found and value:
            found[name] = value
    found["workflow"] = isinstance(found.get("workflowRunId"), str)
    return found


def _header_map(value: Any) -> dict[str, tuple[str, ...]]:
    """Header name (lower case) -> its text values; one string counts as a list of one,
    and an empty value is no value, as an empty field is a missing one."""
    if not isinstance(value, Mapping):
        return {}
    headers: dict[str, tuple[str, ...]] = {}
    for name, values in value.items():
        if not isinstance(name, str):
            continue
        if isinstance(values, str):
            kept: tuple[str, ...] = (values,) if values else ()
        elif isinstance(values, (list, tuple)):  # a tuple: faster than list | tuple
            kept = tuple([v for v in values if isinstance(v, str) and v])
        else:
            continue
        if kept:
            key = name.lower()
            headers[key] = headers[key] + kept if key in headers else kept
    return headers


def _first(values: tuple[str, ...] | None) -> str | None:
    return values[0] if values else None


def _labels(message: Mapping[str, Any], header_values: tuple[str, ...]) -> tuple[str, ...]:
    """`labels` from the message's list, else its `label`, else `<Prefix>-Label`; each of
    the latter two may be comma-separated."""
    listed = message.get("labels")
    if isinstance(listed, list | tuple) and listed:
        return tuple(label for label in listed if isinstance(label, str))
    label = message.get("label")
    joined = (label,) if isinstance(label, str) and label else header_values
    return tuple(part.strip() for value in joined for part in value.split(",") if part.strip())


def kept(facts: Mapping[str, Any], reads: frozenset[str]) -> str:
    """The facts a decision is kept with, for replay: compact JSON (sorted keys) of every
    fact but the BULKY ones, which are kept only when in `reads` (the fields any rule of
    the ruleset in force reads). Header maps as {name: [values]}. The small facts are
    all kept, whatever the rules read: a candidate may read others (docs/rules.md)."""
    wanted = {name: value for name, value in facts.items() if name not in BULKY or name in reads}
    return json.dumps(wanted, sort_keys=True, separators=(",", ":"))


def unkept(text: str) -> dict[str, Any]:
    """The facts back from `kept`'s text, header maps' values and lists as tuples again,
    as `facts` made them: a ruleset reading only what was kept decides as it did."""
    found: dict[str, Any] = json.loads(text)
    # Only the few fields JSON gives another shape are looked at: a pass over every fact
    # was half the time replay spends on a record (bench/replay.py).
    for name in _HEADER_MAPS:
        value = found.get(name)
        if isinstance(value, dict):
            found[name] = {header: tuple(values) for header, values in value.items()}
    for name in _LISTS:
        value = found.get(name)
        if isinstance(value, list):
            found[name] = tuple(value)
    return found


_HEADER_MAPS = tuple(name for name, kind in FIELDS.items() if kind is Kind.HEADERS)
_LISTS = tuple(name for name, kind in FIELDS.items() if kind is Kind.LIST)
