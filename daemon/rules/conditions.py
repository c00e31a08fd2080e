"""A rule's `match` compiled into one predicate over a message's facts (docs/rules.md#conditions).

Compiling checks everything that can be checked before a message arrives: every field
exists, every operator applies to its field's kind and its operand has the right type,
every regex compiles. Each mistake is collected with its path, so a file's errors are
all reported at once. The predicates then do no parsing and no type dispatch of their
own beyond the one type test that keeps `True` from equalling `1`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from daemon.foundation.words import did_you_mean, either, unknown_key
from daemon.rules.fields import FIELDS, Kind
from daemon.rules.yamlfile import Loc, Mistake, shown

Facts = Mapping[str, Any]
Predicate = Callable[[Facts], bool]
ValueTest = Callable[[Any], bool]

MISSING: Any = object()  # what a value test sees for a field the message lacks
_NUMBER_TYPES = (int, float)
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP token (RFC 9110)
_COMBINATORS = ("all", "any", "not")
_MATCH_TAKES = "match takes the fields of a message (docs/rules.md lists them), all, any and not"

OPERATORS: Mapping[Kind, tuple[str, ...]] = {
    Kind.TEXT: ("equals", "in", "notIn", "prefix", "suffix", "contains", "regex", "exists"),
    Kind.NUMBER: ("equals", "in", "notIn", "gt", "gte", "lt", "lte", "exists"),
    Kind.BOOLEAN: ("equals", "exists"),
    Kind.LIST: ("any", "all", "exists"),
}
ALL_OPERATORS = tuple(dict.fromkeys(op for ops in OPERATORS.values() for op in ops))


def always(facts: Facts) -> bool:
    return True


def never(facts: Facts) -> bool:
    return False


def compile_match(spec: Any, loc: Loc) -> tuple[Predicate, list[Mistake], frozenset[str]]:
    """The predicate for a `match` mapping, every problem found in it, and the fields it
    reads (`header` for any header; `workflow` and the others by name)."""
    compiler = _Compiler()
    predicate = compiler.match(spec, loc)
    return predicate, compiler.problems, frozenset(compiler.reads)


def value_test(kind: Kind, spec: Any) -> ValueTest:
    """The test of one value of `kind` by a condition already checked (rules/compiled.py
    reuses these where inlining would gain little)."""
    return _Compiler().value_test("", kind, spec, ())


class _Compiler:
    def __init__(self) -> None:
        self.problems: list[Mistake] = []
        self.reads: set[str] = set()

    def error(self, loc: Loc, message: str, *, at_key: bool = False) -> Predicate:
        self.problems.append(Mistake(loc, message, at_key))
        return never

    def match(self, spec: Any, loc: Loc) -> Predicate:
        """A condition set: every entry must hold; `{}` holds for every message."""
        if not isinstance(spec, dict):
            return self.error(
                loc,
                f"must be a mapping of field to condition, e.g. {{responseStatus: 503}}; "
                f"got {shown(spec)}",
            )
        parts = []
        for key, value in spec.items():
            here = (*loc, key)
            if key in ("all", "any"):
                parts.append(self.combination(key, value, here))
            elif key == "not" and value == {}:
                parts.append(self.error(here, "not: {} matches nothing ({} matches everything)"))
            elif key == "not":
                parts.append(_negated(self.match(value, here)))
            elif FIELDS.get(key) is Kind.HEADERS:
                parts.append(self.headers(key, value, here))
            elif key in FIELDS:
                parts.append(self.field(key, value, here))
            else:
                message = unknown_key(key, [*FIELDS, *_COMBINATORS], _MATCH_TAKES)
                parts.append(self.error(here, message, at_key=True))
        return all_of(parts)

    def combination(self, key: str, spec: Any, loc: Loc) -> Predicate:
        if not isinstance(spec, list) or not spec:
            return self.error(loc, f"must be a non-empty list of condition sets; got {shown(spec)}")
        parts = [self.match(item, (*loc, index)) for index, item in enumerate(spec)]
        return all_of(parts) if key == "all" else any_of(parts)

    def field(self, name: str, spec: Any, loc: Loc) -> Predicate:
        self.reads.add(name)
        test = self.value_test(name, FIELDS[name], spec, loc)
        return lambda facts: test(facts.get(name, MISSING))

    def headers(self, name: str, spec: Any, loc: Loc) -> Predicate:
        """`header: {Name: condition}`: true when any value of that header satisfies it."""
        self.reads.add(name)
        if not isinstance(spec, dict) or not spec:
            return self.error(
                loc,
                "must be a mapping of header name to condition, e.g. "
                f"{{Content-Type: {{prefix: application/json}}}}; got {shown(spec)}",
            )
        parts = []
        for header, condition in spec.items():
            here = (*loc, header)
            if not isinstance(header, str) or not _HEADER_NAME.fullmatch(header):
                parts.append(self.error(here, f"not a header name: {header!r}", at_key=True))
                continue
            test = self.value_test(f"header {header}", Kind.TEXT, condition, here)
            parts.append(header_test(name, header.lower(), test))
        return all_of(parts)

    def value_test(self, name: str, kind: Kind, spec: Any, loc: Loc) -> ValueTest:
        """The test of one field's value: a scalar means equals, a mapping ANDs operators."""
        if isinstance(spec, list):
            self.error(
                loc,
                "a list is ambiguous here: use in: [...] for one of several "
                "values, or any/all: [...] on a list field",
            )
            return _none_pass
        if spec is None or spec == {}:
            self.error(
                loc,
                f"an empty condition; to match a missing field use "
                f"{{exists: false}}; got {shown(spec)}",
            )
            return _none_pass
        if not isinstance(spec, dict):
            return self.operator("equals", spec, name, kind, loc)
        tests = [self.operator(op, operand, name, kind, (*loc, op)) for op, operand in spec.items()]
        if len(tests) == 1:
            return tests[0]
        if len(tests) == 2:
            first, second = tests
            return lambda value: first(value) and second(value)
        return lambda value: all(test(value) for test in tests)

    def operator(self, op: str, operand: Any, name: str, kind: Kind, loc: Loc) -> ValueTest:
        if op not in ALL_OPERATORS:
            hint = did_you_mean(op, ALL_OPERATORS)
            self.error(
                loc,
                f"unknown operator {op!r}; {hint + ' ' if hint else ''}{name} takes "
                f"{either(OPERATORS[kind])}",
            )
            return _none_pass
        if op not in OPERATORS[kind]:
            self.error(
                loc,
                f"{op} does not apply to {name}, {kind.article} field; it takes "
                f"{either(OPERATORS[kind])}",
            )
            return _none_pass
        try:
            return _OPERATOR_BUILDERS[op](operand, kind)
        except _WrongType as exc:
            self.error(loc, f"{name} is {kind.article} field: {exc}")
        except _BadOperand as exc:
            self.error(loc, str(exc))
        return _none_pass


