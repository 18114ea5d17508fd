"""The fleet model's parts against cases worked by hand, its dump reader and its command (``benchmarks.fleet_sim``,
``benchmarks.fleet_model``). Every case runs in milliseconds: a few steps of a few trajectories."""

import gzip
import json

import pytest

from benchmarks import fleet_measure, fleet_model
from benchmarks.fleet_sim import Fleet, PhaseCosts, Simulation, simulate

# a decode step of b trajectories: 0.01 + (b - 1) * 0.001 s; an update: 0.001 s a token on one device
COSTS = PhaseCosts(tokens_per_s_batch1=100.0, tokens_per_s_saturated=1000.0, update_s_per_token=0.001)


def fleet(mode, **kw):
    base = dict(mode=mode, engines=1, train_devices=1, prompts_per_step=2, samples_per_prompt=2, steps=6,
                warmup_steps=2)
    return Fleet(**{**base, **kw})


def test_in_line_one_engine_step_is_generation_plus_update():
    # 4 trajectories of 100 tokens: 100 decode steps of 0.013 s = 1.3 s; update 400 tokens x 0.001 = 0.4 s; other 0.1
    costs = PhaseCosts(100.0, 1000.0, 0.001, trainer_other_s=0.1)
    p = simulate(costs, fleet("inline"), [(100, 0)])
    assert p.steps_per_s == pytest.approx(1 / (1.3 + 0.1 + 0.4))
    assert p.staleness_max == 0
    assert p.engine_busy == pytest.approx(1.3 / 1.8)
    assert p.trainer_wait_s == pytest.approx(1.3 + 0.1)


def test_in_line_splits_the_batch_over_the_training_devices():
    # 2 devices: 2 trajectories each, 100 steps of 0.011 s = 1.1 s; update 400 x 0.001 / 2 = 0.2 s
    p = simulate(COSTS, fleet("inline", train_devices=2), [(100, 0)])
    assert p.steps_per_s == pytest.approx(1 / (1.1 + 0.2))


@pytest.mark.parametrize("update_s_per_token, step_s", [(0.001, 1.3), (0.01, 4.0)])
def test_batch_shares_at_s1_overlap_generation_and_update(update_s_per_token, step_s):
    # generation 1.3 s; update 0.4 s (generation bounds) or 4.0 s (the update bounds): max(gen, update) + push 0.05
    costs = PhaseCosts(100.0, 1000.0, update_s_per_token, push_s_per_gb=0.5, weights_gb=0.1)
    p = simulate(costs, fleet("shares", max_staleness=1), [(100, 0)])
    assert p.steps_per_s == pytest.approx(1 / (step_s + 0.05))
    assert p.staleness_mean == 1 and p.staleness_max == 1
    # the push queues behind the batch in flight, so the trainer's idle time is in its step, before the push, and
    # the batch is there when the push ends: no wait for rollouts
    assert p.trainer_wait_s == pytest.approx(0.0)


def test_decode_step_follows_the_batch_as_it_shrinks():
    # one group of 50 and 100 tokens: 50 steps of both (0.011 s) = 0.55 s, then 50 of the long one alone (0.01 s)
    one = fleet("inline", prompts_per_step=1, samples_per_prompt=2, steps=3, warmup_steps=1)
    p = Simulation(PhaseCosts(100.0, 1000.0, 0.0), one, [(50, 0), (100, 0)]).run()
    assert p.steps_per_s == pytest.approx(1 / (0.55 + 0.5))


def test_tool_call_waits_out_of_the_batch():
    # one trajectory of 100 tokens with one call: two segments of 50 decode steps of 0.01 s, a call of 0.5 s between
    costs = PhaseCosts(100.0, 1000.0, 0.0, tool_call_latency_s=0.5)
    p = simulate(costs, fleet("inline", prompts_per_step=1, samples_per_prompt=1), [(100, 1)])
    assert p.steps_per_s == pytest.approx(1 / (0.5 + 0.5 + 0.5))


def test_streaming_keeps_the_engine_full_when_the_trainer_keeps_up():
    # max_in_flight 8 = two batches of 4: every 100-token trajectory runs in a decode batch of 8 (0.017 s a step):
    # 8 end together every 1.7 s, two steps' worth; the update is free, the bound (S = 3) never binds
    costs = PhaseCosts(100.0, 1000.0, 0.0)
    p = simulate(costs, fleet("streaming", max_staleness=3, max_in_flight=8, steps=8), [(100, 0)])
    assert p.engine_fill == pytest.approx(1.0)
    assert p.steps_per_s == pytest.approx(2 / 1.7)


