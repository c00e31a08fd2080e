"""A failure callback read as the DLQ message it reports: the same facts, so the same
decisions, for the workflow sample pair and for messages generated at random and turned
into callbacks by the emulator's own builder."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.emulator.delivery import Message, Outcome, WorkflowRef, callback_body
from daemon.pipeline.decide import outcome_of, reads
from daemon.rules import Decision, facts, load_rules, parse_rules
from daemon.rules.callback import CARRIED, message_of, told
from daemon.rules.explain import explain
from daemon.store import records

SAMPLES = Path(__file__).resolve().parents[1] / "testdata" / "samples"
RULES = load_rules(Path(__file__).resolve().parents[2] / "rules.yaml")


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    return loaded


def test_the_workflow_callback_has_the_facts_of_its_dlq_message() -> None:
    from_callback = facts(message_of(sample("failure-callback-workflow.json")))
    from_message = facts(sample("dlq-message-workflow.json"))
    assert from_callback == from_message


def test_the_url_group_callback_has_the_facts_of_its_dlq_message_but_the_response() -> None:
    """The URL Group pair of samples records two different answers of the endpoint (a
    503 in the callback, a 410 in the DLQ message): the message's own fields agree, and
    `callback` and `failureCallback` are the DLQ message's alone (not in CARRIED)."""
    from_callback = facts(message_of(sample("failure-callback.json")))
    from_message = facts(sample("dlq-message-url-group.json"))
    response = {"responseStatus", "responseHeader", "responseBody", "responseBodyBase64"}
    shared = (set(from_callback) | set(from_message)) - response - {"callback", "failureCallback"}
    assert {name: from_callback.get(name) for name in shared} == {
        name: from_message.get(name) for name in shared
    }
    assert {"callback", "failureCallback"}.isdisjoint(CARRIED)
    assert (from_callback["responseStatus"], from_message["responseStatus"]) == (503, 410)


def test_the_documentations_form_reads_numbers_and_single_header_values() -> None:
    """Timestamps as digit strings and a header value not in a list, as QStash's docs
    print a callback: the same facts as the service's own form."""
    known = facts(message_of(sample("failure-callback-docs-form.json")))
    assert known["createdAt"] == 1701198447054
    assert known["notBefore"] == 1701198458025
    assert known["header"] == {"key": ("value",)}
    assert known["responseStatus"] == 400
    assert "body" not in known  # its sourceBody is not base64 of text: kept as it is
    assert known["bodyBase64"] == "YmFzZTY0kZWQgcm9keQ=="


def test_every_field_the_repository_rules_read_is_carried() -> None:
    assert {field for rule in RULES.rules for field in rule.reads} <= CARRIED


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_HEADERS = st.dictionaries(
    st.sampled_from(["Content-Type", "Retry-After", "Service-Label", "X-Id"]),
    st.lists(st.text("abcxyz019,", min_size=1, max_size=6), min_size=1, max_size=2),
    max_size=3,
)
_BODY = st.one_of(st.binary(max_size=16), _TEXT.map(str.encode))


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[Message, Outcome, str]:
    workflow = draw(st.one_of(st.none(), st.builds(
        WorkflowRef, run_id=st.text("abc0123_", min_size=1, max_size=8).map("wfr_".__add__),
        url=st.just("https://app.example.com/wf"),
    )))  # fmt: skip
    message = Message(
        message_id="msg_" + draw(st.text("abcdef0123", min_size=1, max_size=8)),
        url=draw(st.sampled_from(["https://a.example.com/x", "https://billing.example.com/"])),
        method=draw(st.sampled_from(["POST", "GET", "PUT"])),
        header=draw(_HEADERS),
        body=draw(_BODY),
        max_retries=draw(st.integers(0, 5)),
        created_at=draw(st.integers(1, 2**42)),
        caller_ip=draw(st.sampled_from(["203.0.113.7", "198.51.100.1"])),
        not_before=draw(st.integers(0, 2**42)),
        schedule_id=draw(st.one_of(st.none(), st.just("scd_1"))),
        topic_name=draw(st.one_of(st.none(), st.just("orders"))),
        endpoint_name=draw(st.one_of(st.none(), st.just("fulfilment"))),
        workflow=workflow,
    )
    outcome = Outcome(draw(st.integers(400, 599)), draw(_HEADERS), draw(_BODY))
    return message, outcome, draw(st.text("0123456789", min_size=1, max_size=13)) + "-0"


