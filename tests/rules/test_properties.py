"""Laws of the condition language (PRODUCT.md 4.2) over random conditions and messages.

Each example compiles one rules file whose rules all say `continue: true`, so one decision
tells which of several equivalent conditions hold; the law is then checked on many
messages, including missing and wrongly typed values.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.rules import Ruleset, facts, parse_rules

LAWS = settings(max_examples=200, deadline=None)

# Values come from small pools shared by conditions and messages, so that a condition often
# holds for some messages of an example and not for others.
numbers = (
    st.sampled_from([0, 1, 1.0, 404, 410, 500, 503, 503.0, 599.5])
    | st.integers(400, 510)
    | st.floats(allow_nan=False, allow_infinity=False)
)
texts = st.sampled_from(["", "a", "ab", "orders", "https://a.example/x"]) | st.text(
    alphabet="ab:/.x", max_size=6
)
# An empty string is refused as an equals/in operand (it could only match a missing value).
operand_texts = texts.filter(bool)
words = st.sampled_from(["billing", "urgent", "canary", "a"])
patterns = st.sampled_from([".*", "a.*", ".*b", "[ab]+", "https://.*", "a|ab", "orders", "x?", ""])
missing: st.SearchStrategy[Any] = st.sampled_from([None, "", [], {}])


def some_of(operators: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping of one of these operators, or (less often) several, which the engine ANDs."""
    one = st.one_of([st.fixed_dictionaries({op: operand}) for op, operand in operators.items()])
    return one | one | st.fixed_dictionaries({}, optional=operators).filter(bool)


NUMBER_CONDITION = numbers | some_of(
    {
        "equals": numbers,
        "in": st.lists(numbers, min_size=1, max_size=3),
        "notIn": st.lists(numbers, min_size=1, max_size=3),
        "gt": numbers,
        "gte": numbers,
        "lt": numbers,
        "lte": numbers,
        "exists": st.booleans(),
    }
)
TEXT_CONDITION = operand_texts | some_of(
    {
        "equals": operand_texts,
        "in": st.lists(operand_texts, min_size=1, max_size=3),
        "notIn": st.lists(operand_texts, min_size=1, max_size=3),
        "prefix": texts,
        "suffix": texts,
        "contains": texts,
        "regex": patterns,
        "exists": st.booleans(),
    }
)
LIST_CONDITION = some_of(
    {
        "any": st.lists(words, min_size=1, max_size=3),
        "all": st.lists(words, min_size=1, max_size=3),
        "exists": st.booleans(),
    }
)
BOOLEAN_CONDITION = st.booleans() | some_of({"equals": st.booleans(), "exists": st.booleans()})

FIELD_CONDITIONS = {
    "responseStatus": NUMBER_CONDITION,
    "url": TEXT_CONDITION,
    "topicName": TEXT_CONDITION,
    "labels": LIST_CONDITION,
    "workflow": BOOLEAN_CONDITION,
}
single_fields = st.sampled_from(sorted(FIELD_CONDITIONS)).flatmap(
    lambda field: FIELD_CONDITIONS[field].map(lambda condition: {field: condition})
)
field_sets = single_fields | single_fields | st.fixed_dictionaries({}, optional=FIELD_CONDITIONS)


