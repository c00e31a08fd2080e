"""A DLQ message's facts (PRODUCT.md 4.1): its own fields, the derived ones, missing values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.rules import facts

SAMPLES = Path(__file__).parent.parent / "testdata" / "samples"


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SAMPLES / name).read_text(encoding="utf-8"))
    return loaded


def with_headers(**headers: Any) -> dict[str, Any]:
    """A message whose `header` holds these (underscores in names become dashes)."""
    return {"header": {name.replace("_", "-"): value for name, value in headers.items()}}


# Samples as the service sends them.


def test_workflow_sample_is_a_workflow_run() -> None:
    """The workflow sample's run id and label come from its Service-* headers."""
    found = facts(sample("dlq-message-workflow.json"))
    assert found["workflow"] is True
    assert found["workflowRunId"] == "wfr_billing_8f2c"
    assert found["labels"] == ("billing",)
    assert "flowControlKey" not in found


def test_workflow_sample_keeps_its_own_fields() -> None:
    """The sample's own fields are facts, unchanged."""
    message = sample("dlq-message-workflow.json")
    found = facts(message)
    for name in ("messageId", "url", "method", "body", "maxRetries", "createdAt", "dlqId"):
        assert found[name] == message[name]
    assert found["responseStatus"] == 500


def test_workflow_sample_headers_are_keyed_by_lower_case_name() -> None:
    """Header maps are keyed by lower-case name, values as tuples."""
    found = facts(sample("dlq-message-workflow.json"))
    assert found["header"]["service-workflow-runid"] == ("wfr_billing_8f2c",)
    assert found["header"]["content-type"] == ("application/json",)
    assert found["responseHeader"] == {"content-type": ("application/json",)}


def test_url_group_sample_is_not_a_workflow_run() -> None:
    """The URL Group sample has a topic and no workflow facts."""
    found = facts(sample("dlq-message-url-group.json"))
    assert found["workflow"] is False
    assert found["topicName"] == "orders"
    assert found["endpointName"] == "fulfilment"
    assert found["responseStatus"] == 410
    for derived in ("workflowRunId", "labels", "flowControlKey"):
        assert derived not in found


def test_facts_leave_out_unknown_fields() -> None:
    """Only fields a condition can test become facts."""
    found = facts({"url": "https://a.example", "workflowCreatedAt": 5, "extra": "x"})
    assert found == {"url": "https://a.example", "workflow": False}


# Missing values.


@pytest.mark.parametrize("value", [None, "", [], {}], ids=["null", "empty-text", "[]", "{}"])
@pytest.mark.parametrize("field", ["topicName", "responseStatus", "labels", "label", "scheduleId"])
def test_empty_values_are_missing(field: str, value: Any) -> None:
    """null, "", [] and {} leave the field out of the facts."""
    assert field not in facts({field: value})


@pytest.mark.parametrize("field", ["header", "responseHeader"])
@pytest.mark.parametrize(
    "value",
    [None, "", {}, [], {"X-A": []}, {"X-A": None}, {"X-A": [5, None]}, "X-A: 1", ["X-A"]],
)
def test_headers_without_text_values_are_missing(field: str, value: Any) -> None:
    """A header map with no text value in it is left out of the facts."""
    assert field not in facts({field: value})


@pytest.mark.parametrize(
    ("field", "value"), [("responseStatus", 0), ("maxRetries", 0), ("maxRetries", 0.0)]
)
def test_zero_is_present(field: str, value: float) -> None:
    """0 is a value, not a missing one (status 0 means no response)."""
    assert facts({field: value})[field] == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("responseStatus", "503"),
        ("responseStatus", True),
        ("url", 5),
        ("url", False),  # falsy, like the missing values, but a value
        ("labels", "billing"),
        ("labels", [1, "billing"]),
        ("maxRetries", 2.5),
    ],
)
def test_values_are_not_coerced(field: str, value: Any) -> None:
    """A value of an unexpected type is kept as the service sent it."""
    assert facts({field: value})[field] == value


def test_header_values_that_are_not_text_are_dropped() -> None:
    """Non-text values of a header are left out, the text ones kept."""
    found = facts(with_headers(X_A=["1", 2, None, "3"]))
    assert found["header"] == {"x-a": ("1", "3")}


def test_header_single_string_counts_as_a_list_of_one() -> None:
    """A header value sent as a plain string is one value."""
    assert facts(with_headers(Retry_After="30"))["header"] == {"retry-after": ("30",)}


def test_header_names_differing_in_case_are_merged() -> None:
    """Two spellings of one header name give one header with both values."""
    found = facts({"header": {"X-A": ["1"], "x-a": ["2"]}})
    assert sorted(found["header"]["x-a"]) == ["1", "2"]


# Derived fields: workflow, workflowRunId, labels, flowControlKey.


@pytest.mark.parametrize(
    "name", ["Service-Workflow-RunId", "service-workflow-runid", "SERVICE-WORKFLOW-RUNID"]
)
def test_run_id_header_makes_a_workflow(name: str) -> None:
    """<Prefix>-Workflow-RunId, in any case, gives workflowRunId and workflow true."""
    found = facts({"header": {name: ["wfr_1"]}})
    assert found["workflowRunId"] == "wfr_1"
    assert found["workflow"] is True


