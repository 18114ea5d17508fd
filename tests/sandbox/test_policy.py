"""The static check: pure function of the source and the policy."""

from __future__ import annotations

import pytest

from sandbox.config import DEFAULT_ALLOWED_IMPORTS, DEFAULT_REFUSED_CALLS
from sandbox.policy import SHOWN_REFUSALS, Policy

DEFAULT = Policy(DEFAULT_ALLOWED_IMPORTS, DEFAULT_REFUSED_CALLS)


@pytest.mark.parametrize("code", [
    "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.solve(x**2 - 4, x))",
    "from fractions import Fraction\nimport numpy as np\nimport math, itertools, collections",
    "from sympy.ntheory import factorint",
    "import sys\nsys.setrecursionlimit(10000)",
    "def f(n):\n    return n * 2\nprint(f(3))",
])
def test_default_policy_allows_math_snippets(code: str) -> None:
    assert DEFAULT.check_source(code) == []


def test_disallowed_import_is_refused_with_its_line_and_the_allowed_list() -> None:
    (refusal,) = DEFAULT.check_source("x = 1\nimport os.path")
    assert (refusal.line, refusal.kind) == (2, "ImportError")
    assert refusal.message == "import of module 'os' is not allowed in this sandbox."
    assert refusal.format() == f'  File "<snippet>", line 2\nImportError: {refusal.message}'
    report = DEFAULT.report(DEFAULT.check_source("x = 1\nimport os.path"))
    assert report.startswith(f"{refusal.format()} Allowed modules: ") and "sympy" in report


def test_a_refusal_flood_shows_the_first_few_a_count_and_the_allowed_list_once() -> None:
    refusals = DEFAULT.check_source("import " + ",".join(["a"] * 50_000) + "\nimport os")
    assert refusals.total == 50_001 and len(refusals) < 1000  # counted, not all kept
    report = DEFAULT.report(refusals)
    assert report.count("ImportError: import of module 'a'") == SHOWN_REFUSALS
    assert report.count("Allowed modules:") == 1
    assert report.endswith(f"... and {50_001 - SHOWN_REFUSALS} more refusals (50001 in all)\n")
    assert len(report) < 2000


def test_a_2000_term_sum_is_checked_without_recursion_error() -> None:
    assert DEFAULT.check_source("print(" + "+".join(["1"] * 2000) + ")") == []  # parses; compile then fails
    deep = "x = " + "+".join(["1"] * 2000) + "\nimport os"
    assert [r.line for r in DEFAULT.check_source(deep)] == [2]


def test_from_import_of_a_disallowed_module_is_refused() -> None:
    assert [r.line for r in DEFAULT.check_source("from subprocess import run")] == [1]


def test_relative_import_is_refused() -> None:
    (refusal,) = DEFAULT.check_source("from . import x")
    assert "relative imports are not available" in refusal.message


@pytest.mark.parametrize(("code", "name"), [
    ("eval('1+1')", "eval"),
    ("x = input()", "input"),
    ("__import__('os')", "__import__"),
])
def test_refused_builtin_calls(code: str, name: str) -> None:
    (refusal,) = DEFAULT.check_source(code)
    assert refusal.kind == "PermissionError"
    assert refusal.message.startswith(f"calling {name}() is not allowed in this sandbox")


def test_refused_call_is_found_through_an_import_alias() -> None:
    policy = Policy(["*"], ["os.system", "subprocess.run"])
    refusals = policy.check_source("import os as o\nfrom subprocess import run as r\no.system('ls')\nr(['ls'])")
    assert [(r.line, r.message) for r in refusals] == [(3, "calling os.system() is not allowed in this sandbox"),
                                                       (4, "calling subprocess.run() is not allowed in this sandbox")]


def test_star_allows_every_import() -> None:
    assert Policy(["*"], []).check_source("import os, socket, ctypes") == []


def test_every_refusal_is_reported_in_line_order() -> None:
    assert [r.line for r in DEFAULT.check_source("eval('1')\nimport os\nimport socket")] == [1, 2, 3]


def test_syntax_error_propagates_for_the_caller_to_report() -> None:
    with pytest.raises(SyntaxError):
        DEFAULT.check_source("x = (")