def all_of(parts: Sequence[Predicate]) -> Predicate:
    if not parts:
        return always
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        first, second = parts
        return lambda facts: first(facts) and second(facts)
    parts = tuple(parts)

    # Loops, not all()/any() over a generator: this runs for every rule and every message,
    # and a generator costs more than the tests it drives (bench/rules).
    def every(facts: Facts) -> bool:
        for part in parts:  # noqa: SIM110
            if not part(facts):
                return False
        return True

    return every


def any_of(parts: Sequence[Predicate]) -> Predicate:
    if len(parts) == 1:
        return parts[0]
    parts = tuple(parts)

    def some(facts: Facts) -> bool:
        for part in parts:  # noqa: SIM110
            if part(facts):
                return True
        return False

    return some


def _negated(inner: Predicate) -> Predicate:
    return lambda facts: not inner(facts)


def _none_pass(value: Any) -> bool:
    return False  # stands in for a test that did not compile; the file is refused anyway


_NO_HEADERS: Mapping[str, tuple[str, ...]] = {}


def header_test(field: str, header: str, test: ValueTest) -> Predicate:
    def holds(facts: Facts) -> bool:
        values = facts.get(field, _NO_HEADERS).get(header)
        if not values:
            return test(MISSING)
        for value in values:  # noqa: SIM110 (a loop: see all_of)
            if test(value):
                return True
        return False

    return holds


# Operand checks and value tests, one builder per operator.


class _BadOperand(ValueError):
    """An operand this operator cannot use."""


class _WrongType(_BadOperand):
    """An operand of another type than the field's."""


