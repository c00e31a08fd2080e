"""Every condition operator of `match` (PRODUCT.md 4.2), and how rules combine into a decision."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest

from daemon.rules import Ruleset, facts, parse_rules

ABSENT: Any = object()  # the message has no such field at all


@cache
def _compiled(text: str) -> Ruleset:
    return parse_rules(text)


def ruleset(*matches: Any, cont: bool = False) -> Ruleset:
    """Rules r0, r1, ... with these `match` conditions, compiled from a file's text."""
    rules = [
        {"name": f"r{index}", "match": match, "action": "ignore", "continue": cont}
        for index, match in enumerate(matches)
    ]
    return _compiled(json.dumps({"version": 1, "rules": rules}))


def matches(match: Any, message: dict[str, Any]) -> bool:
    return ruleset(match).decide(facts(message)).rule is not None


def message_with(field: str, value: Any) -> dict[str, Any]:
    return {} if value is ABSENT else {field: value}


def _cases(
    name: str,
    field: str,
    condition: Any,
    *,
    hit: Any,
    miss: Any,
    wrong: tuple[Any, ...],
    missing_holds: bool = False,
    wrong_holds: bool = False,
) -> Iterator[Any]:
    """A value that satisfies the condition, one that does not, the field missing in each
    way, and values of the wrong type."""
    yield pytest.param(field, condition, hit, True, id=f"{name}-hit")
    yield pytest.param(field, condition, miss, False, id=f"{name}-miss")
    missing = [ABSENT, None, ""] + ([[]] if field == "labels" else [])
    for value in missing:
        label = "absent" if value is ABSENT else json.dumps(value)
        yield pytest.param(field, condition, value, missing_holds, id=f"{name}-{label}")
    for value in wrong:
        yield pytest.param(field, condition, value, wrong_holds, id=f"{name}-wrong-{value!r}")


URL = "https://api.example.com/v1/charge"
WRONG_TEXT = (5, True, [URL], {"url": URL})
WRONG_NUMBER = ("503", True, [503], {"status": 503})
WRONG_LIST = ("billing", 5, True, {"billing": True})

OPERATOR_CASES = [
    *_cases("equals", "url", {"equals": URL}, hit=URL, miss=URL + "/x", wrong=WRONG_TEXT),
    *_cases("equals-shorthand", "url", URL, hit=URL, miss=URL.upper(), wrong=WRONG_TEXT),
    *_cases(
        "equals-number", "responseStatus", {"equals": 503}, hit=503, miss=502, wrong=WRONG_NUMBER
    ),
    *_cases("equals-number-shorthand", "responseStatus", 503, hit=503, miss=0, wrong=WRONG_NUMBER),
    *_cases(
        "in", "responseStatus", {"in": [404, 410]}, hit=410, miss=400, wrong=("410", True, [410])
    ),
    *_cases("in-text", "method", {"in": ["PUT", "POST"]}, hit="PUT", miss="GET", wrong=WRONG_TEXT),
    *_cases(
        "notIn",
        "responseStatus",
        {"notIn": [404, 410]},
        hit=500,
        miss=404,
        wrong=("404", True, [404]),
        missing_holds=True,
        wrong_holds=True,  # a value that is not a number is not one of the numbers
    ),
    *_cases(
        "notIn-text",
        "topicName",
        {"notIn": ["orders"]},
        hit="payments",
        miss="orders",
        wrong=(5, ["orders"]),
        missing_holds=True,
        wrong_holds=True,
    ),
    *_cases(
        "prefix", "url", {"prefix": "https://api."}, hit=URL, miss="http://api.x", wrong=WRONG_TEXT
    ),
    *_cases("suffix", "url", {"suffix": "/charge"}, hit=URL, miss=URL + "s", wrong=WRONG_TEXT),
    *_cases(
        "contains",
        "responseBody",
        {"contains": "timeout"},
        hit='{"e":"db timeout"}',
        miss="ok",
        wrong=(5, ["timeout"]),
    ),
    *_cases("regex", "dlqId", {"regex": r"\d+-\d+"}, hit="1763-0", miss="1763-", wrong=(17630,)),
    *_cases("gt", "responseStatus", {"gt": 499}, hit=500, miss=499, wrong=WRONG_NUMBER),
    *_cases("gte", "responseStatus", {"gte": 500}, hit=500, miss=499, wrong=WRONG_NUMBER),
    *_cases("lt", "responseStatus", {"lt": 500}, hit=499, miss=500, wrong=("499", True, [499])),
    *_cases("lte", "responseStatus", {"lte": 499}, hit=499, miss=500, wrong=("499", True, [499])),
    *_cases(
        "any",
        "labels",
        {"any": ["billing", "urgent"]},
        hit=["x", "urgent"],
        miss=["x", "y"],
        wrong=WRONG_LIST,
    ),
    *_cases(
        "all",
        "labels",
        {"all": ["billing", "urgent"]},
        hit=["urgent", "x", "billing"],
        miss=["billing", "x"],
        wrong=WRONG_LIST,
    ),
    *_cases(
        "exists-true",
        "topicName",
        {"exists": True},
        hit="orders",
        miss=ABSENT,
        wrong=(5, ["orders"]),
        wrong_holds=True,  # the field is there, whatever its type
    ),
    *_cases(
        "exists-false",
        "topicName",
        {"exists": False},
        hit=ABSENT,
        miss="orders",
        wrong=(5, ["orders"]),
        missing_holds=True,
    ),
]