def _combined(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    some = st.lists(inner, min_size=1, max_size=3)
    negatable = inner.filter(bool)  # `not: {}` is refused: it would match nothing
    return st.one_of(
        some.map(lambda items: {"all": items}),
        some.map(lambda items: {"any": items}),
        negatable.map(lambda item: {"not": item}),
        st.tuples(field_sets, negatable).map(lambda pair: {**pair[0], "not": pair[1]}),
    )


conditions = st.recursive(field_sets, _combined, max_leaves=5)

messages = st.fixed_dictionaries(
    {},
    optional={
        "responseStatus": numbers | missing | st.sampled_from(["503", True, False, [503]]),
        "url": texts | missing | st.sampled_from([5, True, ["a"]]),
        "topicName": texts | missing | st.sampled_from([0, ["orders"]]),
        "labels": st.lists(words, max_size=3)
        | missing
        | st.sampled_from(["billing", 5, [1, "billing"]]),
        "label": st.sampled_from(["billing", "urgent, a", ""]),
        "workflowRunId": st.sampled_from(["wfr_own", "", None, 5]),
        "header": st.fixed_dictionaries(
            {},
            optional={
                "Service-Workflow-RunId": st.lists(st.sampled_from(["wfr_1", ""]), max_size=2),
                "service-label": st.lists(st.sampled_from(["billing", "a, urgent", ""])),
            },
        ),
    },
)
# facts() always makes `workflow` a boolean; decide() takes any facts, so also try values
# facts() never produces: another type, or no workflow fact at all.
KEEP, DROP = object(), object()
workflows = st.sampled_from([KEEP, KEEP, KEEP, DROP, 1, 0, "true"])
facts_lists = st.lists(st.tuples(messages, workflows), min_size=5, max_size=15).map(
    lambda drawn: [_facts(message, workflow) for message, workflow in drawn]
)


def _facts(message: dict[str, Any], workflow: Any) -> dict[str, Any]:
    found = facts(message)
    if workflow is DROP:
        del found["workflow"]
    elif workflow is not KEEP:
        found["workflow"] = workflow
    return found


def ruleset(*matches: dict[str, Any]) -> Ruleset:
    """Rules r0, r1, ... with these conditions, every one saying continue."""
    rules = [
        {"name": f"r{index}", "match": match, "action": "ignore", "continue": True}
        for index, match in enumerate(matches)
    ]
    compiled = parse_rules(json.dumps({"version": 1, "rules": rules}))  # JSON is YAML
    assert [rule.spec.match for rule in compiled.rules] == list(matches)
    return compiled


def holds(compiled: Ruleset, found: dict[str, Any]) -> list[bool]:
    """For each rule of `compiled`, whether it matches."""
    matched = {rule.name for rule in compiled.decide(found).matched}
    return [rule.name in matched for rule in compiled.rules]


@LAWS
@given(conditions.filter(bool), facts_lists)
def test_not_holds_exactly_when_the_condition_does_not(
    condition: dict[str, Any], found: list[dict[str, Any]]
) -> None:
    """`not: C` matches exactly the messages C does not."""
    compiled = ruleset(condition, {"not": condition})
    for one in found:
        plain, negated = holds(compiled, one)
        assert plain is not negated


@LAWS
@given(conditions, facts_lists)
def test_any_or_all_of_one_condition_is_that_condition(
    condition: dict[str, Any], found: list[dict[str, Any]]
) -> None:
    """`any: [C]` and `all: [C]` match exactly what C matches."""
    compiled = ruleset(condition, {"any": [condition]}, {"all": [condition]})
    for one in found:
        plain, either, both = holds(compiled, one)
        assert plain == either == both


@LAWS
@given(st.lists(conditions, min_size=1, max_size=3), facts_lists)
def test_any_and_all_agree_with_python(
    parts: list[dict[str, Any]], found: list[dict[str, Any]]
) -> None:
    """`any`/`all` of conditions agree with any()/all() of their separate results."""
    compiled = ruleset(*parts, {"any": parts}, {"all": parts})
    for one in found:
        *separate, either, every = holds(compiled, one)
        assert either == any(separate)
        assert every == all(separate)


@LAWS
@given(field_sets, field_sets, facts_lists)
def test_one_mapping_ands_its_fields(
    first: dict[str, Any], second: dict[str, Any], found: list[dict[str, Any]]
) -> None:
    """Field conditions in one mapping hold together exactly when each holds alone."""
    second = {name: value for name, value in second.items() if name not in first}
    compiled = ruleset(first, second, {**first, **second})
    for one in found:
        left, right, merged = holds(compiled, one)
        assert merged == (left and right)


def _near(value: Any) -> list[Any]:
    """Values close to `value`: itself, as the other number type, as a boolean, as text, in a
    list."""
    near = [value, str(value), [value]]
    if isinstance(value, int | float):
        near += [float(value), True, False] + ([int(value)] if float(value).is_integer() else [])
    return near


scalar_fields = st.one_of(
    st.tuples(st.just("responseStatus"), numbers),
    st.tuples(st.sampled_from(["url", "topicName"]), operand_texts),
)


@LAWS
@given(scalar_fields, facts_lists)
def test_in_one_value_is_equals_and_notin_is_its_negation(
    field_value: tuple[str, Any], found: list[dict[str, Any]]
) -> None:
    """`in: [v]` agrees with `equals: v` and `v`; `notIn: [v]` with `not: {f: v}`."""
    field, value = field_value
    compiled = ruleset(
        {field: {"in": [value]}},
        {field: {"equals": value}},
        {field: value},
        {field: {"notIn": [value]}},
        {"not": {field: value}},
    )
    found = found + [facts({field: near}) for near in _near(value)]
    for one in found:
        within, equal, shorthand, outside, negated = holds(compiled, one)
        assert within == equal == shorthand
        assert outside == negated


@LAWS
@given(scalar_fields)
def test_a_value_equals_itself(field_value: tuple[str, Any]) -> None:
    """`f: v` holds for a message whose f is v."""
    field, value = field_value
    assert holds(ruleset({field: value}), facts({field: value})) == [True]
