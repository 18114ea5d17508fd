"""Records of trajectories, the files of a step, pruning, filters and the split of a response into blocks."""

from __future__ import annotations

import gzip

import pytest
import torch

from tests.callbacks.helpers import make_batch
from zerotir.rollout_log import records as R
from zerotir.types import ToolCall

CODE_RESPONSE = "Let me add.\n```python\nprint(3 + 4)\n```\n```output\n7\n```\n3 + 4 = \\boxed{7}"


def batch():
    traj = make_batch([1.0, 0.0, 0.0], [0, 0, 1], num_calls=[1, 0, 1], exec_errors=[0, 0, 1],
                      texts=[CODE_RESPONSE, "\\boxed{6}", "```python\n1/0\n```\n```output\nZeroDivisionError\n```\n"])
    traj.tool_calls = [[ToolCall("print(3 + 4)\n", "ok", "7")], [], [ToolCall("1/0\n", "error", "ZeroDivisionError")]]
    traj.ground_truths = ["7", "7", "2"]
    return traj


def test_a_record_per_trajectory_with_every_field():
    records = R.trajectory_records(batch(), ["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], ["toy", "toy"], step=3,
                                   weight_version=2)
    assert len(records) == 3
    first = records[0]
    assert first == {
        "step": 3, "split": "train", "rank": 0, "index": 0, "group": 0, "problem_id": "a", "source": "toy",
        "prompt": "Q: 3 + 4 = ?", "response": CODE_RESPONSE, "answer": "7", "reference": "7", "reward": 1.0,
        "correct": True, "calls": 1, "exec_errors": 0, "timeouts": 0, "sandbox_errors": 0, "tool_errors": 0,
        "finish_reason": "stop", "truncated": False, "response_tokens": 3, "sampled_tokens": 3,
        "tool_calls": [{"tool": "python", "code": "print(3 + 4)\n", "status": "ok", "output": "7"}],
        "weight_version": 2,
        "filtered_by": [],
    }
    assert records[1]["answer"] == "6" and not records[1]["correct"] and records[1]["tool_calls"] == []
    assert records[2]["problem_id"] == "b" and records[2]["answer"] is None
    with pytest.raises(ValueError, match="group id 1 has no prompt"):
        R.trajectory_records(batch(), ["only one"], ["a"], step=1)


def test_a_record_names_the_filters_that_removed_it():
    # Row 0 trained; row 1 removed by the pass-rate rule and matched by void_turn; row 2 removed by void_turn only.
    removed = {"pass_rate": torch.tensor([False, True, False]), "void_turn": torch.tensor([False, True, True])}
    records = R.trajectory_records(batch(), ["p0", "p1"], ["a", "b"], step=1, removed=removed)
    assert [r["filtered_by"] for r in records] == [[], ["pass_rate", "void_turn"], ["void_turn"]]


def test_files_are_named_per_split_and_rank_written_atomically_and_read_back(tmp_path):
    assert R.file_name("train", 12) == "step_12.jsonl.gz"
    assert R.file_name("val", 10) == "val_step_10.jsonl.gz"
    assert R.file_name("train", 3, rank=1, world_size=2) == "step_3.rank1.jsonl.gz"
    with pytest.raises(ValueError, match="split='dev'"):
        R.file_name("dev", 1)
    rows = [{"a": 1, "text": "ünï"}, {"a": 2, "text": "b"}]
    R.write_records(tmp_path / "step_2.rank0.jsonl.gz", rows[:1])
    R.write_records(tmp_path / "step_2.rank1.jsonl.gz", rows[1:])
    R.write_records(tmp_path / "val_step_2.jsonl.gz", rows)
    R.write_records(tmp_path / "step_10.jsonl.gz", rows)
    (tmp_path / "notes.txt").write_text("not a rollout file")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    with gzip.open(tmp_path / "step_10.jsonl.gz", "rt") as f:
        assert len(f.read().splitlines()) == 2
    assert {k: [p.name for p in v] for k, v in R.step_files(tmp_path).items()} == {
        2: ["step_2.rank0.jsonl.gz", "step_2.rank1.jsonl.gz"], 10: ["step_10.jsonl.gz"]}
    assert list(R.step_files(tmp_path, "val")) == [2] and R.step_files(tmp_path, "test") == {}
    assert R.read_step(tmp_path, 2) == rows  # both ranks, in rank order
    with pytest.raises(FileNotFoundError, match="no train rollouts of step 5"):
        R.read_step(tmp_path, 5)


def test_prune_keeps_the_latest_steps_of_one_split(tmp_path):
    for step in (1, 2, 3, 10):
        R.write_records(tmp_path / R.file_name("train", step), [{"s": step}])
    R.write_records(tmp_path / R.file_name("val", 1), [{"s": 1}])
    removed = R.prune(tmp_path, "train", keep_last=2)
    assert sorted(p.name for p in removed) == ["step_1.jsonl.gz", "step_2.jsonl.gz"]
    assert list(R.step_files(tmp_path)) == [3, 10] and list(R.step_files(tmp_path, "val")) == [1]
    with pytest.raises(ValueError, match="keep_last=0"):
        R.prune(tmp_path, "train", 0)


def test_filters_and_summary():
    records = R.trajectory_records(batch(), ["p0", "p1"], ["a", "b"], step=1)
    pick = {kind: [r["index"] for r in records if R.matches(r, kind)] for kind in R.FILTERS}
    assert pick == {"correct": [0], "wrong": [1, 2], "error": [2], "tool": [0, 2], "no-tool": [1]}
    with pytest.raises(ValueError, match="filter 'odd'"):
        R.matches(records[0], "odd")
    s = R.summary(records)
    # 1 of 3 correct, 2 of 3 used code, 2 calls of which 1 failed, every response 3 tokens
    assert s == {"trajectories": 3, "accuracy": 1 / 3, "tool_call_rate": 2 / 3, "calls_per_response": 2 / 3,
                 "failed_call_rate": 0.5, "response_tokens": 3.0, "truncated": 0.0}
    assert R.summary([]) == {"trajectories": 0}


def test_segments_split_text_code_and_output():
    assert R.segments(CODE_RESPONSE) == [("text", "Let me add.\n"), ("code", "print(3 + 4)"), ("output", "7"),
                                         ("text", "\n3 + 4 = \\boxed{7}")]
    assert R.segments("just text") == [("text", "just text")]
    # A block left open (a truncated response) runs to the end.
    assert R.segments("a\n```python\nwhile True:\n  pass") == [("text", "a\n"), ("code", "while True:\n  pass")]
    assert R.segments("") == []
