"""Samples as Markdown (TensorBoard), the pick of samples, and ``python -m zerotir rollouts`` in a terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tests.rollout_log.test_records import batch
from zerotir.__main__ import main as zerotir_main
from zerotir.rollout_log import records as R
from zerotir.rollout_log.cli import RolloutsInputError, show
from zerotir.rollout_log.render import markdown_sample, pick_samples, summary_line
from zerotir.types import ToolCall


def records(step=1):
    return R.trajectory_records(batch(), ["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], step=step)


def test_pick_best_worst_and_a_failed_execution():
    rs = records()
    picked = pick_samples(rs)
    # rewards 1, 0, 0 (all 3 tokens long): best is row 0, worst the first lowest (row 1), row 2's call failed
    assert {kind: r["index"] for kind, r in picked.items()} == {"best": 0, "worst": 1, "exec_error": 2}
    assert set(pick_samples(rs[:1])) == {"best"} and pick_samples([]) == {}


def test_markdown_sample_shows_code_and_output_blocks():
    text = markdown_sample(records()[2], "exec_error, step 1")
    assert text.startswith("**exec_error, step 1** | reward 0 (wrong) | 1 call(s) (python 1), 1 failed | finish "
                           "stop")
    assert "```python\n1/0\n```" in text and "*python output (error)*\n\n```text\nZeroDivisionError\n```" in text
    assert "```text\nQ: 1 + 1 = ?\n```" in text and "reference `2`" in text
    best = markdown_sample(records()[0])
    assert "3 + 4 = \\\\boxed\\{7}" not in best and "3 + 4 = \\\\boxed{7}" in best  # backslash escaped for Markdown
    assert "Let me add." in best and "*python output (ok)*" in best


def test_the_headline_names_the_filters_that_removed_a_trajectory():
    record = dict(records()[1], filtered_by=["pass_rate", "void_turn"])
    assert markdown_sample(record).startswith("reward 0 (wrong) | 0 call(s), 0 failed | finish stop | 3 tokens | "
                                              "filtered by pass_rate, void_turn")
    old = {k: v for k, v in records()[1].items() if k != "filtered_by"}  # a dump written before the filters
    assert "filtered by" not in markdown_sample(old)


def test_each_call_is_shown_with_its_tool_and_a_failed_tool_counts_as_failed(tmp_path):
    traj = batch()
    traj.tool_calls[0] = [ToolCall('{"expression": "3+4"}', "ok", "7", "calculator"),
                          ToolCall("{", "invalid", "Error: not JSON", ""), ToolCall("{}", "tool_error", "down", "add")]
    traj.num_calls[0], traj.num_tool_errors[0] = 3, 1
    record = R.trajectory_records(traj, ["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], step=1)[0]
    assert [(c["tool"], c["status"]) for c in record["tool_calls"]] == [
        ("calculator", "ok"), ("", "invalid"), ("add", "tool_error")]
    assert record["tool_errors"] == 1 and record["sandbox_errors"] == 0
    # The invalid call and the tool's failure are failed calls; the one output block is the calculator's.
    md = markdown_sample(record)
    assert md.startswith("reward 1 (correct) | 3 call(s) (calculator 1, no tool 1, add 1), 2 failed | finish stop")
    assert "*calculator output (ok)*" in md and R.matches(record, "error")
    R.write_records(tmp_path / "rollouts" / R.file_name("train", 1), [record])
    out = io.StringIO()
    show(tmp_path, console=Console(file=out, width=120, color_system=None))
    assert "3 call(s) (calculator 1, no tool 1, add 1), 2 failed" in out.getvalue()
    assert "calculator output (ok)" in out.getvalue()


def test_a_dump_written_before_calls_named_their_tool_shows_them_as_python():
    record = records()[2]
    old = dict(record, tool_calls=[{k: v for k, v in c.items() if k != "tool"} for c in record["tool_calls"]])
    text = markdown_sample(old)
    assert "| 1 call(s) (python 1), 1 failed |" in text and "*python output (error)*" in text


def test_summary_line():
    assert summary_line(4, records()) == ("step 4 | 3 trajectories | accuracy 0.33 | tool calls 0.67 | calls/response "
                                          "0.67 | failed calls 0.50 | 3.0 tokens | truncated 0.00")


def test_terminal_view_prints_summaries_and_filters_one_step(tmp_path):
    folder = tmp_path / "rollouts"
    for step in (1, 2):
        R.write_records(folder / R.file_name("train", step), records(step))

    def view(**kwargs):
        out = io.StringIO()
        shown = show(tmp_path, console=Console(file=out, width=100, color_system=None), **kwargs)
        return shown, out.getvalue()

    shown, text = view()
    assert shown == 3 and "step 1 | 3 trajectories" in text and "step 2 | 3 trajectories" in text
    assert "step 2: 3 of 3 trajectories, showing 3" in text and "print(3 + 4)" in text
    assert "python output (error)" in text
    shown, text = view(step=1, filters=["error"])
    assert shown == 1 and "step 1: 1 of 3 trajectories matching error" in text and "1/0" in text
    assert "print(3 + 4)" not in text
    shown, text = view(filters=["wrong", "no-tool"], limit=5)
    assert shown == 1 and "answer 6" in text
    assert view(filters=["correct"], limit=0)[0] == 0
    with pytest.raises(RolloutsInputError, match=r"--step 7: no train rollouts .* \(on disk: 1, 2\)"):
        view(step=7)
    with pytest.raises(RolloutsInputError, match="no val rollouts"):
        view(split="val")
    with pytest.raises(RolloutsInputError, match="no rollout files"):
        show(tmp_path / "elsewhere")


def test_the_command_line(tmp_path, capsys):
    R.write_records(tmp_path / "rollouts" / R.file_name("train", 3), records(3))
    with pytest.raises(SystemExit) as code:
        zerotir_main(["rollouts", str(tmp_path), "--filter", "correct", "--width", "90"])
    assert code.value.code == 0
    out = capsys.readouterr().out
    assert "step 3 | 3 trajectories" in out and "1 of 3 trajectories matching correct" in out
    with pytest.raises(SystemExit) as code:
        zerotir_main(["rollouts", str(tmp_path), "--step", "9"])
    assert code.value.code == 2 and "--step 9" in capsys.readouterr().err


def test_a_filter_without_a_match_at_the_step_names_the_steps_with_one(tmp_path):
    folder = tmp_path / "rollouts"
    R.write_records(folder / R.file_name("train", 1), records(1))  # row 2's call failed: an "error" match
    R.write_records(folder / R.file_name("train", 2), [r for r in records(2) if not R.matches(r, "error")])
    out = io.StringIO()
    assert show(tmp_path, filters=["error"], console=Console(file=out, width=100, color_system=None)) == 0
    assert "step 2: 0 of 2 trajectories matching error" in out.getvalue()
    assert "matching error: steps 1 (--step 1)" in out.getvalue()
    out = io.StringIO()
    show(tmp_path, step=1, filters=["correct", "error"], console=Console(file=out, width=100, color_system=None))
    assert "matching correct + error: no other step either" in out.getvalue()


def test_the_command_exits_without_importing_lightning_or_torch(tmp_path):
    """Its exit compared the exception types of the error report and imported Lightning and torch to do it (tens
    of seconds under load after the output); nothing of the command needs them."""
    import subprocess
    import sys
    from pathlib import Path

    R.write_records(tmp_path / "rollouts" / R.file_name("train", 1), records(1))
    code = ("import sys\nfrom zerotir.__main__ import main\ntry:\n    main(['rollouts', sys.argv[1]])\n"
            "except SystemExit as done:\n    print('exit', done.code, sorted(m for m in ('lightning', 'torch') "
            "if m in sys.modules))\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=repo, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines()[-1] == "exit 0 []", done.stderr[-2000:]