def _scalar(operand: Any, kind: Kind) -> Any:
    """An operand of the field's own type."""
    fits = {
        Kind.TEXT: isinstance(operand, str),
        Kind.NUMBER: isinstance(operand, _NUMBER_TYPES) and not isinstance(operand, bool),
        Kind.BOOLEAN: isinstance(operand, bool),
    }
    if not fits.get(kind, False):
        raise _WrongType(f"compare it with {_OPERAND_WORDS[kind]}; got {shown(operand)}")
    if operand == "":
        raise _BadOperand(
            "an empty string never matches (an empty value counts as missing); use exists: false"
        )
    return operand


_OPERAND_WORDS = {Kind.TEXT: "a string", Kind.NUMBER: "a number", Kind.BOOLEAN: "true or false"}


def _scalars(operand: Any, kind: Kind) -> frozenset[Any]:
    if not isinstance(operand, list) or not operand:
        raise _BadOperand(f"must be a non-empty list, e.g. [a, b]; got {shown(operand)}")
    return frozenset(_scalar(item, Kind.TEXT if kind is Kind.LIST else kind) for item in operand)


_TYPES: Mapping[Kind, type] = {Kind.TEXT: str, Kind.BOOLEAN: bool}


def _equals(operand: Any, kind: Kind) -> ValueTest:
    expected = _scalar(operand, kind)
    if kind is Kind.NUMBER:
        return lambda value: (type(value) is int or type(value) is float) and value == expected
    wanted = _TYPES[kind]
    return lambda value: type(value) is wanted and value == expected


def _in(operand: Any, kind: Kind) -> ValueTest:
    expected = _scalars(operand, kind)
    if kind is Kind.NUMBER:
        return lambda value: (type(value) is int or type(value) is float) and value in expected
    wanted = _TYPES[kind]
    return lambda value: type(value) is wanted and value in expected


def _not_in(operand: Any, kind: Kind) -> ValueTest:
    inside = _in(operand, kind)
    return lambda value: not inside(value)


def _text(operand: Any) -> str:
    if not isinstance(operand, str):
        raise _WrongType(f"compare it with a string; got {shown(operand)}")
    return operand


def _prefix(operand: Any, kind: Kind) -> ValueTest:
    text = _text(operand)
    return lambda value: type(value) is str and value.startswith(text)


def _suffix(operand: Any, kind: Kind) -> ValueTest:
    text = _text(operand)
    return lambda value: type(value) is str and value.endswith(text)


def _contains(operand: Any, kind: Kind) -> ValueTest:
    text = _text(operand)
    return lambda value: type(value) is str and text in value


def _regex(operand: Any, kind: Kind) -> ValueTest:
    try:
        pattern = re.compile(_text(operand))
    except re.error as exc:
        raise _BadOperand(f"not a valid regular expression: {exc}") from None
    # Anchored, like Prometheus: a pattern that matches only a part of the value would
    # recover more than its author meant. `.*billing.*` says "contains".
    return lambda value: type(value) is str and pattern.fullmatch(value) is not None


def _comparison(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Kind], ValueTest]:
    def build(operand: Any, kind: Kind) -> ValueTest:
        bound = _scalar(operand, Kind.NUMBER)
        return lambda value: type(value) in _NUMBER_TYPES and compare(value, bound)

    return build


def _exists(operand: Any, kind: Kind) -> ValueTest:
    if not isinstance(operand, bool):
        raise _BadOperand(f"must be true or false; got {shown(operand)}")
    if operand:
        return lambda value: value is not MISSING
    return lambda value: value is MISSING


def _any(operand: Any, kind: Kind) -> ValueTest:
    wanted = _scalars(operand, kind)
    return lambda value: (
        type(value) in (list, tuple) and any(type(item) is str and item in wanted for item in value)
    )


def _all(operand: Any, kind: Kind) -> ValueTest:
    wanted = _scalars(operand, kind)
    return lambda value: (
        type(value) in (list, tuple)
        and wanted.issubset(item for item in value if type(item) is str)
    )


_OPERATOR_BUILDERS: Mapping[str, Callable[[Any, Kind], ValueTest]] = {
    "equals": _equals,
    "in": _in,
    "notIn": _not_in,
    "prefix": _prefix,
    "suffix": _suffix,
    "contains": _contains,
    "regex": _regex,
    "gt": _comparison(lambda value, bound: value > bound),
    "gte": _comparison(lambda value, bound: value >= bound),
    "lt": _comparison(lambda value, bound: value < bound),
    "lte": _comparison(lambda value, bound: value <= bound),
    "exists": _exists,
    "any": _any,
    "all": _all,
}
