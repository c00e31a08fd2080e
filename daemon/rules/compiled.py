"""A ruleset's conditions compiled into one Python function, once per load.

The interpreter (conditions.py) makes each condition a closure, and a decision calls
three or four of them per condition of every rule it tests: at 200 rules that is most
of its time (bench/rules). Here every `match` becomes an expression over locals read
once from the facts, and the rules one `if` each, in order, in a single function: the
same tests, with no call per condition. Operands are names bound to values in the
function's namespace, never source text, so no rule can inject code.

The semantics are the interpreter's, operator by operator (its value tests are the
reference: the differential tests run both on bench/rulecases and generated messages).
The files the interpreter refuses never get here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from daemon.rules.conditions import MISSING, Facts, header_test, value_test
from daemon.rules.fields import FIELDS, Kind

# The compiled ruleset: facts in; the index of the rule that ended the evaluation (-1
# when none did); the indexes of rules matched with `continue` appended to the list.
Compiled = Callable[[Facts, list[int]], int]

_COMPARISONS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_CHEAP, _TEXT, _CALL = 1, 2, 6  # relative costs: what orders the tests of a condition set


def compile_ruleset(matches: Sequence[Any], continues: Sequence[bool]) -> Compiled:
    """The function deciding by these `match` specs (already checked) in order; a rule
    whose `continues` is true records its match and lets the next rules be tested."""
    writer = _Writer()
    tests = [writer.match(spec) for spec in matches]
    lines = ["def decide(facts, continued):", "    get = facts.get", *writer.preamble()]
    for index, (test, goes_on) in enumerate(zip(tests, continues, strict=True)):
        lines.append(f"    if {test}:")
        lines.append(f"        continued.append({index})" if goes_on else f"        return {index}")
    lines.append("    return -1")
    namespace: dict[str, Any] = {
        "MISSING": MISSING, "NO_HEADERS": {}, "EMPTY": frozenset(), **writer.constants,
    }  # fmt: skip
    exec(compile("\n".join(lines), "<rules.yaml, compiled>", "exec"), namespace)
    decide: Compiled = namespace["decide"]
    return decide


@dataclass(frozen=True)
class _Test:
    cost: int
    expression: str


class _Writer:
    """Python expressions for conditions. The fields they read become locals, read once
    with their type tests; operands become named constants, one per distinct operand;
    a test that calls a function (a regex, a header's or a list's values) is evaluated
    at most once per decision, however many rules repeat it."""

    def __init__(self) -> None:
        self.fields: dict[str, int] = {}  # field name -> the number of its locals
        self.derived: dict[str, str] = {}  # local -> its expression over the field locals
        self.headers: dict[tuple[str, str], int] = {}  # (field, header) -> its locals' number
        self.constants: dict[str, Any] = {}
        self._constant_names: dict[Any, str] = {}
        self.memos: dict[str, str] = {}  # expression -> the local that keeps its value

    def preamble(self) -> list[str]:
        lines = [f"    v{n} = get({name!r}, MISSING)" for name, n in self.fields.items()]
        lines += [f"    {local} = {expression}" for local, expression in self.derived.items()]
        if self.memos:
            lines.append("    " + " = ".join(self.memos.values()) + " = None")
        return lines

    def constant(self, key: Any, make: Callable[[], Any]) -> str:
        if key not in self._constant_names:
            name = self._constant_names[key] = f"k{len(self.constants)}"
            self.constants[name] = make()
        return self._constant_names[key]

    def scalar(self, value: Any) -> str:
        return self.constant((type(value), value), lambda: value)

    def members(self, values: Sequence[Any]) -> str:
        """A set of the listed values, for `in`, `notIn`, `any` and `all`."""
        members = frozenset(values)
        return self.constant(("in", members), lambda: members)

    def local(self, field: str, kind: str = "") -> str:
        """The local holding `field`'s value, or with `kind` one derived from it: "s",
        "n", "b" whether it is a str, a number, a bool; "t" the set of the str items of
        a list (None when it is not a list)."""
        n = self.fields.setdefault(field, len(self.fields))
        v = f"v{n}"
        if not kind:
            return v
        self.derived[f"{kind}{n}"] = {
            "s": f"type({v}) is str",
            "n": f"(type({v}) is int or type({v}) is float)",
            "b": f"type({v}) is bool",
            "t": f"(frozenset([x for x in {v} if type(x) is str]) "
            f"if type({v}) is tuple or type({v}) is list else None)",
        }[kind]
        return f"{kind}{n}"

    def header_values(self, field: str, header: str) -> tuple[str, str]:
        """The locals holding the header's values (None when it has none) and the set of
        those that are str."""
        found = self.local(field)
        n = self.headers.setdefault((field, header), len(self.headers))
        values, strs = f"g{n}", f"h{n}"
        self.derived[values] = (
            f"({found} if {found} is not MISSING else NO_HEADERS).get({header!r})"
        )
        self.derived[strs] = (
            f"frozenset([x for x in {values} if type(x) is str]) if {values} else EMPTY"
        )
        return values, strs

    def once(self, expression: str) -> _Test:
        memo = self.memos.setdefault(expression, f"m{len(self.memos)}")
        return _Test(_CALL, f"({memo} if {memo} is not None else ({memo} := {expression}))")

    def match(self, spec: Mapping[str, Any]) -> str:
        return _all(self.conditions(spec))

    def conditions(self, spec: Mapping[str, Any]) -> list[_Test]:
        """The tests a condition set ANDs, cheapest first: they have no side effects, so
        their order changes only how soon a rule that fails is known to."""
        parts = []
        for key, value in spec.items():
            if key in ("all", "any"):
                options = [self.conditions(item) for item in value]
                if key == "all":
                    parts += [test for option in options for test in option]
                else:
                    cost = sum(test.cost for option in options for test in option)
                    parts.append(_Test(cost, "(" + " or ".join(map(_all, options)) + ")"))
            elif key == "not":
                inner = self.conditions(value)
                parts.append(_Test(sum(test.cost for test in inner), f"(not {_all(inner)})"))
            elif FIELDS[key] is Kind.HEADERS:
                parts += [self.header(key, header, test) for header, test in value.items()]
            else:
                tests = value.items() if isinstance(value, dict) else [("equals", value)]
                parts += [self.operator(key, FIELDS[key], op, operand) for op, operand in tests]
        return sorted(parts, key=lambda test: test.cost)

    def header(self, field: str, header: str, spec: Any) -> _Test:
        """`header: {Name: spec}` holds when one of the header's values satisfies spec,
        or when it has none and spec holds for a missing value."""
        op, operand = next(iter(spec.items())) if isinstance(spec, dict) else ("equals", spec)
        if (not isinstance(spec, dict) or len(spec) == 1) and op in ("equals", "in", "exists"):
            values, strs = self.header_values(field, header.lower())
            if op == "exists":
                return _Test(_CHEAP, f"(not not {values})" if operand else f"(not {values})")
            if op == "equals":
                return _Test(_CHEAP, f"({self.scalar(operand)} in {strs})")
            return _Test(_CHEAP, f"(not {self.members(operand)}.isdisjoint({strs}))")
        # Other tests, or several of one value: the interpreter's own predicate.
        name = self.constant(
            ("header", field, header.lower(), repr(spec)),
            lambda: header_test(field, header.lower(), value_test(Kind.TEXT, spec)),
        )
        return self.once(f"{name}(facts)")

    def operator(self, field: str, kind: Kind, op: str, operand: Any) -> _Test:
        v = self.local(field)
        if op == "exists":
            return _Test(_CHEAP, f"({v} is not MISSING)" if operand else f"({v} is MISSING)")
        if op in ("equals", "in", "notIn") or op in _COMPARISONS:
            typed = self.local(field, {Kind.NUMBER: "n", Kind.TEXT: "s"}.get(kind, "b"))
            if op == "equals":
                return _Test(_CHEAP, f"({typed} and {v} == {self.scalar(operand)})")
            if op in _COMPARISONS:
                return _Test(_CHEAP, f"({typed} and {v} {_COMPARISONS[op]} {self.scalar(operand)})")
            inside = f"({typed} and {v} in {self.members(operand)})"
            return _Test(_CHEAP, inside if op == "in" else f"(not {inside})")
        s = self.local(field, "s")
        if op in ("prefix", "suffix", "contains"):
            text = self.scalar(operand)
            test = {"prefix": f"{v}.startswith({text})", "suffix": f"{v}.endswith({text})",
                    "contains": f"{text} in {v}"}[op]  # fmt: skip
            return _Test(_TEXT, f"({s} and {test})")
        if op == "regex":
            pattern = self.constant(("regex", operand), lambda: re.compile(operand).fullmatch)
            return self.once(f"({s} and {pattern}({v}) is not None)")
        # any, all: list fields, over the set of their str items.
        items = self.local(field, "t")
        wanted = self.members(operand)
        if op == "any":
            return _Test(_CHEAP, f"({items} is not None and not {wanted}.isdisjoint({items}))")
        return _Test(_CHEAP, f"({items} is not None and {wanted} <= {items})")


def _all(tests: Sequence[_Test]) -> str:
    return "(" + " and ".join(test.expression for test in tests) + ")" if tests else "True"
