"""The wire models: what the service sends parses without loss; what we send is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from daemon.upstream.models import (
    AccountRecord,
    BulkFilter,
    BulkResult,
    DLQMessage,
    EndpointRef,
    FlowControl,
    Overrides,
)

SAMPLES = Path(__file__).parent.parent / "testdata" / "samples"


def sample(name: str) -> dict[str, object]:
    return json.loads((SAMPLES / name).read_text())  # type: ignore[no-any-return]


def test_dlq_message_of_a_workflow_run_parses() -> None:
    """The workflow sample parses; its headers are read case-insensitively."""
    message = DLQMessage.model_validate(sample("dlq-message-workflow.json"))
    assert message.dlq_id == "1763712000456-0"
    assert message.caller_ip == "203.0.113.7"
    assert message.header_values("service-workflow-runid") == ("wfr_billing_8f2c",)


def test_dlq_message_round_trips_to_the_same_json() -> None:
    """Dumping by alias gives back exactly the service's JSON, so nothing is lost."""
    raw = sample("dlq-message-url-group.json")
    message = DLQMessage.model_validate(raw)
    assert message.model_dump(mode="json", by_alias=True, exclude_none=True) == raw


def test_dlq_message_keeps_unknown_fields() -> None:
    """A field the spec does not list survives parsing."""
    raw = sample("dlq-message-url-group.json") | {"retryDelayExpression": "1000"}
    message = DLQMessage.model_validate(raw)
    assert message.model_dump(by_alias=True)["retryDelayExpression"] == "1000"


def test_dlq_message_takes_a_single_string_header() -> None:
    """A header map with a bare string value reads as a list of one."""
    raw = sample("dlq-message-url-group.json") | {"header": {"X-Key": "v"}}
    assert DLQMessage.model_validate(raw).header == {"X-Key": ("v",)}


def test_dlq_message_without_a_dlq_id_is_refused() -> None:
    """The spec's required fields are required."""
    raw = sample("dlq-message-url-group.json")
    del raw["dlqId"]
    with pytest.raises(ValidationError, match="dlqId"):
        DLQMessage.model_validate(raw)


def test_account_record_hides_its_secrets() -> None:
    """Token and password never show in repr or str, yet can be read on purpose."""
    record = AccountRecord.model_validate(sample("account-record.json"))
    assert record.max_requests_per_second == 100
    assert record.max_dlq_retention_time_milis == 604800000
    assert "<ACCESS_TOKEN>" not in repr(record)
    assert "<PASSWORD>" not in str(record)
    assert record.token is not None
    assert record.token.get_secret_value() == "<ACCESS_TOKEN>"


def test_account_record_keeps_the_credentials_when_a_field_surprises() -> None:
    """An unexpected plan type or a malformed limit drops that field, never the new token:
    the reset has already happened, and its answer is the only copy of the credentials."""
    raw = sample("account-record.json") | {"type": "pay_as_you_go", "max_queues": "many"}
    record = AccountRecord.lenient(raw)
    assert record.token is not None
    assert record.token.get_secret_value() == "<ACCESS_TOKEN>"
    assert record.type == "pay_as_you_go"
    assert record.max_queues is None
    assert record.max_requests_per_second == 100


def test_endpoint_ref_needs_a_name_or_a_url() -> None:
    """An endpoint reference with neither is refused before any call is made."""
    with pytest.raises(ValidationError, match="needs a name or a url"):
        EndpointRef()
    assert EndpointRef(url="https://a.test").wire() == {"url": "https://a.test"}


def test_overrides_become_exact_headers() -> None:
    """Every override of spec 4.6 becomes its header, with the configured prefix."""
    overrides = Overrides(
        retries=5,
        delay="30s",
        retry_delay="pow(2, retried) * 1000",
        flow_control=FlowControl(key="billing", parallelism=5, rate=10, period="1m"),
        labels=("auto-restarted", "billing"),
        failure_callback="https://hooks.example.com/again",
    )
    assert overrides.headers("Upstash") == {
        "Upstash-Retries": "5",
        "Upstash-Delay": "30s",
        "Upstash-Retry-Delay": "pow(2, retried) * 1000",
        "Upstash-Flow-Control-Key": "billing",
        "Upstash-Flow-Control-Value": "parallelism=5, rate=10, period=1m",
        "Upstash-Label": "auto-restarted,billing",
        "Upstash-Failure-Callback": "https://hooks.example.com/again",
    }


def test_unset_overrides_send_no_header() -> None:
    """Only the values that are set become headers; retries=0 is a value."""
    assert Overrides().headers() == {}
    assert Overrides(retries=0).headers() == {"Service-Retries": "0"}


@pytest.mark.parametrize(
    "bad",
    [
        {"delay": "30 seconds"},
        {"delay": "500ms"},
        {"retries": -1},
        {"labels": ["a,b"]},
        {"labels": ["a b"]},
        {"retry_delay": "pow(2, retried"},
        {"retry_delay": "sleep(5)"},
        {"failure_callback": "ftp://hooks.example.com"},
        {"failure_callback": "https://hooks.example.com/a b"},
        {"flow_control": {"key": "k y", "rate": 1}},
        {"colour": "red"},
    ],
    ids=[
        "malformed delay",
        "milliseconds delay",
        "negative retries",
        "comma in label",
        "space in label",
        "unbalanced retry delay",
        "unknown function in retry delay",
        "failure callback not http",
        "space in failure callback",
        "space in flow-control key",
        "unknown key",
    ],
)
def test_bad_overrides_are_refused(bad: dict[str, object]) -> None:
    """A malformed override is an error, not a header the service will reject later."""
    with pytest.raises(ValidationError):
        Overrides.model_validate(bad)


def test_flow_control_needs_a_limit() -> None:
    """A flow-control key alone limits nothing, so it is refused."""
    with pytest.raises(ValidationError, match="parallelism or rate"):
        FlowControl(key="k")


def test_filter_repeats_arrays_and_names_params_as_the_spec() -> None:
    """Labels repeat; every other filter takes its spec 4.7 name."""
    query = BulkFilter(
        label=("a", "b"),
        from_date=1,
        to_date=2,
        workflow_url="https://w.test",
        workflow_run_id="wfr_1",
        workflow_created_at=3,
        failure_function_state="CALLBACK_FAIL",
        caller_ip="1.2.3.4",
        flow_control_key="k",
    ).query()
    assert query == [
        ("label", "a"),
        ("label", "b"),
        ("fromDate", "1"),
        ("toDate", "2"),
        ("workflowUrl", "https://w.test"),
        ("workflowRunId", "wfr_1"),
        ("workflowCreatedAt", "3"),
        ("failureFunctionState", "CALLBACK_FAIL"),
        ("callerIp", "1.2.3.4"),
        ("flowControlKey", "k"),
    ]


def test_bulk_result_end_is_the_empty_cursor() -> None:
    """An empty cursor means every matching workflow was processed."""
    page = BulkResult.model_validate(
        {"workflowRuns": [{"workflowRunId": "r", "workflowCreatedAt": 5}], "cursor": ""}
    )
    assert page.done
    assert page.workflow_runs[0].workflow_created_at == 5
    assert not BulkResult.model_validate({"workflowRuns": None, "cursor": "c"}).done
