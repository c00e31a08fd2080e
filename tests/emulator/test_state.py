"""The in-memory model: DLQ entries as the wire shows them, and URL Group endpoints."""

from __future__ import annotations

import pytest

from daemon.emulator.errors import BadRequest
from daemon.emulator.headers import HeaderNames
from daemon.emulator.state import (
    Endpoint,
    EndpointRef,
    SeedMessage,
    build_entry,
    parse_endpoint_refs,
    with_endpoints,
    without_endpoints,
)

NAMES = HeaderNames("Service")
ALWAYS = {"messageId", "url", "method", "maxRetries", "notBefore", "createdAt", "callerIP"}


def test_defaults_fill_the_always_present_fields() -> None:
    """A seed with only a url gets every field the service always sends."""
    entry = build_entry(SeedMessage(url="https://a.example.com"), seq=7, now_ms=1234, names=NAMES)
    wire = entry.to_wire()
    assert ALWAYS | {"responseStatus", "dlqId"} <= set(wire)
    assert wire["dlqId"] == "1234-7"
    assert (wire["method"], wire["maxRetries"], wire["notBefore"]) == ("POST", 3, 0)
    assert (wire["createdAt"], wire["callerIP"], wire["responseStatus"]) == (1234, "127.0.0.1", 500)


def test_absent_optional_fields_are_left_out() -> None:
    """No field is null; absent ones are not there at all."""
    wire = build_entry(SeedMessage(url="https://a"), seq=0, now_ms=1, names=NAMES).to_wire()
    assert None not in wire.values()
    assert not {"topicName", "body", "header", "labels", "flowControlKey"} & set(wire)


def test_workflow_fields_become_headers() -> None:
    """Run id, labels and flow-control key are set as the service's headers."""
    seed = SeedMessage(
        url="https://a", workflowRunId="wfr_1", labels=["a", "b"], flowControlKey="fk"
    )
    wire = build_entry(seed, seq=0, now_ms=1, names=NAMES).to_wire()
    assert wire["header"] == {
        "Service-Workflow-Runid": ["wfr_1"],
        "Service-Label": ["a,b"],
        "Service-Flow-Control-Key": ["fk"],
    }
    assert (wire["labels"], wire["flowControlKey"]) == (["a", "b"], "fk")


def test_labels_are_read_from_the_header_when_not_given() -> None:
    """A seeded `Service-Label` header gives the entry its labels."""
    seed = SeedMessage(url="https://a", header={"Service-Label": "x, y"})
    assert build_entry(seed, seq=0, now_ms=1, names=NAMES).labels == ("x", "y")


def test_body_and_base64_body_are_exclusive() -> None:
    """A message has one form of body."""
    with pytest.raises(ValueError, match="not both"):
        SeedMessage(url="https://a", body="x", bodyBase64="eA==")


@pytest.mark.parametrize(
    "payload",
    [
        {},
        [],
        {"endpoints": "x"},
        {"endpoints": []},
        {"endpoints": [{}]},
        {"endpoints": ["https://a"]},
        {"endpoints": [{"name": 3}]},
    ],
)
def test_malformed_endpoint_list_is_rejected(payload: object) -> None:
    """The body needs a non-empty `endpoints` list of items with a name or a url."""
    with pytest.raises(BadRequest):
        parse_endpoint_refs(payload, url_required=False)


def test_adding_needs_a_url() -> None:
    """An endpoint to add must say where it is."""
    with pytest.raises(BadRequest, match="url"):
        parse_endpoint_refs({"endpoints": [{"name": "a"}]}, url_required=True)


def test_removal_matches_by_name_or_by_url() -> None:
    """A ref removes the endpoint with its name and the one with its url."""
    endpoints = [Endpoint("https://a", "a"), Endpoint("https://b"), Endpoint("https://c", "c")]
    refs = [EndpointRef(name="a"), EndpointRef(url="https://b"), EndpointRef(name="nope")]
    assert without_endpoints(endpoints, refs) == [Endpoint("https://c", "c")]


def test_adding_replaces_the_endpoint_with_the_same_name() -> None:
    """Add is an upsert: the name keeps its place with the new url."""
    endpoints = [Endpoint("https://a", "a"), Endpoint("https://b", "b")]
    result = with_endpoints(endpoints, [EndpointRef(name="a", url="https://a2")])
    assert result == [Endpoint("https://a2", "a"), Endpoint("https://b", "b")]
