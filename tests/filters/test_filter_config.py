"""``model.filters``: its checks name the field and the fix, and so do its checks against the other groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerotir.cli.app import ZeroTIRCLI
from zerotir.config import FilterConfig, RLConfig, SamplingConfig, ToolConfig


def test_everything_but_the_infrastructure_rule_is_off_by_default():
    cfg = FilterConfig()
    assert cfg.infra_failed and cfg.row_rules  # infrastructure failures never train as wrong answers
    assert not cfg.pass_rate and cfg.trajectory_rules == () and cfg.overlong == "none"
    assert not FilterConfig(infra_failed=False).row_rules
    assert not cfg.refill.enabled


@pytest.mark.parametrize("kwargs,message", [
    (dict(overlong="cut"), r"model.filters.overlong='cut': choose one of \('none', 'mask', 'soft_penalty'\)"),
    (dict(void_repetition=True, void_repetition_threshold=1.0), r"void_repetition_threshold=1.0: must be in \(0, 1\)"),
    (dict(perplexity=True, perplexity_threshold=1.0), "model.filters.perplexity_threshold=1.0: must be > 1"),
    (dict(overlong="soft_penalty", overlong_buffer=0), "model.filters.overlong_buffer=0: must be >= 1"),
    (dict(overlong="soft_penalty", overlong_penalty=0.0), "model.filters.overlong_penalty=0.0: must be > 0"),
    (dict(roc=True, roc_correct_keep=1.5), r"model.filters.roc_correct_keep=1.5: must be in \[0, 1\]"),
])
def test_a_bad_value_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FilterConfig(**kwargs)


@pytest.mark.parametrize("kwargs,switch", [
    (dict(void_repetition_threshold=0.3), "void_repetition: true"),
    (dict(perplexity_threshold=4.0), "perplexity: true"),
    (dict(overlong="mask", overlong_buffer=256), "overlong: soft_penalty"),
    (dict(overlong_penalty=0.5), "overlong: soft_penalty"),
    (dict(roc_correct_keep=0.25), "roc: true"),
])
def test_a_threshold_of_a_rule_that_is_off_is_refused(kwargs, switch):
    name = next(k for k in kwargs if k != "overlong")
    with pytest.raises(ValueError, match=rf"model.filters.{name}=.* applies only with {switch}; set that, or remove"):
        FilterConfig(**kwargs)


def test_the_perplexity_rule_needs_a_reference_model():
    cfg = FilterConfig(perplexity=True)
    with pytest.raises(ValueError, match=r"model.filters.perplexity=true with model.rl.kl_coef=0: .* set "
                                         r"model.rl.kl_coef > 0 .* or model.filters.perplexity: false"):
        cfg.check_run(RLConfig(), SamplingConfig(), ToolConfig())
    cfg.check_run(RLConfig(kl_coef=0.01), SamplingConfig(), ToolConfig())  # a reference is loaded: fine


def test_the_soft_penalty_buffer_lies_inside_the_budget():
    cfg = FilterConfig(overlong="soft_penalty", overlong_buffer=512)
    with pytest.raises(ValueError, match=r"overlong_buffer=512 with model.sampling.max_response_tokens=512"):
        cfg.check_run(RLConfig(), SamplingConfig(max_response_tokens=512), ToolConfig())
    cfg.check_run(RLConfig(), SamplingConfig(max_response_tokens=1024), ToolConfig())


def test_the_block_rules_need_a_tool_and_an_output_marker():
    cfg = FilterConfig(shortcut=True, void_turn=True)
    with pytest.raises(ValueError, match=r"model.filters.shortcut/void_turn=true with model.tool.max_tool_calls=0"):
        cfg.check_run(RLConfig(), SamplingConfig(), ToolConfig(max_tool_calls=0))
    with pytest.raises(ValueError, match=r"an output block must open with a marker"):
        cfg.check_run(RLConfig(), SamplingConfig(), ToolConfig(output_template="{output}\n"))
    FilterConfig(overlong_wrong=True, void_repetition=True).check_run(RLConfig(), SamplingConfig(),
                                                                      ToolConfig(max_tool_calls=0))


REPO = Path(__file__).resolve().parents[2]


def test_the_command_line_checks_the_filters_before_the_toy_base_is_built(no_toy_build, tmp_path):
    with pytest.raises(ValueError, match=r"model.filters.perplexity=true with model.rl.kl_coef=0"):
        ZeroTIRCLI(args=["--config", str(REPO / "configs" / "toy_cpu.yaml"), "--model.filters.perplexity", "true",
                         "--model.base.path", str(tmp_path / "toy"), "--trainer.default_root_dir", str(tmp_path)],
                   run=False)


def test_help_lists_the_filters_with_their_meaning(fit_help):
    for words in ("--model.filters.void_turn", "(SimpleTIR)", "--model.filters.overlong_buffer",
                  "mask_truncated_completions", "--model.filters.roc_correct_keep", "GRPO-RoC"):
        assert words in fit_help, words
