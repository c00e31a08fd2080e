"""A `Retry-Delay` expression evaluated as the service does: arithmetic over `retried`
(the retries made so far: 0 before the first retry) with the functions QStash names, in
milliseconds. Parsed with `ast` and walked here: nothing of Python but numbers, `retried`,
+ - * / and those functions is evaluated."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

_FUNCTIONS: dict[str, Callable[..., float]] = {
    "pow": pow,
    "sqrt": math.sqrt,
    "abs": abs,
    "exp": math.exp,
    "floor": math.floor,
    "ceil": math.ceil,
    "round": round,
    "min": min,
    "max": max,
}
_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def milliseconds(expression: str, retried: int) -> float | None:
    """The delay `expression` gives after `retried` retries; None when it is not one the
    service would take or cannot be computed (the caller keeps its own backoff then)."""
    try:
        return float(_value(ast.parse(expression.strip(), mode="eval").body, retried))
    except (SyntaxError, ValueError, TypeError, ArithmeticError, RecursionError):
        return None


def _value(node: ast.expr, retried: int) -> float:
    match node:
        case ast.Constant(value=int() | float() as number) if not isinstance(number, bool):
            return float(number)
        case ast.Name(id="retried"):
            return float(retried)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPERATORS:
            return _OPERATORS[type(op)](_value(left, retried), _value(right, retried))
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_value(operand, retried)
        case ast.Call(func=ast.Name(id=name), args=args, keywords=[]) if name in _FUNCTIONS:
            return float(_FUNCTIONS[name](*(_value(arg, retried) for arg in args)))
    raise ValueError(f"not a retry delay: {ast.unparse(node)}")
