"""The training stream's consumption record (``zerotir.data.stream.Consumption``) and the data module's use of it:
single prompts consumed out of order (the fleet's streaming takes prompt groups as they end, from several
batches), what a resumed run then generates, and the refusals that keep a prompt from training twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.test_datamodule import make_rows, module, tok, write_jsonl  # noqa: F401 (tok: a fixture)
from zerotir.data.stream import Consumption, PromptStream


def test_rows_consumed_out_of_order_make_a_batch_whole_once_all_its_rows_are_in():
    record = Consumption(prompts_per_step=3)
    record.mark_rows([(0, 0), (0, 2), (1, 1)])  # a step took two rows of batch 0 and one of batch 1
    assert record.whole == 0 and record.consumed(0) == {0, 2} and record.consumed(1) == {1}
    record.mark_rows([(1, 0), (1, 2)])  # batch 1 is complete, but batch 0 is not: whole stays
    assert record.whole == 0 and record.consumed(1) == {0, 1, 2}
    record.mark_rows([(2, 0), (0, 1)])  # batch 0 completes: batches 0 and 1 become whole
    assert record.whole == 2 and record.consumed(1) == {0, 1, 2} and record.consumed(2) == {0}
    assert record.state() == {"consumed": 2, "rows": {"2": [0]}}


def test_a_row_consumed_twice_or_outside_a_batch_is_refused():
    record = Consumption(prompts_per_step=2)
    record.mark_rows([(0, 1)])
    with pytest.raises(ValueError, match="row 1 of batch 0 was already consumed"):
        record.mark_rows([(0, 1)])
    record.mark_batch(0)
    with pytest.raises(ValueError, match="row 0 of batch 0 was already consumed"):
        record.mark_rows([(0, 0)])
    with pytest.raises(ValueError, match=r"row \(3, 2\) is outside a batch of 2 prompts"):
        record.mark_rows([(3, 2)])
    with pytest.raises(ValueError, match="already consumed"):
        record.mark_batch(0)


def test_a_whole_batch_drops_the_single_rows_recorded_before_it():
    record = Consumption(prompts_per_step=4)
    record.mark_rows([(0, 3), (2, 1)])
    record.mark_batch(0)  # the loader's batch 0 consumed whole (a step that took its own batch)
    assert record.whole == 1 and record.consumed(2) == {1} and record.state()["rows"] == {"2": [1]}


def test_state_round_trips_and_an_older_checkpoint_has_whole_batches_only():
    record = Consumption(prompts_per_step=3)
    record.mark_rows([(0, 0), (0, 1), (0, 2), (1, 2), (3, 0)])
    loaded = Consumption(prompts_per_step=3)
    loaded.load(record.state())
    assert loaded.whole == 1 and loaded.consumed(1) == {2} and loaded.consumed(3) == {0}
    loaded.load({"consumed": 5})
    assert loaded.whole == 5 and loaded.state()["rows"] == {}


def test_stream_rows_carry_their_batch_and_position():
    rows = [{"id": str(k), "prompt_ids": [k]} for k in range(5)]
    batch = PromptStream(rows, prompts_per_step=3, seed=0).batch(4)
    assert [(r["batch_index"], r["position"]) for r in batch] == [(4, 0), (4, 1), (4, 2)]


def test_the_datamodule_generates_only_unconsumed_rows_and_a_resumed_one_too(tmp_path: Path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(10))
    dm = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    dm.setup("fit")
    whole = [dm.train_batch(b) for b in range(3)]
    dm.mark_rows([(0, 0), (0, 2), (1, 1)])
    assert [r["id"] for r in dm.train_batch(0)] == [whole[0][1]["id"]]
    assert [r["position"] for r in dm.train_batch(1)] == [0, 2]
    assert dm.train_batch(2) == whole[2] and dm.consumed == 0

    resumed = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    resumed.load_state_dict(dm.state_dict())
    resumed.setup("fit")
    assert resumed.train_batch(0) == dm.train_batch(0) and resumed.train_batch(1) == dm.train_batch(1)
    # streaming: the batch read marks the step's place, whole
    assert next(resumed.train_batches("rows")) == whole[0]  # read from the first batch not whole
    with pytest.raises(ValueError, match="already consumed"):
        resumed.mark_rows([(1, 1)])


def test_marking_a_batch_keeps_the_rows_recorded_of_the_next_one(tmp_path: Path, tok):
    """A streaming run's record (batch 0 whole, rows of batches 1 and 2), resumed with streaming off: each step
    trains the rows ``train_batch`` leaves and marks its batch whole. Marking batch 1 must keep batch 2's recorded
    row, so no prompt trains twice and none is lost."""
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(12))
    streaming = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    streaming.setup("fit")
    streaming.mark_rows([(0, 0), (1, 2), (0, 1), (2, 1), (0, 2), (1, 0)])
    before = [streaming.train_batch(b) for b in range(3)]
    trained = [(0, p) for p in range(3)] + [(1, 0), (1, 2), (2, 1)]

    resumed = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    resumed.load_state_dict(streaming.state_dict())
    resumed.setup("fit")
    assert resumed.consumed == 1 and resumed.train_batch(1) == before[1]
    for index in (1, 2):  # the loader's batches 1 and 2, one step each
        trained += [(index, row["position"]) for row in resumed.train_batch(index)]
        resumed.mark_consumed(index)
        assert resumed.state_dict()["rows"] == ({"2": [1]} if index == 1 else {})
    assert sorted(trained) == [(b, p) for b in range(3) for p in range(3)]  # each row once


def test_marking_a_batch_folds_in_the_later_batches_whose_rows_were_all_consumed():
    """A streaming run's record: one row of batch 1 and all of batch 2. The step that takes batch 1 makes batch 2
    consumed too, or a resume would hand out batch 2 with nothing left in it; a record saved unfolded is folded."""
    record = Consumption(prompts_per_step=3)
    record.mark_rows([(1, 0), (2, 0), (2, 1), (2, 2)])
    record.mark_batch(1)
    assert record.whole == 3 and record.state() == {"consumed": 3, "rows": {}}
    loaded = Consumption(prompts_per_step=3)
    loaded.load({"consumed": 2, "rows": {"2": [0, 1, 2], "4": [1]}})
    assert loaded.whole == 3 and loaded.consumed(4) == {1}


def test_a_loader_whose_steps_train_its_batch_yields_only_the_rows_left_and_skips_a_batch_with_none(tmp_path, tok):
    """A streaming run's record (batch 0 whole, row 0 of batch 1, all of batch 2), resumed with streaming off: the
    steps train the loader's batches (the in-line source), so the loader yields the rest of batch 1, then batch 3;
    each row of batches 0-3 trains once. Streaming again, the loader yields batches 1, 2, 3 whole (step markers)."""
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(12))
    streaming = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    streaming.setup("fit")
    streaming.mark_rows([(0, 0), (1, 0), (0, 1), (2, 0), (2, 1), (2, 2), (0, 2)])
    assert streaming.state_dict()["rows"] == {"1": [0], "2": [0, 1, 2]}
    trained = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (2, 2)]

    resumed = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    resumed.load_state_dict(streaming.state_dict())
    resumed.setup("fit")
    loader = resumed.train_batches("batch")
    for _ in range(2):  # one step each, as the module: train the loader's batch, then mark it consumed
        batch = next(loader)
        trained += [(row["batch_index"], row["position"]) for row in batch]
        resumed.mark_consumed(batch[0]["batch_index"])
    assert sorted(trained) == [(b, p) for b in range(4) for p in range(3)]  # each row once
    assert resumed.consumed == 4 and resumed.state_dict()["rows"] == {}

    again = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    again.load_state_dict(streaming.state_dict())
    again.setup("fit")
    loader = again.train_batches("rows")
    assert [[(r["batch_index"], r["position"]) for r in next(loader)] for _ in range(3)] == [
        [(b, p) for p in range(3)] for b in (1, 2, 3)]


def test_steps_that_take_batches_generated_ahead_refuse_a_record_with_a_batch_to_skip(tmp_path, tok):
    """An engine host in batch shares generates the batches in order and cannot skip one all of whose rows a
    streaming run consumed: the loader refuses such a record when it starts, naming the settings that resume it; a
    record without one resumes, the loader's first batch holding the rows left (what the host generates)."""
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(12))
    streaming = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    streaming.setup("fit")
    streaming.mark_rows([(1, 0), (2, 0), (2, 1), (2, 2)])
    resumed = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    resumed.load_state_dict(streaming.state_dict())
    resumed.setup("fit")
    refused = r"batch\(es\) \[2\] consumed after batch 0.*max_in_flight > 0.*max_staleness: null"
    with pytest.raises(ValueError, match=refused):
        next(resumed.train_batches("ahead"))
    with pytest.raises(ValueError, match="steps_take\\('streaming'\\): one of 'batch', 'ahead', 'rows'"):
        next(resumed.train_batches("streaming"))
    resumed.load_state_dict({"consumed": 1, "rows": {"1": [0]}})
    first = next(resumed.train_batches("ahead"))
    assert first == resumed.train_batch(1) and [row["position"] for row in first] == [1, 2]