def test_without_run_id_workflow_is_false() -> None:
    """A message with no run id is not a workflow run; workflow is false, not missing."""
    found = facts({"url": "https://a.example", "header": {"Service-Label": ["billing"]}})
    assert found["workflow"] is False
    assert "workflowRunId" not in found


def test_empty_run_id_header_is_not_a_workflow() -> None:
    """An empty <Prefix>-Workflow-RunId does not make a workflow run."""
    found = facts(with_headers(Service_Workflow_RunId=[""]))
    assert found["workflow"] is False
    assert "workflowRunId" not in found


def test_message_run_id_wins_over_header() -> None:
    """The message's own workflowRunId is used before the header's."""
    message = {"workflowRunId": "wfr_own", **with_headers(Service_Workflow_RunId=["wfr_hdr"])}
    found = facts(message)
    assert found["workflowRunId"] == "wfr_own"
    assert found["workflow"] is True


def test_message_run_id_alone_makes_a_workflow() -> None:
    """A workflowRunId field without any header makes a workflow run."""
    assert facts({"workflowRunId": "wfr_1"})["workflow"] is True


def test_flow_control_key_from_header() -> None:
    """<Prefix>-Flow-Control-Key gives flowControlKey."""
    found = facts(with_headers(Service_Flow_Control_Key=["billing"]))
    assert found["flowControlKey"] == "billing"


def test_message_flow_control_key_wins_over_header() -> None:
    """The message's own flowControlKey is used before the header's."""
    message = {"flowControlKey": "own", **with_headers(Service_Flow_Control_Key=["hdr"])}
    assert facts(message)["flowControlKey"] == "own"


@pytest.mark.parametrize(
    ("values", "labels"),
    [
        (["billing"], ("billing",)),
        (["billing,urgent"], ("billing", "urgent")),
        ([" billing ,  urgent "], ("billing", "urgent")),
        (["billing, ,urgent,"], ("billing", "urgent")),
        (["billing", "urgent, eu"], ("billing", "urgent", "eu")),
        ("billing, urgent", ("billing", "urgent")),
    ],
)
def test_labels_from_header_are_comma_separated(values: Any, labels: tuple[str, ...]) -> None:
    """<Prefix>-Label values split on commas, spaces trimmed, empty parts dropped."""
    assert facts(with_headers(Service_Label=values))["labels"] == labels


@pytest.mark.parametrize("values", [[""], [" , "], [","]])
def test_blank_label_header_gives_no_labels(values: list[str]) -> None:
    """A <Prefix>-Label with no label in it leaves labels missing."""
    assert "labels" not in facts(with_headers(Service_Label=values))


def test_label_field_wins_over_header() -> None:
    """The message's `label` (comma-separated too) is used before <Prefix>-Label."""
    found = facts({"label": "billing, eu", **with_headers(Service_Label=["hdr"])})
    assert found["labels"] == ("billing", "eu")
    assert found["label"] == "billing, eu"


def test_labels_list_wins_over_label_and_header() -> None:
    """The message's `labels` list is used before `label` and <Prefix>-Label."""
    message = {"labels": ["own"], "label": "single", **with_headers(Service_Label=["hdr"])}
    assert facts(message)["labels"] == ["own"]


@pytest.mark.parametrize("empty", [None, "", []])
def test_empty_labels_list_falls_back_to_label(empty: Any) -> None:
    """An empty `labels` does not hide `label`."""
    assert facts({"labels": empty, "label": "single"})["labels"] == ("single",)


@pytest.mark.parametrize("empty", [None, ""])
def test_empty_label_falls_back_to_header(empty: Any) -> None:
    """An empty `label` does not hide <Prefix>-Label."""
    message = {"label": empty, **with_headers(Service_Label=["hdr"])}
    assert facts(message)["labels"] == ("hdr",)


def test_custom_header_prefix() -> None:
    """With prefix Upstash the Upstash-* headers are read, in any case."""
    message = with_headers(
        Upstash_Workflow_RunId=["wfr_u"],
        upstash_label=["billing, eu"],
        UPSTASH_FLOW_CONTROL_KEY=["fck"],
    )
    found = facts(message, header_prefix="Upstash")
    assert found["workflow"] is True
    assert found["workflowRunId"] == "wfr_u"
    assert found["labels"] == ("billing", "eu")
    assert found["flowControlKey"] == "fck"


def test_custom_header_prefix_ignores_the_default_one() -> None:
    """With prefix Upstash the Service-* headers derive nothing."""
    message = with_headers(
        Service_Workflow_RunId=["wfr_s"], Service_Label=["billing"], Service_Flow_Control_Key=["k"]
    )
    found = facts(message, header_prefix="Upstash")
    assert found["workflow"] is False
    for derived in ("workflowRunId", "labels", "flowControlKey"):
        assert derived not in found


def test_derived_headers_stay_testable_as_headers() -> None:
    """Deriving fields from headers leaves the headers themselves in the facts."""
    found = facts(sample("dlq-message-workflow.json"))
    assert found["header"]["service-label"] == ("billing",)
