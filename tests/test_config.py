"""The typed settings groups (zerotir.config): a bad value or a combination that cannot work fails at
construction, naming the field and the fix."""

from __future__ import annotations

import pytest

from zerotir.config import HFRollout, PipelineConfig, RLConfig, SamplingConfig, VLLMRollout


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="algorithm='dpo'"):
        RLConfig(algorithm="dpo")
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        RLConfig(micro_batch_size=0)
    with pytest.raises(ValueError, match="kl_estimator='k9'"):
        RLConfig(kl_estimator="k9")
    for kwargs, message in [
        (dict(loss_agg_mode="sum"), "loss_agg_mode='sum'"),
        (dict(gae_injected="drop"), "gae_injected='drop'"),
        (dict(dual_clip=1.0), "dual_clip=1.0: the lower bound c must be > 1"),
        (dict(whiten_eps=0.0), "whiten_eps=0.0: must be > 0"),
        (dict(grpo_std_eps=-1.0), "grpo_std_eps=-1.0: must be > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            RLConfig(**kwargs)
    with pytest.raises(ValueError, match="max_response_tokens=0"):  # the Dr. GRPO divisor is model.sampling's
        SamplingConfig(max_response_tokens=0)


@pytest.mark.parametrize("kwargs,message", [
    # GRPO's KL nowhere: both fields and the fixes are named
    (dict(algorithm="grpo", kl_coef=0.01), "algorithm=grpo with kl_coef=0.01 and use_kl_loss=false.*use_kl_loss: true"
                                           ".*grpo_kl_in_reward: true.*kl_coef: 0"),
    (dict(algorithm="rloo", kl_coef=0.01, grpo_kl_in_reward=True), "grpo_kl_in_reward=true with algorithm=rloo"),
    (dict(algorithm="grpo", kl_coef=0.01, use_kl_loss=True, grpo_kl_in_reward=True), "only applies to"),
    (dict(algorithm="reinforce_pp", gae_injected="restart"), "GAE is only used by algorithm=ppo"),
])
def test_combinations_that_cannot_work_are_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**kwargs)


@pytest.mark.parametrize("algorithm,message", [
    ("reinforce_baseline", "model.sampling.n=1: its baseline is the other samples"),
    ("rloo", "algorithm=rloo with model.sampling.n=1"),
    ("grpo", "set model.sampling.n >= 2"),
])
def test_group_baselines_need_two_samples_per_prompt(algorithm, message):
    # A cross-group check (model.rl with model.sampling), run by the CLI and the module.
    with pytest.raises(ValueError, match=message):
        RLConfig(algorithm=algorithm).check_samples(1)
    RLConfig(algorithm=algorithm).check_samples(2)


def test_combinations_that_work():
    RLConfig(algorithm="grpo", kl_coef=0.01, use_kl_loss=True)
    RLConfig(algorithm="grpo", kl_coef=0.01, grpo_kl_in_reward=True)
    RLConfig(algorithm="ppo", gae_injected="restart", dual_clip=None, loss_agg_mode="seq-mean-token-sum-norm")
    RLConfig(algorithm="reinforce_pp").check_samples(1)  # no group baseline: one sample per prompt is fine


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_staleness": -1}, r"model.pipeline.max_staleness=-1: must be >= 0"),
    ({"threads": 0}, r"model.pipeline.threads=0: must be >= 1"),
    ({"producer_timeout": 0}, r"model.pipeline.producer_timeout=0: must be > 0"),
])
def test_pipeline_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PipelineConfig(**kwargs)


@pytest.mark.parametrize(("pipeline", "backend", "message"), [
    (PipelineConfig(max_staleness=1), VLLMRollout(enable_sleep_mode=True), r"enable_sleep_mode=true: a colocated"),
    (PipelineConfig(max_staleness=0), VLLMRollout(tensor_parallel_size=2), r"tensor_parallel_size=2"),
])
def test_a_producer_that_cannot_run_with_the_engine_is_a_config_error(pipeline, backend, message):
    with pytest.raises(ValueError, match=message):
        pipeline.check_backend(backend)


def test_pipeline_settings_that_work():
    PipelineConfig().check_backend(VLLMRollout(enable_sleep_mode=True))  # synchronous: sleeping is fine
    PipelineConfig(max_staleness=2, producer_device="cuda:1").check_backend(HFRollout())
    PipelineConfig(max_staleness=1, producer_device="cuda:1").check_backend(VLLMRollout())
    assert not PipelineConfig().enabled and PipelineConfig(max_staleness=0).enabled
