"""The composition of the pass-rate rule and the other rules of ``model.filters`` into the step's decision."""

from __future__ import annotations

import pytest
from dataclasses import replace

import torch

from callbacks.scaling_metrics import filter_fractions
from tests.callbacks.helpers import make_batch, step_outputs
from zerotir import metric_names
from zerotir.config import FilterConfig, ToolConfig
import zerotir.filters.decide as decide_module
from zerotir.filters.decide import REMOVAL_NAMES, decide
from zerotir.filters.trajectory import FilterContext
from zerotir.rl.step import FilterDecision

CTX = FilterContext.of(ToolConfig(), max_response_tokens=16)
RAN = "```python\nprint(1+1)\n```\n```output\n2\n```\n"


def batch():
    # Group 0: row 0 ended with a void turn (wrong), row 1 correct and clean. Group 1: row 2 truncated (wrong, 16
    # tokens), row 3 correct, 14 tokens.
    return make_batch([0.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], num_calls=[1, 1, 0, 0], truncated=[False, False, True, False],
                      response_lens=[6, 8, 16, 14],
                      texts=[RAN + "hmm.", RAN + "\\boxed{2}", "\\boxed{3} and", "\\boxed{3}"])


@pytest.fixture
def pass_rate_gives(monkeypatch):
    """The pass-rate rule's decision set by hand (its own tests: tests/filters/test_pass_rate.py), and a
    ``model.filters`` with the rule on plus ``rules``."""
    def give(group: FilterDecision, **rules) -> FilterConfig:
        monkeypatch.setattr(decide_module, "pass_rate", lambda cfg, traj, counted=None: group)
        return FilterConfig(pass_rate=True, **rules)
    return give


def test_with_only_the_pass_rate_rule_the_decision_is_its_own(pass_rate_gives):
    group = FilterDecision(torch.tensor([True, True, False, False]), 1, 2)
    decision = decide(pass_rate_gives(group), batch(), CTX, step=1, seed=0)
    assert decision.keep.tolist() == group.keep.tolist() and (decision.kept_groups, decision.groups) == (1, 2)
    # the rows the pass rate dropped are recorded under its name (the rollout dump shows it)
    assert list(decision.removed) == ["infra_failed", "pass_rate"]  # the infrastructure rule is on by default
    assert decision.removed["pass_rate"].tolist() == [False, False, True, True]
    assert not decision.removed["infra_failed"].any()
    off = FilterConfig(infra_failed=False)
    assert decide(off, batch(), CTX, step=1, seed=0) is None  # every rule off: everything trains
    assert list(decide(replace(off, pass_rate=True, infra_failed=False), batch(), CTX, step=1, seed=0).removed) == \
        ["pass_rate"]


def test_the_pass_rate_rule_reads_the_rewards_of_each_group():
    # Group 0 (rewards 0, 1) passes [0.01, 0.99]; group 1 made all right (1, 1) does not.
    traj = batch()
    traj.rewards[2] = 1.0
    decision = decide(FilterConfig(pass_rate=True), traj, CTX, step=1, seed=0)
    assert decision.keep.tolist() == [True, True, False, False] and (decision.kept_groups, decision.groups) == (1, 2)


def test_the_rules_remove_rows_from_what_the_pass_rate_kept(pass_rate_gives):
    group = FilterDecision(torch.tensor([True, True, True, False]), 2, 2)  # the rule dropped row 3's group
    out = decide(pass_rate_gives(group, void_turn=True, overlong="mask"), batch(), CTX, step=1, seed=0)
    assert list(out.removed) == ["infra_failed", "pass_rate", "void_turn", "truncated"]  # in the order they apply
    assert out.removed["pass_rate"].tolist() == [False, False, False, True]
    assert out.removed["void_turn"].tolist() == [True, False, False, False]
    assert out.removed["truncated"].tolist() == [False, False, True, False]
    assert out.keep.tolist() == [False, True, False, False]  # kept by every rule
    assert (out.kept_groups, out.groups, out.skipped) == (2, 2, False)  # the pass-rate rule's group counts
    assert out.reward_shaping is None and out.perplexity_threshold is None


