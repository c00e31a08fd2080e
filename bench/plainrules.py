"""The baseline of bench.rules: a ruleset's conditions as one plain Python function.

The function is what one would write by hand for a given rules file, and about the best a
rule engine that compiles to Python could do: every field the rules test is read once into
a local, then one `if` per rule over an `and` chain of comparisons, set lookups, str
methods and pattern matches, returning the index of the first rule that holds.

It follows recoveryd's semantics (PRODUCT.md 4.2) for messages as the service sends them,
but skips the type tests recoveryd makes so that `true` never equals `1`: a value of an
unexpected type may get another answer, or raise. A missing number reads as NaN and a
missing text as "" (facts() never holds ""), so that both satisfy no comparison.
bench.rules checks that it decides like recoveryd on every message it times.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from daemon.rules import FIELDS, Kind

Decide = Callable[[Mapping[str, Any]], "int | None"]

_MISSING = {
    Kind.TEXT: '""',
    Kind.NUMBER: "NAN",
    Kind.BOOLEAN: "None",
    Kind.LIST: "()",
    Kind.HEADERS: "NO_HEADERS",
}
_NOT_WORD = re.compile(r"\W")
_TEMPLATES = {
    "equals": "{v} == {x}",
    "prefix": "{v}.startswith({x})",
    "suffix": "{v}.endswith({x})",
    "contains": "{x} in {v}",
    "gt": "{v} > {x}",
    "gte": "{v} >= {x}",
    "lt": "{v} < {x}",
    "lte": "{v} <= {x}",
}


def compile_plain(matches: Sequence[Any]) -> tuple[Decide, str]:
    """The function that picks the first of these `match` specs to hold for a message's
    facts (rules with `continue` are not supported), and its source."""
    writer = _Writer()
    tests = [writer.match(spec) for spec in matches]
    lines = ["def decide(f):"]
    lines += [f"    {name} = f.get({name!r}, {_MISSING[FIELDS[name]]})" for name in writer.fields]
    for (field, key), values in writer.headers.items():
        lines += [
            f"    {values} = {field}.get({key!r}, ())",
            f"    {values}_one = {values}[0] if len({values}) == 1 else None",
        ]
    for index, test in enumerate(tests):
        lines += [f"    if {test}:", f"        return {index}"]
    lines.append("    return None")
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = {"NAN": math.nan, "NO_HEADERS": {}, **writer.constants}
    exec(compile(source, "<plain rules>", "exec"), namespace)
    return namespace["decide"], source


class _Writer:
    def __init__(self) -> None:
        self.fields: dict[str, None] = {}  # the fields read into locals, in order
        self.headers: dict[tuple[str, str], str] = {}  # (field, header) -> local of its values
        self.constants: dict[str, Any] = {}  # compiled patterns and sets, by name

    def constant(self, value: Any) -> str:
        name = f"C{len(self.constants)}"
        self.constants[name] = value
        return name

    def match(self, spec: Mapping[str, Any]) -> str:
        return " and ".join(self.entry(key, value) for key, value in spec.items()) or "True"

    def entry(self, key: str, spec: Any) -> str:
        if key in ("all", "any"):
            joined = f" {'and' if key == 'all' else 'or'} ".join(
                f"({self.match(item)})" for item in spec
            )
            return f"({joined})"
        if key == "not":
            return f"not ({self.match(spec)})"
        self.fields[key] = None
        if FIELDS[key] is Kind.HEADERS:
            return " and ".join(self.header(key, name, cond) for name, cond in spec.items())
        ops = spec if isinstance(spec, dict) else {"equals": spec}
        return " and ".join(self.test(op, operand, key, FIELDS[key]) for op, operand in ops.items())

    def header(self, field: str, name: str, spec: Any) -> str:
        """True when any value of the header satisfies every operator (as recoveryd). Most
        headers have one value: that one is tested directly, as one would by hand, the
        others through any() over a generator, which costs ten times as much."""
        key = name.lower()
        ops = spec if isinstance(spec, dict) else {"equals": spec}
        if "exists" in ops:
            if len(ops) > 1:
                raise ValueError(
                    f"the baseline does not combine exists with other operators: {ops}"
                )
            return f"{key!r} {'in' if ops['exists'] else 'not in'} {field}"
        values = self.headers.get((field, key)) or self.header_local(field, key)
        one = f"{values}_one"
        tests = [
            (self.test(op, x, one, Kind.TEXT), self.test(op, x, "v", Kind.TEXT))
            for op, x in ops.items()
        ]
        found = f"any({' and '.join(test for _, test in tests)} for v in {values})"
        # A missing header satisfies notIn, as a missing field does.
        others = f"(not {values} or {found})" if set(ops) == {"notIn"} else f"{values} and {found}"
        return f"({' and '.join(test for test, _ in tests)} if {one} is not None else {others})"

    def header_local(self, field: str, key: str) -> str:
        """A new local for the values of a header, named after it."""
        name = f"{field}_{_NOT_WORD.sub('_', key)}"
        if name in self.headers.values():
            name += f"_{len(self.headers)}"
        self.headers[field, key] = name
        return name

    def test(self, op: str, operand: Any, value: str, kind: Kind) -> str:
        """The test of one operator on `value`, a field's local (named as the field) or a
        header value `v`."""
        if op == "exists":
            return f"{value!r} {'in' if operand else 'not in'} f"
        if op == "equals" and kind is Kind.BOOLEAN:
            return f"{value} is {operand!r}"
        if op in ("in", "notIn"):
            literal = "{" + ", ".join(map(repr, operand)) + "}"  # a constant frozenset
            return f"{value} {'in' if op == 'in' else 'not in'} {literal}"
        if op == "regex":
            return f"{self.constant(re.compile(operand))}.fullmatch({value}) is not None"
        if op == "any":
            return f"not {self.constant(frozenset(operand))}.isdisjoint({value})"
        if op == "all":
            return f"{self.constant(frozenset(operand))}.issubset({value})"
        return _TEMPLATES[op].format(v=value, x=repr(operand))
