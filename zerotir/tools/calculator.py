"""``calculator``: arithmetic evaluated on the syntax tree, no sandbox and no ``eval``.

The expression is parsed with ``ast`` (mode "eval") and walked over an allow-list: numbers, + - * / // % **, unary
+ -, parentheses, and a few functions of ``math`` (``FUNCTIONS``) and the constants pi and e. Anything else (names,
attributes, calls of other functions, subscripts, strings) is an error observation naming the part refused. Sizes
are bounded, so no call can take the process down: an exponent above ``max_exponent`` in absolute value, an integer
of more than ``max_digits`` digits and an expression longer than ``max_chars`` are refused.
"""

from __future__ import annotations

import ast
import math
import operator
import sys
from typing import Any

from zerotir.tools.base import STATUS_ERROR, Observation, Tool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp, "sin": math.sin, "cos": math.cos,
             "tan": math.tan, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
             "factorial": math.factorial, "gcd": math.gcd}
CONSTANTS = {"pi": math.pi, "e": math.e}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate (its message is what the model reads)."""


class CalculatorTool(Tool):
    """Evaluates one arithmetic expression (see the module doc).

    Args:
        max_exponent: the largest exponent of ``**`` in absolute value (and the largest argument of factorial).
        max_digits: the largest integer, in decimal digits, of any intermediate result; at most Python's limit on
            writing an integer as text (``sys.get_int_max_str_digits``, 4300 by default), or no answer could be read.
        max_chars: the longest expression accepted.
    """

    name = "calculator"
    description = ("Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, "
                   + ", ".join(FUNCTIONS) + ", pi, e.")
    parameters = {"type": "object",
                  "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2 ** 10"}},
                  "required": ["expression"], "additionalProperties": False}

    def __init__(self, max_exponent: int = 1000, max_digits: int = 4000, max_chars: int = 1000):
        for key, value in (("max_exponent", max_exponent), ("max_digits", max_digits), ("max_chars", max_chars)):
            if value < 1:
                raise ValueError(f"calculator init_args.{key}={value}: must be >= 1")
        limit = sys.get_int_max_str_digits()
        if limit and max_digits > limit:
            raise ValueError(f"calculator init_args.max_digits={max_digits}: above Python's limit of {limit} digits "
                             "on turning an integer into text (sys.set_int_max_str_digits); set it <= that")
        self.max_exponent, self.max_digits, self.max_chars = max_exponent, max_digits, max_chars
        self._bound = 10 ** max_digits  # the least integer with more than max_digits decimal digits

    async def call(self, arguments: dict[str, Any]) -> Observation:
        try:
            return Observation(repr_number(self.evaluate(arguments["expression"])))
        except CalculatorError as error:
            return Observation(f"Error: {error}", STATUS_ERROR)

    def evaluate(self, expression: str) -> int | float:
        """The value of ``expression``. Raises ``CalculatorError`` naming what is refused or failed."""
        if len(expression) > self.max_chars:
            raise CalculatorError(f"the expression has {len(expression)} characters, more than {self.max_chars}")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as error:
            raise CalculatorError(f"not an arithmetic expression ({error.msg})") from None
        try:
            return self._walk(tree.body)
        except (ArithmeticError, ValueError, TypeError) as error:
            if isinstance(error, CalculatorError):
                raise
            raise CalculatorError(f"{type(error).__name__}: {error}") from None

    def _walk(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._walk(node.left), self._walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > self.max_exponent:
                raise CalculatorError(f"the exponent {right} is above the limit of {self.max_exponent}")
            return self._bounded(_BINARY[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._walk(node.operand))
        if isinstance(node, ast.Name) and node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
                and not node.keywords):
            args = [self._walk(a) for a in node.args]
            if node.func.id == "factorial" and args and abs(args[0]) > self.max_exponent:
                raise CalculatorError(f"factorial of {args[0]} is above the limit of {self.max_exponent}")
            return self._bounded(FUNCTIONS[node.func.id](*args))
        raise CalculatorError(f"{ast.unparse(node)!r} is not allowed (numbers, + - * / // % **, parentheses, "
                              f"{', '.join(FUNCTIONS)}, pi, e)")

    def _bounded(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise CalculatorError("the result is a complex number")
        if isinstance(value, int) and abs(value) >= self._bound:  # decimal digits, counted exactly
            raise CalculatorError(f"an intermediate result has more than {self.max_digits} digits")
        return value


def repr_number(value: int | float) -> str:
    """``value`` as the model reads it: an integer in full, a float by ``repr`` (integral floats without ".0")."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)
