"""Result parsing (this server's and SandboxFusion's responses) and formatting for the model: pure functions."""

from __future__ import annotations

import pytest

from sandbox.result import (ExecResult, ExecStatus, format_for_model, parse_run_code_response, reduce_traceback,
                            shorten_source_lines, strip_server_paths, truncate_middle)


def response(status: str, run_status: str | None, return_code: int | None = 0, stdout: str = "", stderr: str = "",
             reason: str | None = None) -> dict:
    run = None if run_status is None else {"status": run_status, "execution_time": 0.5, "return_code": return_code,
                                           "stdout": stdout, "stderr": stderr}
    body = {"status": status, "message": "msg", "compile_result": None, "run_result": run}
    if reason is not None:
        body["details"] = {"reason": reason}
    return body


@pytest.mark.parametrize(("body", "expected"), [
    (response("Success", "Finished", 0, "2\n"), ExecStatus.OK),
    (response("Failed", "Finished", 1, stderr="Traceback...\nZeroDivisionError: x\n"), ExecStatus.ERROR),
    (response("Failed", "TimeLimitExceeded", None), ExecStatus.TIMEOUT),
    (response("Failed", "Finished", 1, stderr="Traceback...\nMemoryError\n"), ExecStatus.MEMORY),
    (response("Failed", "Finished", 1, stderr="numpy._core._exceptions._ArrayMemoryError: Unable to allocate\n"),
     ExecStatus.MEMORY),
    (response("Failed", "Finished", -11), ExecStatus.KILLED),
    (response("Failed", "Error", 1), ExecStatus.ERROR),
    (response("SandboxError", None), ExecStatus.SANDBOX_ERROR),
])
def test_sandboxfusion_responses_map_to_statuses(body: dict, expected: ExecStatus) -> None:
    assert parse_run_code_response(body, wall_time=0.7).status is expected


def test_success_that_writes_memoryerror_to_stderr_is_ok_not_memory() -> None:
    # The reproduction: SandboxFusion says Success (exit 0); the snippet merely printed that line itself.
    body = {"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": "fine\n",
                                                "stderr": "MemoryError\n"}}
    result = parse_run_code_response(body, 0.1)
    assert (result.status, result.stdout, result.stderr) == (ExecStatus.OK, "fine\n", "MemoryError\n")


def test_details_reason_of_this_server_wins_over_guessing() -> None:
    body = response("Failed", "Finished", 1, stderr="MemoryError\n", reason="error")
    assert parse_run_code_response(body, 0.7).status is ExecStatus.ERROR


def test_the_limits_a_snippet_hit_come_from_this_servers_details_and_none_from_sandboxfusion() -> None:
    body = response("Failed", "Finished", -9, reason="memory")
    body["details"]["limits_hit"] = ["memory", "pids"]
    assert parse_run_code_response(body, 0.7).limits_hit == ("memory", "pids")
    assert parse_run_code_response(response("Failed", "TimeLimitExceeded", None), 0.7).limits_hit == ()


def test_elapsed_is_the_sandbox_execution_time_and_wall_time_the_round_trip() -> None:
    result = parse_run_code_response(response("Success", "Finished", 0, "ok\n"), wall_time=0.7)
    assert (result.elapsed, result.wall_time, result.return_code, result.ok) == (0.5, 0.7, 0, True)


def test_sandbox_error_carries_the_message() -> None:
    result = parse_run_code_response(response("SandboxError", None), 0.1)
    assert (result.stderr, result.return_code) == ("msg", None)


def test_server_paths_are_removed() -> None:
    text = ('File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/sympy/core/numbers.py", line 3\n'
            'File "/usr/lib/python3.11/fractions.py", line 9\n'
            'File "/work/main/sandbox/child.py", line 4\n')
    assert strip_server_paths(text) == ('File "sympy/core/numbers.py", line 3\n'
                                        'File "fractions.py", line 9\n'
                                        'File "child.py", line 4\n')


TRACEBACK = """Traceback (most recent call last):
  File "<snippet>", line 2, in <module>
    helper()
  File "<snippet>", line 5, in helper
    sympy.solve(x, y, z, 1 / 0)
  File "sympy/solvers/solvers.py", line 900, in solve
    raise ValueError("bad")
  File "sympy/core/decorators.py", line 10, in wrapper
    return func(*args)
ZeroDivisionError: division by zero
"""


def test_traceback_keeps_last_snippet_frame_the_raising_frame_and_the_error() -> None:
    assert reduce_traceback(TRACEBACK) == (
        "Traceback (most recent call last):\n"
        '  File "<snippet>", line 5, in helper\n'
        "    sympy.solve(x, y, z, 1 / 0)\n"
        '  File "sympy/core/decorators.py", line 10, in wrapper\n'
        "    return func(*args)\n"
        "ZeroDivisionError: division by zero")


def test_chained_traceback_keeps_only_the_last_one() -> None:
    chained = TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n" + (
        'Traceback (most recent call last):\n  File "<snippet>", line 9, in <module>\n    raise KeyError(1)\n'
        "KeyError: 1\n")
    assert reduce_traceback(chained) == ('Traceback (most recent call last):\n  File "<snippet>", line 9, in '
                                         "<module>\n    raise KeyError(1)\nKeyError: 1")