@pytest.mark.parametrize(("field", "condition", "value", "expected"), OPERATOR_CASES)
def test_operator(field: str, condition: Any, value: Any, expected: bool) -> None:
    """Each operator holds for a fitting value only; missing and mistyped fields as specified."""
    assert matches({field: condition}, message_with(field, value)) is expected


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        ({"equals": 1}, True),
        ({"in": [1, 2]}, True),
        ({"gte": 1}, True),
        ({"lte": 1}, True),
        ({"equals": 0}, False),
        ({"lt": 1}, False),
    ],
)
def test_a_boolean_is_never_a_number(condition: Any, value: bool) -> None:
    """True is not 1 and False is not 0 to a number condition."""
    assert not matches({"maxRetries": condition}, {"maxRetries": value})


@pytest.mark.parametrize("value", [1, 0, 1.0, "true"])
def test_a_number_is_never_a_boolean(value: Any) -> None:
    """`workflow: true` and `workflow: false` do not hold for 1, 0 or "true"."""
    for condition in (True, False, {"equals": True}, {"equals": False}):
        assert ruleset({"workflow": condition}).decide({"workflow": value}).rule is None


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        ({"equals": 503}, 503.0),
        ({"equals": 503.0}, 503),
        ({"in": [503, 504]}, 504.0),
        ({"in": [503.0]}, 503),
        ({"gt": 500}, 500.5),
        ({"lte": 500.5}, 500),
        ({"notIn": [404.0]}, 405),
    ],
)
def test_ints_and_floats_compare_as_numbers(condition: Any, value: float) -> None:
    """An int and a float of the same value are equal; order is numeric across both."""
    assert matches({"responseStatus": condition}, {"responseStatus": value})


def test_notin_of_an_equal_float_does_not_hold() -> None:
    """`notIn: [404]` excludes 404.0 as well."""
    assert not matches({"responseStatus": {"notIn": [404]}}, {"responseStatus": 404.0})


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("billing", "billing", True),
        ("billing", "billing-v2", False),
        ("billing", "old-billing", False),
        ("billing.*", "billing-v2", True),
        (".*billing.*", "old-billing-v2", True),
        ("foo|bar", "bar", True),
        ("foo|bar", "foobar", False),
        ("a$", "a\n", False),
    ],
)
def test_regex_is_anchored_at_both_ends(pattern: str, value: str, expected: bool) -> None:
    """A regex must match the whole value, every alternative included."""
    assert matches({"url": {"regex": pattern}}, {"url": value}) is expected


def test_operators_of_one_field_are_anded() -> None:
    """`{gte: 500, lte: 599}` holds inside the range only."""
    condition = {"responseStatus": {"gte": 500, "lte": 599, "notIn": [501]}}
    results = [matches(condition, {"responseStatus": s}) for s in (499, 500, 501, 599, 600)]
    assert results == [False, True, False, True, False]


# Headers: `header` and `responseHeader` take header name -> condition.

HEADER_FIELDS = pytest.mark.parametrize("field", ["header", "responseHeader"])


@HEADER_FIELDS
@pytest.mark.parametrize("written", ["Content-Type", "content-type", "CONTENT-TYPE"])
@pytest.mark.parametrize("sent", ["Content-Type", "content-type", "cOnTeNt-TyPe"])
def test_header_names_are_case_insensitive(field: str, written: str, sent: str) -> None:
    """A header condition finds the header whatever the case on either side."""
    condition = {field: {written: {"prefix": "application/json"}}}
    assert matches(condition, {field: {sent: ["application/json"]}})