def test_a_skipped_pass_rate_decision_stays_skipped(pass_rate_gives):
    skipped = FilterDecision(torch.zeros(4, dtype=torch.bool), 0, 2, skipped=True)
    out = decide(pass_rate_gives(skipped, void_turn=True), batch(), CTX, step=1, seed=0)
    assert out.skipped and not out.keep.any() and out.removed["pass_rate"].all()


def test_without_the_pass_rate_rule_every_group_counts_as_kept():
    out = decide(FilterConfig(overlong="mask"), batch(), CTX, step=1, seed=0)
    assert "pass_rate" not in out.removed and out.keep.tolist() == [True, True, False, True]
    assert (out.kept_groups, out.groups) == (2, 2)


def test_the_soft_penalty_and_the_perplexity_threshold_travel_to_the_step():
    # Budget 16, buffer 4: 6 and 8 tokens are free, 14 -> -0.5, 16 -> -1. Nothing is removed by the penalty.
    cfg = FilterConfig(overlong="soft_penalty", overlong_buffer=4, perplexity=True, perplexity_threshold=3.0)
    out = decide(cfg, batch(), CTX, step=1, seed=0)
    assert out.reward_shaping.tolist() == [0.0, 0.0, -1.0, -0.5] and out.keep.all()
    assert out.perplexity_threshold == 3.0 and list(out.removed) == ["infra_failed"]
    assert not out.removed["infra_failed"].any()


def test_roc_downsamples_among_the_rows_still_kept():
    # Group 1 after the mask: row 3 only (correct, no call: penalty 0.5, not clean): ceil(0.5 x 1) = 1 kept.
    # Group 0: row 1 correct and clean (one call that ran, one answer): kept; row 0 wrong: kept.
    out = decide(FilterConfig(overlong="mask", roc=True), batch(), CTX, step=3, seed=0)
    assert out.removed["roc"].tolist() == [False] * 4 and out.keep.tolist() == [True, True, False, True]
    strict = decide(FilterConfig(overlong="mask", roc=True, roc_correct_keep=0.0), batch(), CTX, step=3, seed=0)
    assert strict.removed["roc"].tolist() == [False, False, False, True]  # share 0: only clean correct rows stay


def test_every_removal_has_its_metric():
    assert REMOVAL_NAMES == metric_names.FILTER_NAMES
    assert metric_names.FILTER_FRACTIONS["void_turn"] == "filter/void_turn_fraction"


def test_roc_ranks_and_counts_only_the_rows_the_other_rules_kept():
    # One group of four correct rows without a call (penalty 0.5 each: none clean). Rows 0 and 1 open with a void
    # turn (an output block before any text), so void_turn removes them; RoC ranks rows 2 and 3 only and keeps
    # ceil(0.5 x 2) = 1 of them. Ranking all four would keep 2 and drop 2. filter/roc_fraction: 1 row of 4.
    void = "```output\n2\n```\n\\boxed{2}"
    texts = [void, void, "\\boxed{2}", "\\boxed{2}"]
    traj = make_batch([1.0] * 4, [0] * 4, texts=texts)
    out = decide(FilterConfig(void_turn=True, roc=True), traj, CTX, step=1, seed=0)
    assert out.removed["void_turn"].tolist() == [True, True, False, False]
    assert out.removed["roc"][:2].tolist() == [False, False] and int(out.removed["roc"].sum()) == 1
    assert int(out.keep.sum()) == 1 and not (out.keep & out.removed["roc"]).any()
    result = step_outputs(traj, 1, out)["step"]
    assert filter_fractions(result)[metric_names.FILTER_FRACTIONS["roc"]] == 0.25
