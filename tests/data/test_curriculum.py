"""``data.curriculum`` (``zerotir.data.curriculum``): stages switched by steps and by the rolling pass rate, the
adaptive weights worked by hand, the state round trip, and the settings refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.test_datamodule import module, tok, write_jsonl  # noqa: F401 (tok: a fixture)
from zerotir.data.curriculum import CurriculumConfig, Stage

KINDS = {"add": 6, "mul": 5, "mix": 4}  # kind -> rows of it


def kinds_file(path: Path) -> Path:
    rows = [{"id": f"{kind}-{i}", "problem": f"{kind} {i}", "answer": str(i), "kind": kind}
            for kind, n in KINDS.items() for i in range(n)]
    return write_jsonl(path, rows)


def data(tok, tmp_path, *stages: Stage, **options):  # noqa: F811 (tok: the fixture's value)
    config = CurriculumConfig(stages=list(stages), **options)
    dm = module(tok, train_files=[str(kinds_file(tmp_path / "kinds.jsonl"))], prompts_per_step=4, seed=3,
                curriculum=config)
    dm.setup("fit")
    return dm


def kinds_of(dm, batches: int) -> list[set[str]]:
    stream = dm.train_batches("batch")
    return [{row["kind"] for row in next(stream)} for _ in range(batches)]


def results(batch_index: int, **rates: tuple[int, int]) -> list[tuple[int, str, str, bool]]:
    """Outcomes of one batch: kind -> (correct, total)."""
    return [(batch_index, kind, "kinds", i < correct) for kind, (correct, total) in rates.items()
            for i in range(total)]


def test_stages_switch_after_their_steps(tok, tmp_path):  # noqa: F811
    dm = data(tok, tmp_path, Stage({"add": 1.0}, steps=2), Stage({"mul": 1.0, "mix": 1.0}, steps=1),
              Stage({"mix": 1.0}))
    kinds = kinds_of(dm, 5)
    assert kinds[:2] == [{"add"}, {"add"}] and kinds[2] <= {"mix", "mul"} and kinds[3:] == [{"mix"}, {"mix"}]
    # Batch 2 (stage 1) is drawn by weight: 4 rows of two kinds, each row a row of its kind.
    batch = dm.train_batch(2)
    assert [(r["batch_index"], r["position"]) for r in batch] == [(2, 0), (2, 1), (2, 2), (2, 3)]
    assert all(r["id"].startswith(r["kind"]) for r in batch)
    assert dm.train_batch(2) == batch and dm.train_batch(5) != dm.train_batch(6)  # rebuilt from the index alone


def test_a_stage_ends_when_its_rolling_pass_rate_reaches_the_threshold(tok, tmp_path):  # noqa: F811
    dm = data(tok, tmp_path, Stage({"add": 1.0}, pass_rate=0.5), Stage({"mul": 1.0}), window=2)
    stream = dm.train_batches("batch")
    assert {r["kind"] for r in next(stream)} == {"add"}
    dm.observe(results(0, add=(4, 4)))  # 1.0, but the window holds 1 batch of 2: no switch yet
    assert {r["kind"] for r in next(stream)} == {"add"}
    dm.observe(results(1, add=(0, 4)))  # rolling (4 + 0) / 8 = 0.5 >= 0.5: batch 2 starts stage 1
    assert dm.step_metrics() == {"data/stage": 0.0, "data/kind_share/add": 1.0, "data/kind_share/mul": 0.0,
                                 "data/pass_rate": 0.5}  # every stage's kinds: a curve through every step
    assert dm.state_dict()["curriculum"] == {"stage": 1, "start": 2, "results": [], "needs_results": True}
    assert [{r["kind"] for r in next(stream)} for _ in range(2)] == [{"mul"}, {"mul"}]


def test_the_switch_needs_a_full_window_at_the_threshold(tok, tmp_path):  # noqa: F811
    dm = data(tok, tmp_path, Stage({"add": 1.0}, pass_rate=0.75), Stage({"mul": 1.0}), window=2)
    dm.observe(results(0, add=(3, 4)))
    dm.observe(results(1, add=(2, 4)))  # (3 + 2) / 8 = 0.625 < 0.75
    dm.observe(results(2, add=(4, 4)))  # the window drops batch 0: (2 + 4) / 8 = 0.75
    metrics = dm.step_metrics()
    assert metrics["data/stage"] == 0.0 and metrics["data/kind_share/add"] == 1.0
    assert dm.state_dict()["curriculum"]["stage"] == 1 and dm.train_batch(3)[0]["kind"] == "mul"


def test_adaptive_weights_worked_by_hand(tok, tmp_path):  # noqa: F811
    dm = data(tok, tmp_path, Stage({"add": 1.0, "mul": 1.0, "mix": 2.0}), adaptive=True, floor=0.1, window=2)
    dm.observe(results(0, add=(3, 4), mul=(4, 4)))
    # add: p = 3/4, 1 * (1 - 0.75) = 0.25; mul: p = 1, 1 * max(0, 0.1) = 0.1 (the floor); mix: unseen, p = 0, 2 * 1
    # = 2. Normalized by 2.35.
    weights = dm._stream.weights(0)
    assert weights == pytest.approx({"add": 0.25 / 2.35, "mul": 0.1 / 2.35, "mix": 2 / 2.35})
    metrics = dm.step_metrics()
    assert metrics["data/pass_rate"] == pytest.approx(7 / 8) and metrics["data/kind_share/add"] == 0.5


def test_the_state_round_trips_and_a_resumed_stream_draws_the_same_batches(tok, tmp_path):  # noqa: F811
    stages = (Stage({"add": 1.0, "mul": 1.0}, pass_rate=0.9), Stage({"mix": 1.0, "add": 1.0}))
    first = data(tok, tmp_path, *stages, adaptive=True, window=3)
    stream = first.train_batches("batch")
    for b in range(2):
        next(stream)
        first.observe(results(b, add=(b, 2), mul=(2, 2)))
        first.mark_consumed(b)
    state = first.state_dict()
    resumed = data(tok, tmp_path, *stages, adaptive=True, window=3)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state and state["curriculum"]["results"][1] == {"add": [1, 2], "mul": [2, 2]}
    assert [r["id"] for r in next(resumed.train_batches("batch"))] == [r["id"] for r in next(stream)]
    fresh = data(tok, tmp_path, *stages, adaptive=True, window=3)
    fresh.load_state_dict({**state, "curriculum": {**state["curriculum"], "results": []}})
    assert fresh._stream.weights(0) != resumed._stream.weights(0)  # the window's results decide the weights


def test_a_resumed_window_holds_at_most_window_batches_and_switches_at_the_same_batch(tok, tmp_path):  # noqa: F811
    stages = (Stage({"add": 1.0}, pass_rate=0.75), Stage({"mul": 1.0}))
    first = data(tok, tmp_path, *stages, window=2)
    for b, correct in enumerate((4, 0)):
        first.observe(results(b, add=(correct, 4)))
    resumed = data(tok, tmp_path, *stages, window=2)
    resumed.load_state_dict(first.state_dict())
    # Batch 2: the window is batches 1 and 2, (0 + 4) / 8 = 0.5. Batch 3: batches 2 and 3, 8 / 8 = 1.0: the switch.
    for run in (first, resumed):
        run.observe(results(2, add=(4, 4)))
        assert len(run._stream.results) == 2 and run.state_dict()["curriculum"]["stage"] == 0
        run.observe(results(3, add=(4, 4)))
        assert run.state_dict()["curriculum"]["stage"] == 1 and run.train_batch(4)[0]["kind"] == "mul"


def test_a_stage_a_steps_rule_began_starts_with_an_empty_window(tok, tmp_path):  # noqa: F811
    dm = data(tok, tmp_path, Stage({"add": 1.0}, steps=2), Stage({"mul": 1.0}, pass_rate=0.5), Stage({"mix": 1.0}),
              window=2)
    dm.observe(results(0, add=(4, 4)))
    dm.observe(results(1, add=(4, 4)))
    dm.observe(results(2, mul=(4, 4)))  # stage 1's first batch: its window holds it alone, not stage 0's batch 1
    state = dm.state_dict()["curriculum"]
    assert (state["stage"], state["start"], state["results"]) == (1, 2, [{"mul": [4, 4]}])
    assert dm.train_batch(3)[0]["kind"] == "mul"  # one batch of a window of 2: no switch on it


def test_a_curriculum_cannot_resume_a_stream_without_one_nor_the_reverse(tok, tmp_path):  # noqa: F811
    plain = module(tok, train_files=[str(kinds_file(tmp_path / "kinds.jsonl"))], prompts_per_step=4, seed=3)
    plain.setup("fit")
    assert "curriculum" not in plain.state_dict()  # data.curriculum: null is today's stream and state
    with pytest.raises(ValueError, match="has no data.curriculum state but this run has one"):
        data(tok, tmp_path, Stage({"add": 1.0})).load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="has data.curriculum state but this run has none"):
        plain.load_state_dict(data(tok, tmp_path, Stage({"add": 1.0})).state_dict())
        plain.train_batches("batch").__next__()


@pytest.mark.parametrize("stages, options, error", [
    ([Stage({"div": 1.0})], {}, r"stages\[0\].weights names the kind 'div', which no training row carries"),
    ([Stage({"other.jsonl": 1.0})], {"by": "file"}, r"not an entry of data.train_files"),
    ([Stage({"add": 1.0}, pass_rate=0.0), Stage({"mul": 1.0})], {}, r"stages\[0\].pass_rate=0.0: a pass rate in"),
    ([Stage({"add": 1.0}, pass_rate=1.5), Stage({"mul": 1.0})], {}, r"stages\[0\].pass_rate=1.5"),
    ([Stage({"add": 1.0}, steps=1), Stage({"add": 0.0})], {}, r"stages\[1\].weights=.*a stage with no rows"),
    ([Stage({"add": 1.0}), Stage({"mul": 1.0})], {}, r"stages\[0\]: a stage before the last needs a switch rule"),
    ([Stage({"add": 1.0}, steps=2)], {}, r"stages\[0\]: the last stage never ends"),
    ([Stage({"add": 1.0})], {"floor": 0.0}, r"data.curriculum.floor=0.0"),
])
def test_bad_settings_name_the_field_and_the_fix(tok, tmp_path, stages, options, error):  # noqa: F811
    with pytest.raises(ValueError, match=error):
        data(tok, tmp_path, *stages, **options)


def test_file_stages_weight_the_train_files(tok, tmp_path):  # noqa: F811
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "o", "problem": "o", "answer": "1"}])
    kinds = str(kinds_file(tmp_path / "kinds.jsonl"))
    config = CurriculumConfig(stages=[Stage({str(other): 1.0}, steps=1), Stage({kinds: 1.0})], by="file")
    dm = module(tok, train_files=[kinds, str(other)], prompts_per_step=2, curriculum=config)
    assert [{r["source"] for r in dm.train_batch(b)} for b in (0, 1)] == [{"other"}, {"kinds"}]


def test_results_decide_batches_only_where_batches_are_drawn_in_line(tok, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=r"model.hosts.max_staleness: null.*or use steps rules alone"):
        data(tok, tmp_path, Stage({"add": 1.0}, pass_rate=0.5), Stage({"mul": 1.0})).check_steps_take("ahead")
    with pytest.raises(ValueError, match="adaptive: true"):
        data(tok, tmp_path, Stage({"add": 1.0}), adaptive=True).check_steps_take("rows")
    data(tok, tmp_path, Stage({"add": 1.0}, steps=1), Stage({"mul": 1.0})).check_steps_take("ahead")


def test_the_module_refuses_at_fit_start_a_curriculum_on_results_with_a_pipeline(tiny_dir, tok, tmp_path,  # noqa: F811
                                                                                 monkeypatch):
    """The wiring: ``ZeroTIRModule.on_fit_start`` asks the data module before the source (sandbox, engine) starts."""
    from types import SimpleNamespace

    from zerotir.config import BaseModelConfig, HostsConfig
    from zerotir.module import ZeroTIRModule

    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), hosts=HostsConfig(max_staleness=1))
    dm = data(tok, tmp_path, Stage({"add": 1.0}), adaptive=True)
    monkeypatch.setattr(module, "_trainer", SimpleNamespace(datamodule=dm), raising=False)
    monkeypatch.setattr(module, "_start_source", lambda: pytest.fail("the source started"))
    with pytest.raises(ValueError, match="adaptive: true decides each batch"):
        module.on_fit_start()