@HEADER_FIELDS
def test_header_holds_when_any_value_satisfies(field: str) -> None:
    """One satisfying value among several is enough."""
    message = {field: {"Content-Type": ["text/plain", "application/json; charset=utf-8"]}}
    assert matches({field: {"Content-Type": {"prefix": "application/json"}}}, message)


@HEADER_FIELDS
def test_header_fails_when_no_value_satisfies(field: str) -> None:
    """No satisfying value among several: the condition does not hold."""
    message = {field: {"Content-Type": ["text/plain", "text/html"]}}
    assert not matches({field: {"Content-Type": {"prefix": "application/json"}}}, message)


@HEADER_FIELDS
def test_header_value_as_a_single_string(field: str) -> None:
    """A header value sent as one string counts as a list of one."""
    assert matches({field: {"Retry-After": "30"}}, {field: {"Retry-After": "30"}})


@HEADER_FIELDS
def test_header_notin_holds_when_some_value_is_outside(field: str) -> None:
    """notIn on a header holds when any value is outside the list (any-value semantics)."""
    message = {field: {"X-Env": ["prod", "staging"]}}
    assert matches({field: {"X-Env": {"notIn": ["prod"]}}}, message)
    assert not matches({field: {"X-Env": {"notIn": ["prod", "staging"]}}}, message)


@HEADER_FIELDS
@pytest.mark.parametrize(
    "headers",
    [ABSENT, None, {}, {"Other": ["x"]}, {"X-Env": []}, {"X-Env": [5]}],
    ids=["no-field", "null", "empty", "other-header", "no-values", "no-text-values"],
)
@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"exists": False}, True),
        ({"notIn": ["prod"]}, True),
        ({"exists": True}, False),
        ("prod", False),
        ({"in": ["prod"]}, False),
        ({"prefix": ""}, False),
        ({"regex": ".*"}, False),
    ],
)
def test_missing_header_behaves_like_a_missing_field(
    field: str, headers: Any, condition: Any, expected: bool
) -> None:
    """A header that is not there satisfies only `exists: false` and `notIn`."""
    assert matches({field: {"X-Env": condition}}, message_with(field, headers)) is expected


@HEADER_FIELDS
def test_header_conditions_are_anded(field: str) -> None:
    """Every header named in one condition must hold."""
    condition = {field: {"X-A": "1", "X-B": {"exists": False}}}
    assert matches(condition, {field: {"X-A": ["1"]}})
    assert not matches(condition, {field: {"X-A": ["1"], "X-B": ["2"]}})


def test_header_and_response_header_are_separate() -> None:
    """A condition on `header` does not look at the response headers, nor the reverse."""
    message = {"responseHeader": {"Retry-After": ["30"]}}
    assert not matches({"header": {"Retry-After": "30"}}, message)
    assert matches({"responseHeader": {"Retry-After": "30"}}, message)


# Condition sets: mappings AND their entries; all, any and not combine whole sets.

BILLING_5XX = {
    "url": {"prefix": "https://billing."},
    "responseStatus": {"gte": 500},
}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"url": "https://billing.example.com", "responseStatus": 503}, True),
        ({"url": "https://billing.example.com", "responseStatus": 404}, False),
        ({"url": "https://shop.example.com", "responseStatus": 503}, False),
        ({"url": "https://billing.example.com"}, False),
    ],
)
def test_conditions_of_one_mapping_are_anded(message: dict[str, Any], expected: bool) -> None:
    """Every field condition of a `match` must hold."""
    assert matches(BILLING_5XX, message) is expected


@pytest.mark.parametrize(
    "message",
    [{}, {"messageId": "m"}, {"url": 5, "responseStatus": "x", "labels": "y", "header": 1}],
)
def test_empty_match_matches_everything(message: dict[str, Any]) -> None:
    """`match: {}` holds for any message, even an empty or mistyped one."""
    assert matches({}, message)


NESTED = {
    "any": [
        {"all": [{"topicName": {"exists": True}}, {"responseStatus": {"in": [404, 410]}}]},
        {"not": {"any": [{"responseStatus": {"lt": 500}}, {"labels": {"any": ["canary"]}}]}},
    ]
}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"topicName": "orders", "responseStatus": 410}, True),  # first branch
        ({"topicName": "orders", "responseStatus": 400}, False),
        ({"responseStatus": 410}, False),
        ({"responseStatus": 503}, True),  # second branch: not (< 500 or canary)
        ({"responseStatus": 503, "labels": ["canary"]}, False),
        ({"labels": ["x"]}, True),  # a missing status is not < 500
    ],
)
def test_combinators_nest(message: dict[str, Any], expected: bool) -> None:
    """all, any and not nest inside each other as boolean logic."""
    assert matches(NESTED, message) is expected