def test_syntax_error_report_is_kept_as_is() -> None:
    report = '  File "<snippet>", line 1\n    x = (\n        ^\nSyntaxError: \'(\' was never closed\n'
    assert reduce_traceback(report) == report.rstrip("\n")


def test_truncate_middle_keeps_head_and_tail_within_the_budget() -> None:
    text = "a" * 600 + "b" * 600
    out = truncate_middle(text, 200)
    marker = "\n... [1200 characters in all, the middle omitted] ...\n"  # 54 characters
    assert len(marker) == 54 and len(out) == 200
    assert out == "a" * 73 + marker + "b" * 73  # (200 - 54) / 2 = 73 on each side
    assert truncate_middle("short", 200) == "short"


def test_format_ok_is_stdout() -> None:
    assert format_for_model(ExecResult(ExecStatus.OK, "42\n", "", 0.1, 0)) == "42"


def test_format_error_is_stdout_then_reduced_traceback() -> None:
    result = ExecResult(ExecStatus.ERROR, "partial\n", TRACEBACK, 0.1, 1)
    text = format_for_model(result)
    assert text.startswith("partial\nTraceback (most recent call last):\n")
    assert text.endswith("ZeroDivisionError: division by zero") and "solvers.py" not in text


@pytest.mark.parametrize(("status", "needle"), [
    (ExecStatus.TIMEOUT, "did not finish within the time limit"),
    (ExecStatus.MEMORY, "MemoryError: the code exceeded the memory limit"),
    (ExecStatus.SANDBOX_ERROR, "the code interpreter is unavailable"),
])
def test_format_gives_a_clear_message(status: ExecStatus, needle: str) -> None:
    text = format_for_model(ExecResult(status, "", "internal detail", 1.0, None))
    assert needle in text and "internal detail" not in text


def test_format_silent_nonzero_exit_names_the_code() -> None:
    assert format_for_model(ExecResult(ExecStatus.ERROR, "", "", 0.1, 3)) == "The code exited with code 3."


def test_format_killed_names_the_signal() -> None:
    text = format_for_model(ExecResult(ExecStatus.KILLED, "", "", 1.0, -9))
    assert text == "Killed: the process was terminated by signal 9."


def test_format_long_output_has_head_tail_and_marker() -> None:
    text = format_for_model(ExecResult(ExecStatus.OK, "\n".join(str(i) for i in range(2000)), "", 0.1, 0), 300)
    assert len(text) <= 300 and text.startswith("0\n1\n2\n") and text.endswith("1998\n1999")
    assert "the middle omitted" in text


def test_format_refuses_a_budget_too_small_for_the_marker() -> None:
    with pytest.raises(ValueError, match="max_chars must be >= 80"):
        format_for_model(ExecResult(ExecStatus.OK, "x", "", 0.1, 0), max_chars=10)


def test_a_long_source_line_is_cut_around_its_caret() -> None:
    line = "    " + "a" * 100 + "X" + "b" * 100  # X at column 104
    report = f'  File "<snippet>", line 2\n{line}\n' + " " * 104 + "^\nSyntaxError: invalid syntax"
    out = shorten_source_lines(report, max_line=40).split("\n")
    # Window: from column 104 - 20 = 84 to 84 + 36 = 120, with "..." on both cut sides; the caret follows the X.
    assert out[1] == "    ..." + "a" * 20 + "X" + "b" * 15 + "..."
    assert out[2] == " " * 27 + "^"
    assert out[1][out[2].index("^")] == "X"
    assert out[0] == '  File "<snippet>", line 2' and out[3] == "SyntaxError: invalid syntax"


def test_a_long_traceback_line_keeps_its_carets_under_the_failing_expression() -> None:
    code = 'print("' + "words " * 20 + '", a[1] + len("' + "more " * 20 + '"))'
    col = code.index("a[1]")
    report = ('Traceback (most recent call last):\n  File "<snippet>", line 2, in <module>\n    ' + code + "\n"
              + " " * (4 + col) + "~^^^\nIndexError: list index out of range")
    out = shorten_source_lines(report, max_line=60).split("\n")
    assert len(out) == 5 and len(out[2]) <= 60 + 6 and out[2].startswith("    ...") and out[2].endswith("...")
    caret = out[3].index("~")
    assert out[2][caret : caret + 4] == "a[1]" and out[3].strip() == "~^^^"


def test_short_reports_and_lines_without_carets() -> None:
    short = '  File "<snippet>", line 1\n    x = (\n        ^\nSyntaxError: \'(\' was never closed'
    assert shorten_source_lines(short) == short
    assert shorten_source_lines("    " + "z" * 300 + "\nNameError: x", max_line=40) == (
        "    " + "z" * 36 + "...\nNameError: x")


def test_format_cuts_long_source_lines_of_errors_but_not_stdout() -> None:
    printed = "1" * 300
    err = '  File "<snippet>", line 1\n    ' + "y" * 300 + "\n    ^\nSyntaxError: invalid syntax\n"
    text = format_for_model(ExecResult(ExecStatus.ERROR, printed + "\n", err, 0.0, 1), max_chars=4096)
    assert text.startswith(printed + "\n") and "    " + "y" * 116 + "...\n" in text and "y" * 117 not in text
