"""The calculator tool: arithmetic on the syntax tree, an allow-list, bounded sizes (zerotir.tools.calculator)."""

from __future__ import annotations

import asyncio

import pytest

from zerotir.tools.calculator import CalculatorError, CalculatorTool

CALC = CalculatorTool(max_exponent=100, max_digits=50)


@pytest.mark.parametrize("expression, value", [
    ("(3 + 4) * 2 ** 10", 7168),
    ("7 / 2", 3.5), ("7 // 2", 3), ("-7 % 3", 2), ("-(2 ** 3)", -8),
    ("sqrt(16) + factorial(5)", 124.0), ("gcd(12, 18)", 6), ("round(pi, 3)", 3.142),
    ("1e3 + 0.5", 1000.5),
])
def test_arithmetic_values(expression, value):
    assert CALC.evaluate(expression) == value


@pytest.mark.parametrize("expression, says", [
    ("__import__('os').system('id')", "is not allowed"),  # a call of a name outside the allow-list
    ("x + 1", "'x' is not allowed"),
    ("(1).__class__", "is not allowed"),
    ("'a' * 3", "is not allowed"),
    ("[1, 2][0]", "is not allowed"),
    ("sqrt(x=4)", "is not allowed"),  # keywords are refused too
    ("2 ** 101", "exponent 101 is above the limit of 100"),
    ("10 ** 60", "more than 50 digits"),  # under the exponent cap, over the size cap
    ("factorial(1000)", "factorial of 1000 is above the limit"),
    ("1 / 0", "ZeroDivisionError"),
    ("sqrt(-1)", "ValueError: math domain error"),
    ("(-8) ** 0.5", "complex"),
    ("2 +", "not an arithmetic expression"),
])
def test_refusals_name_what_is_refused(expression, says):
    with pytest.raises(CalculatorError, match=None) as info:
        CALC.evaluate(expression)
    assert says in str(info.value)


def test_the_length_cap_and_the_observation():
    with pytest.raises(CalculatorError, match="characters, more than 10"):
        CalculatorTool(max_chars=10).evaluate("1 + 1 + 1 + 1")
    assert asyncio.run(CALC.call({"expression": "6 * 7"})).text == "42"
    assert asyncio.run(CALC.call({"expression": "2.0 * 3"})).text == "6"  # an integral float reads as an integer
    bad = asyncio.run(CALC.call({"expression": "1/0"}))
    assert bad.status == "error" and bad.text.startswith("Error: ZeroDivisionError")
    with pytest.raises(ValueError, match="calculator init_args.max_exponent=0"):
        CalculatorTool(max_exponent=0)


def test_the_digit_cap_counts_decimal_digits():
    calc = CalculatorTool()  # the defaults: max_exponent 1000, max_digits 4000
    answer = asyncio.run(calc.call({"expression": "factorial(800)"}))  # 1977 digits: well under the cap
    assert answer.status == "ok" and len(answer.text) == 1977
    assert len(str(calc.evaluate("10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 999 * 9"))) == 4000  # at the cap
    refused = asyncio.run(calc.call({"expression": "10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000"}))
    assert refused.status == "error" and "more than 4000 digits" in refused.text  # 4001 digits: past it
    with pytest.raises(CalculatorError, match="more than 3 digits"):
        CalculatorTool(max_digits=3).evaluate("999 + 1")
    with pytest.raises(ValueError, match="init_args.max_digits=5000: above Python's limit of 4300"):
        CalculatorTool(max_digits=5000)  # its answers could not be written as text