def test_not_of_not_is_the_condition() -> None:
    """Negating twice gives back the condition."""
    condition = {"not": {"not": {"responseStatus": 500}}}
    assert matches(condition, {"responseStatus": 500})
    assert not matches(condition, {"responseStatus": 501})


def test_combinator_beside_fields_is_anded() -> None:
    """A combinator next to field conditions in one mapping must hold too."""
    condition = {"responseStatus": 503, "not": {"topicName": {"exists": True}}}
    assert matches(condition, {"responseStatus": 503})
    assert not matches(condition, {"responseStatus": 503, "topicName": "orders"})


# The decision: rules in order, first match wins unless a rule says continue.


def names(ruleset: Ruleset, message: dict[str, Any]) -> list[str]:
    return [rule.name for rule in ruleset.decide(facts(message)).matched]


def test_first_match_wins() -> None:
    """Of several matching rules, only the first decides."""
    rules = ruleset({"responseStatus": 404}, {"responseStatus": {"gte": 400}}, {})
    decision = rules.decide(facts({"responseStatus": 404}))
    assert [rule.name for rule in decision.matched] == ["r0"]
    assert decision.rule is rules.rules[0]


def test_later_rule_decides_when_earlier_ones_do_not_match() -> None:
    """Rules that do not match are skipped."""
    rules = ruleset({"responseStatus": 404}, {"responseStatus": {"gte": 500}}, {})
    assert names(rules, {"responseStatus": 503}) == ["r1"]
    assert names(rules, {"responseStatus": 200}) == ["r2"]


def test_continue_collects_matching_rules_in_order() -> None:
    """With `continue: true` every matching rule is collected, in file order."""
    text = json.dumps(
        {
            "version": 1,
            "rules": [
                {
                    "name": "a",
                    "match": {},
                    "action": "notify",
                    "continue": True,
                    "notify": {"url": "https://hooks.example.com/a"},
                },
                {
                    "name": "b",
                    "match": {"responseStatus": 404},
                    "action": "ignore",
                    "continue": True,
                },
                {
                    "name": "c",
                    "match": {"responseStatus": 503},
                    "action": "ignore",
                    "continue": True,
                },
                {"name": "d", "match": {}, "action": "resume"},
                {"name": "e", "match": {}, "action": "ignore"},
            ],
        }
    )
    decision = parse_rules(text).decide(facts({"responseStatus": 503}))
    assert [rule.name for rule in decision.matched] == ["a", "c", "d"]
    assert decision.rule is not None
    assert decision.rule.name == "d"
    assert decision.rule.action == "resume"


def test_continue_on_the_last_match_leaves_it_the_decision() -> None:
    """When nothing matches after a continuing rule, that rule is the decision."""
    rules = ruleset({"responseStatus": 503}, {"responseStatus": 404}, cont=True)
    decision = rules.decide(facts({"responseStatus": 503}))
    assert decision.rule is rules.rules[0]


def test_no_match_gives_no_rule() -> None:
    """A message no rule matches gets an empty decision."""
    decision = ruleset({"responseStatus": 404}).decide(facts({"responseStatus": 503}))
    assert decision.matched == ()
    assert decision.rule is None


# -- what a rule reads ----------------------------------------------------------------


def test_a_rule_knows_every_field_its_match_reads_however_deep() -> None:
    """Fields under any, all and not count; headers count as `header` or `responseHeader`;
    a rule that matches everything reads nothing."""
    ruleset = parse_rules(
        "version: 1\nrules:\n"
        "  - name: deep\n"
        "    match:\n"
        "      responseStatus: 503\n"
        "      any: [{url: {prefix: 'https://a'}}, {not: {labels: {any: [x]}}}]\n"
        "      all: [{header: {Retry-After: {exists: true}}}, {responseHeader: {X-Id: a}}]\n"
        "    action: ignore\n"
        "  - name: everything\n"
        "    match: {}\n"
        "    action: ignore\n"
    )
    deep, everything = ruleset.rules
    assert deep.reads == {"responseStatus", "url", "labels", "header", "responseHeader"}
    assert everything.reads == frozenset()
