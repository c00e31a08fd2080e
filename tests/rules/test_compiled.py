"""The compiled rules (rules/compiled.py) decide as the interpreter does, rule by rule:
on every case bench.rules times, and on rules and facts generated at random, values of
the wrong type included. `recoveryd explain` walks the interpreter, so it agrees too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench import rulecases
from daemon.rules import FileError, Ruleset, facts, parse_rules
from daemon.rules.explain import explain

PREFIX = "Service"


def names(ruleset: Ruleset, known: dict[str, Any]) -> tuple[list[str], list[str]]:
    compiled, interpreted = ruleset.decide(known), ruleset.interpret(known)
    assert compiled.evaluated == interpreted.evaluated
    return [r.name for r in compiled.matched], [r.name for r in interpreted.matched]


def test_the_worst_case_of_bench_rules_is_decided_alike() -> None:
    ruleset = parse_rules(rulecases.worst_case(200).text)
    message = rulecases.worst_message()
    compiled, interpreted = names(ruleset, facts(message, PREFIX))
    assert compiled == interpreted == [ruleset.rules[-1].name]
    # And each rule alone, so that every one of them decides something.
    for rule in ruleset.rules:
        alone = parse_rules("version: 1\nrules:\n" + _rule_yaml(rule.spec.model_dump()))
        compiled, interpreted = names(alone, facts(message, PREFIX))
        assert compiled == interpreted


def test_the_typical_mix_of_bench_rules_is_decided_alike_and_explained_so(tmp_path: Path) -> None:
    ruleset = parse_rules(rulecases.TYPICAL_RULES)
    decided = set()
    for message in rulecases.message_mix():
        known = facts(message, PREFIX)
        compiled, interpreted = names(ruleset, known)
        assert compiled == interpreted
        shown = explain(ruleset, message, ruleset.interpret(known), PREFIX)
        assert [step["rule"] for step in shown["matched"]] == compiled
        decided.add(shown["rule"])
    assert len(decided) > 3  # the mix reaches several rules, not one


def _rule_yaml(spec: dict[str, Any]) -> str:
    keep = {"name": spec["name"], "match": spec["match"], "action": "ignore"}
    return "  - " + json.dumps(keep) + "\n"


# Generated rules and facts.

_TEXTS = st.sampled_from(["orders", "ord", "ders", "https://a.example.com/x", "é"])
_NUMBERS = st.sampled_from([404, 503, 503.0])
_ODD = st.sampled_from([None, True, False, 503, "503", 1.5, ["orders"], {"a": 1}, ""])


def _operators(operators: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One operator, or two ANDed: more would rarely all hold."""
    one = st.one_of(*(st.fixed_dictionaries({op: operand}) for op, operand in operators.items()))
    return st.one_of(one, st.tuples(one, one).map(lambda pair: pair[0] | pair[1]))


_SOME_TEXTS = st.lists(_TEXTS, min_size=1, max_size=3)
_SOME_NUMBERS = st.lists(_NUMBERS, min_size=1, max_size=3)
_TEXT_CONDITION = st.one_of(_TEXTS, _operators({
    "equals": _TEXTS, "in": _SOME_TEXTS, "notIn": _SOME_TEXTS, "prefix": _TEXTS,
    "suffix": _TEXTS, "contains": _TEXTS, "exists": st.booleans(),
    "regex": st.sampled_from(["ord.*", "https://[a-z]+\\.example\\.com/.*", "o|é"]),
}))  # fmt: skip
_NUMBER_CONDITION = st.one_of(_NUMBERS, _operators({
    "equals": _NUMBERS, "in": _SOME_NUMBERS, "notIn": _SOME_NUMBERS, "gt": _NUMBERS,
    "gte": _NUMBERS, "lt": _NUMBERS, "lte": _NUMBERS, "exists": st.booleans(),
}))  # fmt: skip
_FIELD_CONDITIONS = {
    "topicName": _TEXT_CONDITION,
    "url": _TEXT_CONDITION,
    "responseStatus": _NUMBER_CONDITION,
    "maxRetries": _NUMBER_CONDITION,
    "workflow": st.one_of(st.booleans(), _operators({"equals": st.booleans(),
                                                     "exists": st.booleans()})),
    "labels": _operators({"any": _SOME_TEXTS, "all": _SOME_TEXTS, "exists": st.booleans()}),
    "header": st.one_of(
        st.fixed_dictionaries({"X-Tenant": _TEXT_CONDITION}),
        st.fixed_dictionaries({"Content-Type": _TEXT_CONDITION}),
    ),
}  # fmt: skip


