"""Parsing of the override headers of bulk resume/restart."""

from __future__ import annotations

import pytest

from daemon.emulator.errors import BadRequest
from daemon.emulator.overrides import FlowControl, parse_overrides

ALL = [
    ("service-retries", "5"),
    ("service-delay", "30s"),
    ("service-retry-delay", "pow(2, retried) * 1000"),
    ("service-flow-control-key", "billing"),
    ("service-flow-control-value", "parallelism=5, rate=10, period=1m"),
    ("service-label", "auto,billing"),
    ("service-failure-callback", "https://hooks.example.com/again"),
]


def test_every_override_is_parsed() -> None:
    """Each header of spec 4.6 becomes a typed value."""
    overrides = parse_overrides(ALL, "Service")
    assert overrides.to_json() == {
        "retries": 5,
        "delay": "30s",
        "retryDelay": "pow(2, retried) * 1000",
        "flowControlKey": "billing",
        "flowControlValue": {"parallelism": 5, "rate": 10, "period": "1m"},
        "labels": ["auto", "billing"],
        "failureCallback": "https://hooks.example.com/again",
    }


def test_raw_headers_are_kept_as_received() -> None:
    """The values are recorded untouched, under the service's spelling of the names."""
    overrides = parse_overrides(ALL, "Service")
    assert dict(overrides.raw_headers) == {
        "Service-Retries": "5",
        "Service-Delay": "30s",
        "Service-Retry-Delay": "pow(2, retried) * 1000",
        "Service-Flow-Control-Key": "billing",
        "Service-Flow-Control-Value": "parallelism=5, rate=10, period=1m",
        "Service-Label": "auto,billing",
        "Service-Failure-Callback": "https://hooks.example.com/again",
    }


def test_names_are_case_insensitive_and_prefixed() -> None:
    """`UPSTASH-RETRIES` is the retries override under the Upstash prefix; others are not."""
    overrides = parse_overrides([("UPSTASH-RETRIES", "2"), ("Service-Delay", "x")], "Upstash")
    assert overrides.retries == 2
    assert overrides.delay is None


def test_no_headers_no_overrides() -> None:
    """Without override headers nothing is overridden."""
    assert parse_overrides([("content-type", "text/plain")], "Service").to_json() == {}


def test_any_subset_of_flow_control_settings() -> None:
    """Flow-Control-Value may give only some settings; a bare period means seconds."""
    overrides = parse_overrides(
        [("Service-Flow-Control-Key", "k"), ("Service-Flow-Control-Value", "period=60")],
        "Service",
    )
    assert overrides.flow_control == FlowControl(period="60")


def test_delay_seconds_of_each_unit() -> None:
    """Delay units s, m, h and d."""
    seconds = [
        parse_overrides([("Service-Delay", value)], "Service").delay_seconds
        for value in ("30s", "5m", "1h", "2d")
    ]
    assert seconds == [30, 300, 3600, 172800]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Service-Retries", "five"),
        ("Service-Retries", "-1"),
        ("Service-Retries", "²"),
        ("Service-Delay", "30"),
        ("Service-Delay", "1h30m"),
        ("Service-Delay", "10w"),
        ("Service-Retry-Delay", "pow(2, retried"),
        ("Service-Retry-Delay", "import os"),
        ("Service-Retry-Delay", "__import__('os')"),
        ("Service-Flow-Control-Value", "parallelism=0"),
        ("Service-Flow-Control-Value", "speed=5"),
        ("Service-Flow-Control-Value", "rate=1, rate=2"),
        ("Service-Flow-Control-Value", "period=soon"),
        ("Service-Label", "a,,b"),
        ("Service-Label", "with space"),
        ("Service-Failure-Callback", "not a url"),
        ("Service-Failure-Callback", "ftp://hooks.example.com"),
        ("Service-Retries", "  "),
    ],
)
def test_malformed_header_is_rejected_by_name(header: str, value: str) -> None:
    """A bad override is a 400 whose message names the header."""
    headers = [("Service-Flow-Control-Key", "k"), (header, value)]
    with pytest.raises(BadRequest, match=header):
        parse_overrides(headers, "Service")


def test_flow_control_value_needs_a_key() -> None:
    """Settings without the key they apply to are rejected."""
    with pytest.raises(BadRequest, match="Flow-Control"):
        parse_overrides([("Service-Flow-Control-Value", "rate=1")], "Service")


def test_repeated_override_is_rejected() -> None:
    """One header, one value."""
    with pytest.raises(BadRequest, match="Service-Retries"):
        parse_overrides([("Service-Retries", "1"), ("service-retries", "2")], "Service")
