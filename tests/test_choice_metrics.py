"""The tool-choice metrics (``zerotir.choice_metrics``): the first call per tool and per kind, accuracy per kind,
hand-worked; and a row's ``kind`` carried from the data file to the step's ``BatchInfo`` and its tags."""

import json

import pytest

from callbacks import ScalingMetrics
from tests.callbacks.helpers import FakeModule, FakeTrainer, make_batch, step_outputs
from zerotir import metric_names as mn
from zerotir.choice_metrics import choice_metrics, first_call
from zerotir.data.datamodule import batch_fields, load_rows
from zerotir.rl.step import BatchInfo
from zerotir.types import ToolCall


def _call(tool: str) -> ToolCall:
    return ToolCall("{}", "ok", "1", tool, 0.0)


def _batch():
    # Two prompts, two answers each: prompt 0 ("lookup"): search first and right, python first and wrong;
    # prompt 1 ("arith"): no call and wrong, an unparsed call then calculator, right.
    batch = make_batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], num_calls=[2, 1, 0, 2])
    batch.tool_calls = [[_call("search"), _call("calculator")], [_call("python")], [], [_call(""), _call("calculator")]]
    return batch


def test_first_call_labels():
    assert first_call([]) == mn.NO_CALL and first_call([_call("search"), _call("python")]) == "search"
    assert first_call([_call("")]) == mn.INVALID_TOOL
    # A misspelt tool name is recorded as written, with status invalid: one label, not a tag per spelling.
    assert first_call([ToolCall("{}", "invalid", "Error: there is no tool", "nalculator", 0.0)]) == mn.INVALID_TOOL


def test_choice_metrics_hand_worked():
    m = choice_metrics(_batch(), ["lookup", "arith"])
    assert {k: v for k, v in m.items() if k.endswith("/first")} == {
        "tools/search/first": 0.25, "tools/python/first": 0.25, "tools/none/first": 0.25, "tools/invalid/first": 0.25}
    assert m["kinds/lookup/first_search"] == 0.5 and m["kinds/lookup/first_python"] == 0.5
    assert m["kinds/arith/first_none"] == 0.5 and m["kinds/arith/first_invalid"] == 0.5
    assert "kinds/arith/first_calculator" not in m  # a label never first is not logged
    assert m["kinds/lookup/accuracy"] == 0.5 and m["kinds/arith/accuracy"] == 0.5
    assert m["kinds/lookup/calls_per_response"] == 1.5 and m["kinds/arith/calls_per_response"] == 1.0
    assert m["kinds/lookup/answers"] == 2.0
    # Correct answers: lookup's first (search, calculator: two tools); arith's last ("" is no tool: calculator only).
    assert m["kinds/lookup/two_tools_in_correct"] == 1.0 and m["kinds/arith/two_tools_in_correct"] == 0.0
    # Rows without a kind: the per-tool shares only.
    assert not [k for k in choice_metrics(_batch(), ["", ""]) if k.startswith("kinds/")]
    assert not [k for k in choice_metrics(_batch(), []) if k.startswith("kinds/")]
    with pytest.raises(ValueError, match="one per prompt row"):
        choice_metrics(_batch(), ["lookup"])


def test_two_tools_in_correct_counts_different_tools_only():
    # Four correct answers of one kind: calculator twice (one tool), search then calculator (two), a misspelt name
    # that reached no tool then calculator (one: status invalid is no tool), python then search (two) -> 2 of 4.
    misspelt = ToolCall("{}", "invalid", "Error: there is no tool named 'nalculator'", "nalculator", 0.0)
    batch = make_batch([1.0] * 4, [0, 0, 0, 0], num_calls=[2] * 4)
    batch.tool_calls = [[_call("calculator"), _call("calculator")], [_call("search"), _call("calculator")],
                        [misspelt, _call("calculator")], [_call("python"), _call("search")]]
    assert choice_metrics(batch, ["lookup"])["kinds/lookup/two_tools_in_correct"] == 0.5


def test_kind_goes_from_the_data_row_to_the_step_tags(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "code of kavemi", "answer": "482", "kind": "lookup"}) + "\n"
                    + json.dumps({"problem": "3 * 4", "answer": "12"}) + "\n")
    rows = [{**row, "prompt_text": row["problem"], "source": "rows"} for row in load_rows(str(path))]
    assert [r.get("kind") for r in rows] == ["lookup", None]
    info = BatchInfo(**batch_fields(rows))
    assert info.kinds == ["lookup", ""]
    trainer = FakeTrainer()
    outputs = step_outputs(_batch(), rl_step=3)
    outputs["step"].batch = info
    ScalingMetrics().on_train_batch_end(trainer, FakeModule(), outputs, None, 0)
    [(metrics, step)] = trainer.loggers[0].calls
    assert step == 3 and metrics["kinds/lookup/first_search"] == 0.5 and metrics["tools/none/first"] == 0.25
    assert not [k for k in metrics if k.startswith("kinds/") and "/lookup/" not in k]
