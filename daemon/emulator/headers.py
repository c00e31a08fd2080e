"""Header maps as the service stores them (name -> list of values) and its prefixed names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

HeaderMap = dict[str, list[str]]


def canonical(name: str) -> str:
    """`content-type` -> `Content-Type`: the spelling Go's net/http, and so the service, uses."""
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def header_map(pairs: Iterable[tuple[str, str]]) -> HeaderMap:
    """Collect (name, value) pairs, as read off the wire, under canonical names."""
    result: HeaderMap = {}
    for name, value in pairs:
        result.setdefault(canonical(name), []).append(value)
    return result


def as_lists(raw: Mapping[str, str | list[str]]) -> HeaderMap:
    """A map whose values may be single strings, with every value made a list; names kept."""
    return {name: [value] if isinstance(value, str) else list(value) for name, value in raw.items()}


def first_value(headers: Mapping[str, list[str]], name: str) -> str | None:
    """The first value of `name`, whatever the spelling of the name in the map."""
    wanted = name.lower()
    for key, values in headers.items():
        if key.lower() == wanted and values:
            return values[0]
    return None


def with_header(headers: Mapping[str, list[str]], name: str, value: str | None) -> HeaderMap:
    """A copy without any spelling of `name`, then with `name: value` unless value is None."""
    result = {key: list(values) for key, values in headers.items() if key.lower() != name.lower()}
    if value is not None:
        result[name] = [value]
    return result


@dataclass(frozen=True)
class HeaderNames:
    """The service's own headers, spelled with its prefix as the service writes them."""

    prefix: str

    def name(self, suffix: str) -> str:
        return canonical(f"{self.prefix}-{suffix}")

    @property
    def workflow_run_id(self) -> str:
        return self.name("Workflow-RunId")

    @property
    def label(self) -> str:
        return self.name("Label")

    @property
    def flow_control_key(self) -> str:
        return self.name("Flow-Control-Key")

    @property
    def signature(self) -> str:
        return self.name("Signature")

    @property
    def message_id(self) -> str:
        return self.name("Message-Id")

    @property
    def retried(self) -> str:
        return self.name("Retried")
