"""Dynamic sampling with refill, without Lightning: the cut of an overfilling round, the merge of rounds (group ids
renumbered, the batch size checked), the round bound, the warnings and the stop of ``FillWatch``, and the cut over
two gloo ranks (every rank the same rounds, the kept groups taken rank by rank)."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.gloo import gloo_group, run_ranks, save_rank
from tests.ports import free_port
from tests.rl.update_world import make_traj
from zerotir.config import FilterConfig, RefillConfig
from zerotir.filters.pass_rate import pass_rate
from zerotir.rl.guards import EmptyStepsError
from zerotir.rl.refill import BatchFill, FilledBatch, FillWatch, Round, first_kept_groups, rank_share

PASS_RATE = FilterConfig(pass_rate=True, pass_rate_low=0.2, pass_rate_high=0.8)  # n = 2: keeps 1 right of 2


def decide_round(traj):
    return pass_rate(PASS_RATE, traj)


def a_round(rewards: list[float], batch_index: int, n: int = 2) -> Round:
    """A round of len(rewards) / n prompt groups; its rows are named ``b<batch>-<group>``."""
    groups = [i // n for i in range(len(rewards))]
    traj = make_traj(rewards, groups, seed=batch_index)
    rows = [{"id": f"b{batch_index}-{g}"} for g in range(len(rewards) // n)]
    return Round(rows, traj, decide_round(traj), {"generation": 1.5})


def test_first_kept_groups_and_rank_share_by_hand():
    keep = torch.tensor([True, True, False, False, True, True])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert first_kept_groups(keep, groups, 1).tolist() == [True, True, False, False, False, False]
    assert first_kept_groups(keep, groups, 2).tolist() == keep.tolist()
    assert not first_kept_groups(keep, groups, 0).any()
    # counts [3, 2, 4], 4 wanted: rank 0 gives its 3, rank 1 the 1 left, rank 2 none
    assert [rank_share([3, 2, 4], r, 4) for r in range(3)] == [3, 1, 0]
    assert [rank_share([3, 2, 4], r, 9) for r in range(3)] == [3, 2, 4]


def test_half_uninformative_fills_the_batch_in_two_rounds_cut_to_the_target():
    # 4 prompts x 2 samples. Round 1 keeps groups 1 and 3 (one right of two); groups 0 (both right), 2 (both wrong)
    # go. Round 2 keeps groups 0, 1 and 2: one more than the 2 still needed, so its first two (0, 1) are kept and
    # become groups 4 and 5 of the merged batch.
    fill = BatchFill(target=4, max_rounds=3)
    assert not fill.add(a_round([1, 1, 1, 0, 0, 0, 0, 1], batch_index=7))
    assert fill.add(a_round([1, 0, 0, 1, 1, 0, 1, 1], batch_index=8))
    out = fill.result(pad_token_id=0)
    assert out.rounds == 2 and out.kept == 4 and not out.short
    assert out.trajectories.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    keep = out.decision.keep
    assert keep.nonzero().flatten().tolist() == [2, 3, 6, 7, 8, 9, 10, 11]  # groups 1, 3 | 4, 5
    assert int(keep.sum()) == 4 * 2  # the batch size: target x n trajectories
    assert (out.decision.kept_groups, out.decision.groups, out.decision.skipped) == (4, 8, False)
    assert [r["id"] for r in out.rows] == [f"b7-{g}" for g in range(4)] + [f"b8-{g}" for g in range(4)]
    assert out.timings == {"generation": 3.0}  # summed over the rounds


def test_none_informative_stops_at_the_round_bound_with_nothing_kept():
    fill = BatchFill(target=2, max_rounds=3)
    assert [fill.add(a_round([1, 1, 0, 0], batch_index=b)) for b in range(3)] == [False, False, True]
    out = fill.result(pad_token_id=0)
    assert out.rounds == 3 and out.kept == 0 and out.short
    assert len(out.trajectories) == 12 and not out.decision.keep.any()
    assert (out.decision.kept_groups, out.decision.groups, out.decision.skipped) == (0, 6, True)


def test_without_a_filter_one_round_is_the_batch():
    rnd = a_round([1, 1, 0, 0], batch_index=4)
    fill = BatchFill(target=2, max_rounds=5)
    assert fill.add(Round(rnd.rows, rnd.trajectories, None))
    out = fill.result(pad_token_id=0)
    assert out.decision is None and out.rounds == 1 and not out.short and out.trajectories is rnd.trajectories
    assert out.kept == 2  # without a filter every group trains


def filled(kept: int, target: int = 4, rounds: int = 1, rewards: tuple[float, float] = (1.0, 0.0)) -> FilledBatch:
    """A merged batch whose decision kept ``kept`` of ``target * rounds`` groups."""
    traj = make_traj(list(rewards), [0, 0])
    decision = decide_round(traj)
    decision.kept_groups, decision.groups = kept, target * rounds
    return FilledBatch([], traj, decision, kept, rounds, target)


def test_fill_watch_warns_counts_and_stops_after_max_empty_steps(caplog):
    watch = FillWatch(RefillConfig(max_rounds=1, max_empty_steps=3))
    with caplog.at_level(logging.WARNING, logger="zerotir.rl.refill"):
        assert watch.update(1, filled(0), skipped=True) == {
            "generation_rounds": 1.0, "prompts_consumed": 4.0, "empty_steps_in_a_row": 1.0}  # no refill: no count
        assert watch.update(2, filled(0), skipped=True)["empty_steps_in_a_row"] == 2.0
    assert len(caplog.records) == 2  # one warning per empty step, with the count and the fix
    assert "RL step 2: the filters kept no trajectory of the 4 prompt groups (1 generation round): no update, 2 " \
           "consecutive steps without one; the run stops at model.filters.refill.max_empty_steps=3" in caplog.messages[1]
    assert "model.filters.pass_rate_low / high" in caplog.messages[1]
    assert "scored 0" not in caplog.messages[1]  # a right response was there: the filters' business
    caplog.clear()
    assert watch.update(3, filled(3), skipped=False)["empty_steps_in_a_row"] == 0.0  # an update resets the count
    assert caplog.records == []  # without refill a step that kept 3 of 4 is the filter's normal work
    state = watch.state_dict()
    resumed = FillWatch(RefillConfig(max_rounds=1, max_empty_steps=3))
    resumed.load_state_dict({**state, "empty_in_a_row": 2})  # as after two empty steps and a checkpoint
    with pytest.raises(EmptyStepsError, match=r"RL step 9: 3 consecutive steps without an update \(model.filters.refill."
                                              r"max_empty_steps=3\).*kept no trajectory of the 4 prompt groups"):
        resumed.update(9, filled(0), skipped=True)


def test_an_empty_step_where_every_response_scored_0_points_at_the_reward_and_the_format(caplog):
    watch = FillWatch(RefillConfig(max_rounds=1, max_empty_steps=2), call_format="hermes")
    with caplog.at_level(logging.WARNING, logger="zerotir.rl.refill"):
        watch.update(1, filled(0, rewards=(0.0, 0.0)), skipped=True)
    assert ("Every response of the step scored 0: check the reward (model.reward) and that the model writes its calls "
            "in the configured format (model.tool.format=hermes)") in caplog.messages[0]
    with pytest.raises(EmptyStepsError, match=r"scored 0: check the reward .*model.tool.format=hermes"):
        watch.update(2, filled(0, rewards=(0.0, 0.0)), skipped=True)


def test_fill_watch_counts_steps_whose_refill_rounds_ran_out(caplog):
    watch = FillWatch(RefillConfig(max_rounds=3))
    with caplog.at_level(logging.WARNING, logger="zerotir.rl.refill"):
        full = watch.update(1, filled(4, rounds=2), skipped=False)
        short = watch.update(2, filled(3, rounds=3), skipped=False)
    assert full == {"generation_rounds": 2.0, "prompts_consumed": 8.0, "empty_steps_in_a_row": 0.0,
                    "exhausted_steps": 0.0}
    assert short["exhausted_steps"] == 1.0 and short["prompts_consumed"] == 12.0
    assert caplog.messages == ["RL step 2: 3 generation rounds (model.filters.refill.max_rounds=3) kept 3 of the 4 prompt "
                               "groups of a full batch (data.prompts_per_step); the step trains on 3 (1 short steps "
                               "so far)"]
    assert watch.state_dict() == {"empty_in_a_row": 0, "exhausted_steps": 1}


def _fill_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    """Each rank holds 2 of the step's 4 prompts (n = 2). Round 1 keeps 1 group on rank 0 and none on rank 1; round 2
    keeps 2 on rank 0 and 2 on rank 1: 4 for the 3 still needed, so rank 0 gives its 2 and rank 1 the first of its."""
    with gloo_group(rank, 2, port):
        rewards = {0: ([1, 0, 1, 1], [1, 0, 0, 1]), 1: ([0, 0, 1, 1], [0, 1, 1, 0])}[rank]
        fill = BatchFill(target=4, max_rounds=4)
        done = [fill.add(a_round(r, batch_index=b)) for b, r in enumerate(rewards)]
        out = fill.result(pad_token_id=0)
        save_rank({"done": done, "keep": out.decision.keep.tolist(), "kept": out.decision.kept_groups,
                   "groups": out.decision.groups}, out_dir, rank)


@pytest.mark.timeout(180)
def test_two_ranks_run_the_same_rounds_and_cut_the_overfill_rank_by_rank(tmp_path):
    ranks = run_ranks(_fill_on_two_ranks, (free_port(), str(tmp_path)), 2, tmp_path, timeout_s=150)
    assert ranks[0]["done"] == ranks[1]["done"] == [False, True]  # decided on the counts over both ranks
    assert ranks[0]["keep"] == [True, True, False, False, True, True, True, True]
    assert ranks[1]["keep"] == [False, False, False, False, True, True, False, False]
    assert all(r["kept"] == 4 and r["groups"] == 8 for r in ranks)