def test_streaming_fill_falls_to_what_the_bound_admits():
    # S = 0: batch j may start only after update j - 1 is pushed, so at most one batch (4) of max_in_flight 8 runs
    costs = PhaseCosts(100.0, 1000.0, 0.0)
    p = simulate(costs, fleet("streaming", max_staleness=0, max_in_flight=8), [(100, 0)])
    assert p.engine_fill == pytest.approx(0.5)
    assert p.steps_per_s == pytest.approx(1 / 1.3)


@pytest.mark.parametrize("mode", ["shares", "streaming"])
@pytest.mark.parametrize("S", [0, 1, 2])
def test_staleness_never_above_the_bound(mode, S):
    # a long tail (one trajectory in 8 is 20x longer) and a slow trainer: groups end out of order and late
    costs = PhaseCosts(100.0, 1000.0, 0.002, push_s_per_gb=1.0, weights_gb=0.2, tool_call_latency_s=0.3)
    tail = [(20, 0)] * 7 + [(400, 2)]
    p = simulate(costs, fleet(mode, max_staleness=S, prompts_per_step=4, steps=12, max_in_flight=12), tail, seed=3)
    assert p.staleness_max <= S
    if mode == "streaming" and S > 0:
        assert p.regenerated > 0  # the bound bit: groups that ended late were generated again


def test_settings_that_cannot_apply_are_errors(capsys):
    with pytest.raises(ValueError, match="mode='async'"):
        fleet("async")
    with pytest.raises(ValueError, match="max_in_flight=1"):
        fleet("streaming", max_in_flight=1)
    with pytest.raises(ValueError, match="max_staleness=-1"):
        fleet("shares", max_staleness=-1)
    with pytest.raises(ValueError, match="distribution is empty"):
        simulate(COSTS, fleet("inline"), [])
    for argv, field in ((["--gpus", "1"], "--gpus"), (["--calibrate", "--steps", "2"], "--steps"), ([], "nothing")):
        with pytest.raises(SystemExit):
            fleet_model.parse_args(argv)
        assert field in capsys.readouterr().err


def test_distribution_from_a_runs_dumps(tmp_path):
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    rows = [{"response_tokens": 30, "sampled_tokens": 30, "calls": 0},
            {"response_tokens": 250, "sampled_tokens": 200, "calls": 2}]  # 50 tokens of tool output, prefilled
    with gzip.open(rollouts / "step_1.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with gzip.open(rollouts / "val_step_1.jsonl.gz", "wt") as f:  # held-out rows are not the training workload
        f.write(json.dumps({"response_tokens": 999, "sampled_tokens": 999, "calls": 9}) + "\n")
    assert fleet_measure.distribution_from_dumps(tmp_path) == [(30, 0), (200, 2)]
    with pytest.raises(FileNotFoundError, match="no step_"):
        fleet_measure.distribution_from_dumps(tmp_path / "nothing")


def test_command_prints_calibration_and_plan(capsys):
    assert fleet_model.main(["--calibrate", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "| stream_s1 | steps_per_min |" in out and "| 8 |" in out and "assumption" in out
    assert f"Inputs read from {fleet_model.shown(fleet_model.MEASURED_FILE)}." in out  # where they came from


def test_no_warm_up_counts_the_cold_first_step():
    # shares, S = 1, update-bound (generation 1.3 s, update 4.0 s, push 0.05 s), every step counted: the first waits
    # for batch 0's generation with nothing ahead (1.3 s), then 3 x (4.0 + 0.05): 3 steps in 13.45 s
    costs = PhaseCosts(100.0, 1000.0, 0.01, push_s_per_gb=0.5, weights_gb=0.1)
    p = simulate(costs, fleet("shares", max_staleness=1, steps=3, warmup_steps=0), [(100, 0)])
    assert p.steps_per_s == pytest.approx(3 / 13.45)
    assert p.trainer_wait_s == pytest.approx(1.3 / 3)  # the first step's wait, over the 3 steps
def test_admission_is_paid_once_a_share_and_once_a_streamed_group():
    # in line: one admission (0.2 s) for the batch, then 100 steps at 4 trajectories (1.3 s)
    costs = PhaseCosts(100.0, 1000.0, 0.0, admission_s=0.2)
    assert simulate(costs, fleet("inline"), [(100, 0)]).steps_per_s == pytest.approx(1 / 1.5)
    # streaming, S = 0, max_in_flight one batch: its two groups admitted one after the other (0.4 s), then 1.3 s
    p = simulate(costs, fleet("streaming", max_staleness=0, max_in_flight=4), [(100, 0)])
    assert p.steps_per_s == pytest.approx(1 / 1.7)