def _condition_set(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    fields = st.dictionaries(
        st.sampled_from(sorted(_FIELD_CONDITIONS)), st.none(), max_size=2
    ).flatmap(lambda chosen: st.fixed_dictionaries({k: _FIELD_CONDITIONS[k] for k in chosen}))
    if depth == 0:
        return fields
    nested = _condition_set(depth - 1).filter(bool)
    combinators = st.one_of(st.just({}), *(
        st.fixed_dictionaries({key: operand}) for key, operand in (
            ("all", st.lists(nested, min_size=1, max_size=2)),
            ("any", st.lists(nested, min_size=1, max_size=2)), ("not", nested),
        )
    ))  # fmt: skip
    return st.tuples(fields, combinators).map(lambda pair: pair[0] | pair[1])


_RULES = st.lists(st.tuples(_condition_set(1), st.booleans()), min_size=1, max_size=6)


def _mostly(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Values of the field's type three times in four, else one of another type."""
    return st.one_of(values, values, values, _ODD)


_VALUES = {
    "topicName": _mostly(_TEXTS), "url": _mostly(_TEXTS),
    "responseStatus": _mostly(_NUMBERS), "maxRetries": _mostly(_NUMBERS),
    "workflow": _mostly(st.booleans()),
    "labels": st.one_of(st.lists(st.one_of(_TEXTS, _ODD), max_size=3).map(tuple), _ODD),
    "header": st.dictionaries(
        st.sampled_from(["x-tenant", "content-type"]),
        st.lists(_TEXTS, min_size=1, max_size=2).map(tuple), max_size=2,
    ),
}  # fmt: skip
# Every field most of the time (a rule then tests all it reads), a few left out.
_FACTS = st.tuples(
    st.fixed_dictionaries(_VALUES), st.sets(st.sampled_from(sorted(_VALUES)), max_size=2)
).map(lambda pair: {k: v for k, v in pair[0].items() if k not in pair[1]})


@settings(max_examples=400, deadline=None)
@given(_RULES, _FACTS)
def test_generated_rules_are_decided_alike_on_generated_facts(
    rules: list[tuple[dict[str, Any], bool]], known: dict[str, Any]
) -> None:
    text = "version: 1\nrules:\n" + "".join(
        "  - " + json.dumps({"name": f"r{n}", "match": match, "action": "ignore",
                             "continue": goes_on}) + "\n"
        for n, (match, goes_on) in enumerate(rules)
    )  # fmt: skip
    ruleset = parse_rules(text)
    compiled, interpreted = names(ruleset, known)
    assert compiled == interpreted


_OPERANDS: dict[str, list[Any]] = {
    "text": ["orders", "ord", "ders", "o.*s", ["orders", "ders"], True, False],
    "number": [404, 503, 503.0, [404, 503], True, False],
}
_OPERATORS = {
    "topicName": (
        "text",
        ["equals", "in", "notIn", "prefix", "suffix", "contains", "regex", "exists"],
    ),
    "responseStatus": ("number", ["equals", "in", "notIn", "gt", "gte", "lt", "lte", "exists"]),
}
_VALUES_TRIED = ["orders", "ord", "ders", "", 404, 503, 503.0, 504, True, None, ["orders"]]


def test_every_operator_of_one_condition_is_decided_alike_on_every_value() -> None:
    """Each operator with each operand that the file accepts, against values of every
    type, the field missing included: a table, not a sample."""
    tried = 0
    for field, (kind, operators) in _OPERATORS.items():
        for op in operators:
            for operand in _OPERANDS[kind]:
                rule = {"name": "r", "match": {field: {op: operand}}, "action": "ignore"}
                try:
                    ruleset = parse_rules("version: 1\nrules:\n  - " + json.dumps(rule) + "\n")
                except FileError:
                    continue  # an operand this operator does not take
                for value in _VALUES_TRIED:
                    known = {} if value is None else {field: value}
                    compiled, interpreted = names(ruleset, known)
                    assert compiled == interpreted, (rule, value)
                    tried += 1
    assert tried > 300


_HEADER_SPECS: list[Any] = [
    "acme", {"equals": "acme"}, {"in": ["acme", "x"]}, {"notIn": ["acme"]}, {"exists": True},
    {"exists": False}, {"prefix": "ac"}, {"prefix": "ac", "suffix": "x"}, {"regex": "a.*"},
]  # fmt: skip
_HEADER_VALUES: list[Any] = [None, (), ("acme",), ("x", "acme"), ("acx",), ("ac", "x")]
_LABEL_SPECS: list[Any] = [
    {"any": ["a", "b"]}, {"all": ["a", "b"]}, {"exists": True}, {"exists": False},
    {"any": ["a"], "all": ["b"]},
]  # fmt: skip
_LABEL_VALUES: list[Any] = [None, (), ("a",), ("a", "b"), ["b", "a", 3], ("c",), "a", 5]


def _decided_alike(match: dict[str, Any], known: dict[str, Any]) -> None:
    rule = {"name": "r", "match": match, "action": "ignore"}
    ruleset = parse_rules("version: 1\nrules:\n  - " + json.dumps(rule) + "\n")
    compiled, interpreted = names(ruleset, known)
    assert compiled == interpreted, (match, known)


def test_every_header_and_list_condition_is_decided_alike_on_every_value() -> None:
    """Header conditions test each value of the header (or a missing one when it has
    none); list conditions the list's str items."""
    for spec in _HEADER_SPECS:
        for values in _HEADER_VALUES:
            headers = {} if values is None else {"x-tenant": values, "other": ("acme",)}
            _decided_alike({"header": {"X-Tenant": spec}}, {"header": headers})
        _decided_alike({"header": {"X-Tenant": spec}}, {})
    for spec in _LABEL_SPECS:
        for labels in _LABEL_VALUES:
            _decided_alike({"labels": spec}, {} if labels is None else {"labels": labels})