def dlq_message(message: Message, outcome: Outcome, dlq_id: str) -> dict[str, Any]:
    """The DLQ message of spec 2.1 for this delivery, written out from the spec: bodies
    as text when they are UTF-8, else base64."""
    wire: dict[str, Any] = {
        "messageId": message.message_id, "url": message.url, "method": message.method,
        "header": message.header, "maxRetries": message.max_retries,
        "notBefore": message.not_before, "createdAt": message.created_at,
        "callerIP": message.caller_ip, "dlqId": dlq_id, "scheduleId": message.schedule_id,
        "topicName": message.topic_name, "endpointName": message.endpoint_name,
        "responseStatus": outcome.status, "responseHeader": outcome.header,
        "workflowRunId": message.workflow.run_id if message.workflow else None,
    }  # fmt: skip
    for text, encoded, data in (
        ("body", "bodyBase64", message.body),
        ("responseBody", "responseBodyBase64", outcome.body),
    ):
        try:
            wire[text] = data.decode("utf-8")
        except UnicodeDecodeError:
            wire[encoded] = base64.b64encode(data).decode()
    return {name: value for name, value in wire.items() if value is not None}


@settings(max_examples=300, deadline=None)
@given(deliveries())
def test_a_callback_has_the_facts_and_the_decision_of_its_dlq_message(
    delivery: tuple[Message, Outcome, str],
) -> None:
    message, outcome, dlq_id = delivery
    callback = json.loads(json.dumps(callback_body(message, outcome, retried=3, dlq_id=dlq_id)))
    from_callback = facts(message_of(callback))
    from_message = facts(dlq_message(message, outcome, dlq_id))
    assert from_callback == from_message
    decided = RULES.decide(from_callback), RULES.decide(from_message)
    assert [rule.name for rule in decided[0].matched] == [rule.name for rule in decided[1].matched]
    if reads(decided[0], RULES) <= told(callback):  # RECOVERYD_FETCH=needed decides it so
        assert decided_as(decided[0], from_callback) == decided_as(decided[1], from_message)


def decided_as(decision: Decision, known: dict[str, Any]) -> records.Outcome:
    return outcome_of("dlq-1", decision, RULES, known, dry_run=False, header_prefix="Service",
                      now=1.0, calls=())  # fmt: skip


def test_the_workflow_callback_is_decided_as_its_message_with_no_read() -> None:
    callback = sample("failure-callback-workflow.json")
    from_callback = facts(message_of(callback))
    decision = RULES.decide(from_callback)
    assert decision.rule is not None
    assert reads(decision, RULES) <= told(callback)
    message = sample("dlq-message-workflow.json")
    from_message = facts(message)
    expected = decided_as(RULES.decide(from_message), from_message)
    assert decided_as(decision, from_callback) == expected


def test_a_rule_that_reads_a_field_no_callback_carries_is_not_decidable_from_one() -> None:
    """`failureCallback` is the DLQ message's alone: explain says the GET is needed."""
    ruleset = parse_rules(
        "version: 1\nrules:\n  - name: by-callback-url\n"
        "    match: {failureCallback: {prefix: 'https://recoveryd'}}\n    action: ignore\n"
    )
    message = sample("dlq-message-url-group.json")
    [step] = explain(ruleset, message, ruleset.decide(facts(message)), "Service")["matched"]
    assert step["reads"] == ["failureCallback"]
    assert step["decidableFromCallback"] is False
