"""Failure callback bodies: the service's forms parse, and a bad body names its field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.ingest.callback import MAX_DLQ_ID_LENGTH, CallbackError, parse_callback

SAMPLES = Path(__file__).parent.parent / "testdata" / "samples"
CALLBACK_SAMPLES = sorted(SAMPLES.glob("failure-callback*.json"))


def body(**fields: Any) -> bytes:
    """A minimal callback with `fields` set (or replaced)."""
    return json.dumps({"dlqId": "1763712000123-0", **fields}).encode()


@pytest.mark.parametrize("path", CALLBACK_SAMPLES, ids=lambda path: path.name)
def test_every_sample_callback_parses(path: Path) -> None:
    """Each real callback sample parses and keeps its dlqId."""
    raw = path.read_bytes()
    assert parse_callback(raw).dlq_id == json.loads(raw)["dlqId"]


def test_docs_form_timestamps_become_ints() -> None:
    """The documentation's form sends notBefore and createdAt as strings: they become ints."""
    callback = parse_callback((SAMPLES / "failure-callback-docs-form.json").read_bytes())
    assert (callback.not_before, callback.created_at) == (1701198458025, 1701198447054)


def test_docs_form_single_string_header_is_accepted_as_sent() -> None:
    """A header value given as one string instead of a list is valid and kept as sent."""
    callback = parse_callback((SAMPLES / "failure-callback-docs-form.json").read_bytes())
    assert callback.source_header == {"key": "value"}
    assert callback.header == {"key": ["value"]}


def test_unknown_fields_are_kept() -> None:
    """A field the spec does not list is kept for later, not refused or dropped."""
    callback = parse_callback(body(futureField={"nested": [1, 2]}, anotherOne="x"))
    assert callback.model_extra == {"futureField": {"nested": [1, 2]}, "anotherOne": "x"}


def test_dlq_id_of_the_longest_allowed_length_is_accepted() -> None:
    """A dlqId of exactly MAX_DLQ_ID_LENGTH characters is taken."""
    dlq_id = "d" * MAX_DLQ_ID_LENGTH
    assert parse_callback(body(dlqId=dlq_id)).dlq_id == dlq_id


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"status": 503}', id="missing"),
        pytest.param(body(dlqId=1763712000123), id="a number"),
        pytest.param(body(dlqId=None), id="null"),
        pytest.param(body(dlqId=""), id="empty"),
        pytest.param(body(dlqId="."), id="dot"),
        pytest.param(body(dlqId=".."), id="dot-dot"),
        pytest.param(body(dlqId="1763712000123-0\n"), id="newline"),
        pytest.param(body(dlqId="a\x00b"), id="nul"),
        pytest.param(body(dlqId="a\x7fb"), id="del"),
        pytest.param(body(dlqId="d" * (MAX_DLQ_ID_LENGTH + 1)), id="too long"),
    ],
)
def test_bad_dlq_id_is_refused_naming_dlq_id(raw: bytes) -> None:
    """A dlqId that is absent, not a string, or unusable in a URL path names dlqId."""
    with pytest.raises(CallbackError) as caught:
        parse_callback(raw)
    assert caught.value.field == "dlqId"
    assert str(caught.value).startswith("dlqId ")


@pytest.mark.parametrize("raw", [b"", b"dlqId=1", b'{"dlqId": "a"', b"\xff\xfe"])
def test_body_that_is_not_json_is_refused(raw: bytes) -> None:
    """A body that is not JSON says so, with no field to point at."""
    with pytest.raises(CallbackError, match="not valid JSON") as caught:
        parse_callback(raw)
    assert caught.value.field is None


@pytest.mark.parametrize("raw", [b"[]", b'["1763712000123-0"]', b'"dlq"', b"42", b"null"])
def test_json_that_is_not_an_object_is_refused(raw: bytes) -> None:
    """A JSON array, string, number or null is not a callback."""
    with pytest.raises(CallbackError, match="must be a JSON object") as caught:
        parse_callback(raw)
    assert caught.value.field is None


def test_non_numeric_timestamp_names_its_field() -> None:
    """A timestamp string that is not a number is refused, naming createdAt."""
    with pytest.raises(CallbackError) as caught:
        parse_callback(body(createdAt="12x"))
    assert caught.value.field == "createdAt"


@pytest.mark.parametrize("name", ["header", "sourceHeader"])
def test_header_value_of_the_wrong_type_names_its_path(name: str) -> None:
    """A header list holding a number names the exact path: map, header name, index."""
    with pytest.raises(CallbackError) as caught:
        parse_callback(body(**{name: {"Retry-After": ["30", 30]}}))
    assert caught.value.field == f"{name}.Retry-After.1"
