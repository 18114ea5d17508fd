"""Evaluation metrics with hand-worked numbers, and the report files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zerotir.eval.report import (
    NUM_PROBLEMS,
    SAMPLES_PER_PROBLEM,
    EvalRecord,
    K,
    average_row,
    benchmark_metrics,
    markdown_table,
    pass_at_k,
    records_from_trajectories,
    tensorboard_scalars,
    new_run_dir,
    write_report,
)
from zerotir.metric_names import (
    EVAL_ACCURACY,
    EVAL_CALLS_PER_RESPONSE,
    EVAL_PASS_AT_K,
    EVAL_RESPONSE_LENGTH,
    EVAL_SANDBOX_ERROR_RATE,
    EVAL_TOOL_CALL_RATE,
    EVAL_TRUNCATION_RATE,
    eval_tool_tag,
)
from zerotir.types import ToolCall, Trajectories


def recs(problem: str, correct: list[int], **per_sample: list) -> list[EvalRecord]:
    return [EvalRecord(problem, bool(c), **{key: values[i] for key, values in per_sample.items()})
            for i, c in enumerate(correct)]


def test_pass_at_k_hand_worked() -> None:
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)  # pass@1 = c / n
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 3, 2) == 1.0  # only one wrong sample: every pair holds a correct one
    assert pass_at_k(4, 0, 4) == 0.0
    for bad in ((4, 5, 1), (4, 1, 5), (4, 1, 0)):
        with pytest.raises(ValueError, match="pass_at_k needs"):
            pass_at_k(*bad)


def test_benchmark_metrics_hand_worked() -> None:
    # Three problems, four samples each: A 2/4 correct, B 0/4, C 4/4.
    records = (
        recs("A", [1, 0, 1, 0], num_calls=[0, 1, 2, 0], response_length=[10, 20, 30, 40],
             num_sandbox_errors=[0, 1, 0, 0], truncated=[False, False, False, True])
        + recs("B", [0, 0, 0, 0], num_calls=[1, 1, 0, 0], response_length=[50, 50, 50, 50])
        + recs("C", [1, 1, 1, 1], num_calls=[1, 0, 0, 0], response_length=[5, 5, 5, 5])
    )
    m = benchmark_metrics(records)
    # avg@4 = (2/4 + 0 + 4/4) / 3 = 0.5; pass@4: A 1, B 0, C 1 -> 2/3.
    assert m[EVAL_ACCURACY] == pytest.approx(0.5)
    assert m[EVAL_PASS_AT_K] == pytest.approx(2 / 3)
    assert m[K] == 4 and m[NUM_PROBLEMS] == 3 and m[SAMPLES_PER_PROBLEM] == 4
    # 5 of 12 responses called code; 6 calls in all; one sandbox failure per 6 executions.
    assert m[EVAL_TOOL_CALL_RATE] == pytest.approx(5 / 12)
    assert m[EVAL_CALLS_PER_RESPONSE] == pytest.approx(6 / 12)
    assert m[EVAL_SANDBOX_ERROR_RATE] == pytest.approx(1 / 6)
    # lengths: 100 + 200 + 20 = 320 over 12.
    assert m[EVAL_RESPONSE_LENGTH] == pytest.approx(320 / 12)
    assert m[EVAL_TRUNCATION_RATE] == pytest.approx(1 / 12)
    # pass@2: A 1 - C(2,2)/C(4,2) = 5/6, B 0, C 1 -> 11/18.
    assert benchmark_metrics(records, k=2)[EVAL_PASS_AT_K] == pytest.approx(11 / 18)


def test_uneven_samples_average_per_problem() -> None:
    # D 1/2 correct, E 1/4: avg@k = (0.5 + 0.25) / 2 = 0.375 (not the pooled 2/6).
    # Default k = 2 (the smallest count): D 1 - C(1,2)/C(2,2) = 1, E 1 - C(3,2)/C(4,2) = 0.5 -> 0.75.
    m = benchmark_metrics(recs("D", [1, 0]) + recs("E", [0, 1, 0, 0]))
    assert m[EVAL_ACCURACY] == pytest.approx(0.375)
    assert m[EVAL_PASS_AT_K] == pytest.approx(0.75)
    assert m[K] == 2 and m[SAMPLES_PER_PROBLEM] == 3
    assert m[EVAL_SANDBOX_ERROR_RATE] == 0.0  # no executions: rate 0, not a division error
    with pytest.raises(ValueError, match="k=3 but some problem has only 2 samples"):
        benchmark_metrics(recs("D", [1, 0]) + recs("E", [0, 1, 0, 0]), k=3)
    with pytest.raises(ValueError, match="no records"):
        benchmark_metrics([])


def test_records_from_trajectories() -> None:
    b = 3
    traj = Trajectories(
        input_ids=torch.zeros(b, 4, dtype=torch.long), attention_mask=torch.ones(b, 4, dtype=torch.long),
        action_mask=torch.zeros(b, 4, dtype=torch.bool), logprobs=torch.zeros(b, 4),
        prompt_lens=torch.tensor([1, 1, 1]), response_lens=torch.tensor([3, 2, 1]), group_ids=torch.tensor([0, 0, 1]),
        rewards=torch.tensor([1.0, 0.0, 1.0]), num_calls=torch.tensor([2, 0, 1]),
        num_exec_errors=torch.tensor([1, 0, 0]),
        num_timeouts=torch.tensor([0, 0, 1]), num_sandbox_errors=torch.tensor([0, 0, 1]),
        truncated=torch.tensor([False, True, False]),
    )
    got = records_from_trajectories(traj, ["p7", "p9"])
    assert got == [
        EvalRecord("p7", True, num_calls=2, response_length=3, num_exec_errors=1),
        EvalRecord("p7", False, num_calls=0, response_length=2, truncated=True),
        EvalRecord("p9", True, num_calls=1, response_length=1, num_sandbox_errors=1, num_timeouts=1),
    ]


RESULTS = {
    "math500": {EVAL_ACCURACY: 0.5, EVAL_PASS_AT_K: 0.75, EVAL_TOOL_CALL_RATE: 0.25, EVAL_CALLS_PER_RESPONSE: 0.5,
                EVAL_RESPONSE_LENGTH: 120.0, EVAL_SANDBOX_ERROR_RATE: 0.0, EVAL_TRUNCATION_RATE: 0.125,
                NUM_PROBLEMS: 3, SAMPLES_PER_PROBLEM: 4, K: 4},
    "aime24": {EVAL_ACCURACY: 0.1, EVAL_PASS_AT_K: 0.25, EVAL_TOOL_CALL_RATE: 0.75, EVAL_CALLS_PER_RESPONSE: 1.5,
               EVAL_RESPONSE_LENGTH: 300.0, EVAL_SANDBOX_ERROR_RATE: 0.5, EVAL_TRUNCATION_RATE: 0.375,
               NUM_PROBLEMS: 2, SAMPLES_PER_PROBLEM: 4, K: 4},
}


def test_tensorboard_scalars_and_average() -> None:
    tags = tensorboard_scalars(RESULTS)
    assert tags["math500/accuracy"] == 0.5 and tags["aime24/pass_at_k"] == 0.25
    assert "math500/num_problems" not in tags  # counts are not curves
    mean = average_row(RESULTS)
    assert mean[EVAL_ACCURACY] == pytest.approx(0.3) and mean[EVAL_RESPONSE_LENGTH] == pytest.approx(210.0)


def test_markdown_table() -> None:
    lines = markdown_table(RESULTS).splitlines()
    assert lines[0].startswith("| benchmark | problems | k | avg@k % | pass@k % |")
    assert lines[2] == "| math500 | 3 | 4 | 50.0 | 75.0 | 25.0 | 0.50 | 120 | 0.0 | 12.5 |"
    assert lines[3] == "| aime24 | 2 | 4 | 10.0 | 25.0 | 75.0 | 1.50 | 300 | 50.0 | 37.5 |"
    assert lines[4] == "| mean |  |  | 30.0 | 50.0 | 50.0 | 1.00 | 210 | 25.0 | 25.0 |"
    assert len(markdown_table({"math500": RESULTS["math500"]}).splitlines()) == 3  # no mean row for one benchmark


def test_write_report(tmp_path: Path) -> None:
    json_path, md_path = write_report(RESULTS, tmp_path / "out", meta={"model": "tiny", "n": 4})
    payload = json.loads(json_path.read_text())
    assert payload["benchmarks"] == RESULTS
    assert payload["mean"][EVAL_ACCURACY] == pytest.approx(0.3)
    assert payload["meta"] == {"model": "tiny", "n": 4}
    md = md_path.read_text()
    assert md.startswith("# Evaluation report\n") and "- model: tiny" in md
    assert "| math500 | 3 | 4 | 50.0 |" in md
    with pytest.raises(ValueError, match="no benchmark results"):
        write_report({}, tmp_path)


def test_new_run_dir_gives_each_run_a_folder_of_its_own(tmp_path):
    first = new_run_dir(tmp_path / "test", now=0.0)
    second = new_run_dir(tmp_path / "test", now=0.0)  # the same second: another folder, never the same one
    assert first.is_dir() and second.is_dir() and second.name == f"{first.name}-2"


def test_each_tool_gets_its_calls_per_response_in_the_metrics_the_table_and_the_mean() -> None:
    b = 3
    traj = Trajectories(
        input_ids=torch.zeros(b, 4, dtype=torch.long), attention_mask=torch.ones(b, 4, dtype=torch.long),
        action_mask=torch.zeros(b, 4, dtype=torch.bool), logprobs=torch.zeros(b, 4),
        prompt_lens=torch.ones(b, dtype=torch.long), response_lens=torch.ones(b, dtype=torch.long),
        group_ids=torch.tensor([0, 0, 1]), rewards=torch.tensor([1.0, 0.0, 1.0]), num_calls=torch.tensor([3, 0, 3]),
        num_exec_errors=torch.tensor([0, 0, 2]), num_timeouts=torch.zeros(b, dtype=torch.long),
        num_sandbox_errors=torch.zeros(b, dtype=torch.long), truncated=torch.zeros(b, dtype=torch.bool),
        tool_calls=[[ToolCall("1", "ok", "1"), ToolCall("2", "ok", "2"), ToolCall("{}", "ok", "4", "calculator")],
                    [], [ToolCall("{", "invalid", "Error", ""), ToolCall("2", "ok", "2"),
                         ToolCall('{"name": "pyton"}', "invalid", "Error: no tool", "pyton")]],
    )
    records = records_from_trajectories(traj, ["p1", "p2"])
    assert [r.tool_calls for r in records] == [{"python": 2, "calculator": 1}, {}, {"invalid": 2, "python": 1}]  # a misspelt name: no column
    # p1: 2 samples (1 correct), p2: 1 (correct); k = 1. 3 responses: python 3 calls, calculator 1, calls that reached
    # no tool 2 (unparsed, misspelt) -> 1.0, 1/3, 2/3 per response.
    math = benchmark_metrics(records)
    assert math[eval_tool_tag("python")] == 1.0 and math[eval_tool_tag("invalid")] == pytest.approx(2 / 3)
    assert math[eval_tool_tag("calculator")] == pytest.approx(1 / 3)
    # A second benchmark that only ran `search` (1 call in 2 responses): the others count 0 there.
    results = {"math": math, "facts": benchmark_metrics([EvalRecord("q", True, 1, tool_calls={"search": 1}),
                                                         EvalRecord("q", False)])}
    assert tensorboard_scalars(results)["facts/tool_calls_per_response/search"] == 0.5
    assert "math/tool_calls_per_response/search" not in tensorboard_scalars(results)
    mean = average_row(results)
    assert mean[eval_tool_tag("python")] == 0.5 and mean[eval_tool_tag("search")] == 0.25
    lines = markdown_table(results).splitlines()
    assert lines[0].startswith("| benchmark | problems | k | avg@k % | pass@k % | tool use % | calls / response | "
                               "calculator calls / response | invalid calls / response | python calls / response | "
                               "search calls / response | response tokens |")
    assert lines[2].startswith("| math | 2 | 1 | 75.0 | 75.0 | 66.7 | 2.00 | 0.33 | 0.67 | 1.00 | 0.00 |")
    assert lines[3].startswith("| facts | 1 | 2 | 50.0 | 100.0 | 50.0 | 0.50 | 0.00 | 0.00 | 0.00 | 0.50 |")
    # The mean: (0.75 + 0.5) / 2, (0.75 + 1) / 2, (2/3 + 1/2) / 2, (2 + 1/2) / 2, then each tool over both.
    assert lines[4].startswith("| mean |  |  | 62.5 | 87.5 | 58.3 | 1.25 | 0.17 | 0.33 | 0.50 | 0.25 |")
