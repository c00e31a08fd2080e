"""The facts a decision keeps (fields.kept) decide as the message did when read back
(fields.unkept), and leave the bodies out unless a rule reads them."""

from __future__ import annotations

import json

from bench import rulecases
from daemon.rules import facts, parse_rules
from daemon.rules.fields import BULKY, kept, unkept

PREFIX = "Service"
BODY_RULE = """\
version: 1
rules:
  - name: payment-errors
    match: {body: {contains: payment}, header: {X-Tenant: acme}}
    action: ignore
  - name: the-rest
    match: {responseStatus: {gte: 500}}
    action: ignore
"""


def test_the_kept_facts_of_the_typical_mix_decide_as_the_messages_did() -> None:
    """Every message of bench.rules' mix: the same rules matched, in the same order."""
    ruleset = parse_rules(rulecases.TYPICAL_RULES)
    for message in rulecases.message_mix():
        known = facts(message, PREFIX)
        again = unkept(kept(known, ruleset.reads_all))
        assert ruleset.decide(again) == ruleset.decide(known)
        assert ruleset.interpret(again) == ruleset.interpret(known)


def test_bodies_are_kept_only_when_a_rule_reads_them() -> None:
    """No rule reads a body: the bodies are left out and every other fact is kept."""
    message = {"dlqId": "d-1", "url": "https://a.example/x", "body": "payment failed",
               "responseBody": "oops", "responseStatus": 502,
               "header": {"X-Tenant": ["acme"]}}  # fmt: skip
    known = facts(message, PREFIX)
    plain = parse_rules(rulecases.TYPICAL_RULES)
    assert not plain.reads_all & BULKY
    assert set(json.loads(kept(known, plain.reads_all))) == set(known) - BULKY
    reading = parse_rules(BODY_RULE)
    again = unkept(kept(known, reading.reads_all))
    assert again["body"] == "payment failed"
    assert "responseBody" not in again
    assert [rule.name for rule in reading.decide(again).matched] == ["payment-errors"]


def test_header_maps_and_lists_come_back_as_tuples() -> None:
    """As `facts` made them: a header's values and the labels."""
    message = {"header": {"Service-Label": ["a,b"], "X-Tenant": ["acme", "beta"]}}
    known = facts(message, PREFIX)
    again = unkept(kept(known, frozenset()))
    assert again == known
    assert again["header"]["x-tenant"] == ("acme", "beta")
    assert again["labels"] == ("a", "b")
