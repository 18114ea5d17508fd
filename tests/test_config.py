"""The typed settings groups (zerotir.config): a bad value or a combination that cannot work fails at
construction, naming the field and the fix."""

from __future__ import annotations

from dataclasses import fields
from typing import get_args

import pytest

from zerotir.config import (Algorithm, HFRollout, HostsConfig, RLConfig, SamplingConfig, SandboxConfig, ToolConfig,
                            VLLMRollout)


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


def test_the_token_budget_replaces_micro_batch_size_and_both_long_response_settings_are_at_least_1():
    assert RLConfig(max_tokens_per_micro_batch=4096).max_tokens_per_micro_batch == 4096
    with pytest.raises(ValueError, match=r"max_tokens_per_micro_batch=4096 with micro_batch_size=2.*replaces"):
        RLConfig(max_tokens_per_micro_batch=4096, micro_batch_size=2)
    with pytest.raises(ValueError, match=r"model.rl.max_tokens_per_micro_batch=0: must be >= 1"):
        RLConfig(max_tokens_per_micro_batch=0)
    with pytest.raises(ValueError, match=r"model.rl.logprob_chunk_tokens=0: must be >= 1"):
        RLConfig(logprob_chunk_tokens=0)
    assert RLConfig(micro_batch_size=2).max_tokens_per_micro_batch is None  # the row count stays the default


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
        RLConfig(algorithm=algorithm).check_training_sampling(SamplingConfig(n=1))
    RLConfig(algorithm=algorithm).check_training_sampling(SamplingConfig(n=2))


def test_only_ppo_uses_a_critic():
    # The one place the module (critic loaded), the update (values, value loss) and the memory plan ask.
    assert [a for a in get_args(Algorithm) if RLConfig(algorithm=a).uses_critic] == ["ppo"]



def test_training_refuses_greedy_sampling_and_a_correction_under_nucleus_sampling():
    """The trainer scores the sampled tokens at model.sampling.temperature (0 has no distribution), and an off-policy
    correction needs engine log-probs of that same distribution (top_p < 1 truncates the engine's)."""
    with pytest.raises(ValueError, match=r"model.sampling.temperature=0.0: greedy decoding is for evaluation only"):
        RLConfig().check_training_sampling(SamplingConfig(temperature=0.0))
    with pytest.raises(ValueError, match=r"off_policy_correction='tis' with model.sampling.top_p=0.9.*top_p: 1.0 or "
                                         r"off_policy_correction: none"):
        RLConfig(off_policy_correction="tis").check_training_sampling(SamplingConfig(top_p=0.9))
    RLConfig().check_training_sampling(SamplingConfig(temperature=0.7, top_p=0.9))  # no correction: fine
    RLConfig(off_policy_correction="decoupled").check_training_sampling(SamplingConfig(temperature=0.7))

def test_combinations_that_work():
    RLConfig(algorithm="grpo", kl_coef=0.01, use_kl_loss=True)
    RLConfig(algorithm="grpo", kl_coef=0.01, grpo_kl_in_reward=True)
    RLConfig(algorithm="ppo", gae_injected="restart", dual_clip=None, loss_agg_mode="seq-mean-token-sum-norm")
    RLConfig(algorithm="reinforce_pp").check_training_sampling(SamplingConfig(n=1))  # no group baseline: n=1 is fine


@pytest.mark.parametrize(("hosts", "backend", "message"), [
    (HostsConfig(max_staleness=1), VLLMRollout(enable_sleep_mode=True), r"enable_sleep_mode=true: a colocated"),
    (HostsConfig(max_staleness=0), VLLMRollout(tensor_parallel_size=2), r"tensor_parallel_size=2"),
    # Both would set the thread host's decode threads.
    (HostsConfig(max_staleness=1, threads=3), HFRollout(num_threads=2),
     r"model.rollout.init_args.num_threads=2 with model.hosts.threads=3: both set the engine host's decode "
     r"threads; keep one"),
])
def test_a_thread_host_that_cannot_run_with_the_engine_is_a_config_error(hosts, backend, message):
    with pytest.raises(ValueError, match=message):
        hosts.check_backend(backend)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"threads": 2}, "threads=2"),
    ({"device": "cuda:1"}, "device='cuda:1'"),
    ({"threads": 1, "device": "cpu"}, "threads=1, device='cpu'"),
    ({"engines": 2, "max_in_flight": 8}, "engines=2, max_in_flight=8"),
])
def test_engine_host_settings_without_an_engine_host_are_an_error(kwargs, named):
    # max_staleness: null starts no engine host, so these would be silently ignored.
    with pytest.raises(ValueError, match=rf"model.hosts.{named} with model.hosts.max_staleness: null: engine host "
                                         r"settings, and the in-line run starts no engine host; set "
                                         r"model.hosts.max_staleness"):
        HostsConfig(**kwargs)


def test_hosts_settings_that_work():
    HostsConfig().check_backend(VLLMRollout(enable_sleep_mode=True))  # synchronous: sleeping is fine
    HostsConfig(max_staleness=2, device="cuda:1").check_backend(HFRollout())
    HostsConfig(max_staleness=1, device="cuda:1").check_backend(VLLMRollout())
    HostsConfig(max_staleness=1, threads=2).check_backend(HFRollout())
    HostsConfig().check_backend(HFRollout(num_threads=2))  # in line: the engine's own thread count applies
    HostsConfig(max_staleness=1).check_backend(HFRollout(num_threads=2))  # the thread host's engine's
    assert not HostsConfig().enabled and HostsConfig(max_staleness=0).enabled


@pytest.mark.parametrize("backend", [HFRollout, VLLMRollout])
def test_the_engines_take_their_defaults_from_the_config(backend):
    """Defaults live in zerotir.config only: every setting an engine shares with its model.rollout group defaults
    to the group's value."""
    import inspect

    from zerotir.rollout.hf_engine import HFEngine
    from zerotir.rollout.vllm_engine import VLLMEngine  # vllm itself is imported only when an engine is built

    engine = HFEngine if backend is HFRollout else VLLMEngine
    params = inspect.signature(engine).parameters
    group = backend()
    named = {n: p for n, p in params.items() if p.kind is not p.VAR_KEYWORD}  # not **llm_kwargs
    shared = [f.name for f in fields(group) if f.name in named]
    assert len(shared) >= 3, shared
    for name in shared:
        assert named[name].default == getattr(group, name), name


def test_an_asynchronous_schedule_turns_the_off_policy_correction_on_unless_it_is_set():
    """model.rl.off_policy_correction unset: "tis" at S >= 1 (tokens up to S versions old), "none" in line and at
    S = 0 (the in-line run's parameters, bit for bit); a value set by name, "none" too, is kept."""
    sampling = SamplingConfig()
    assert RLConfig().off_policy_correction is None
    assert RLConfig().for_run(1, sampling).off_policy_correction == "tis"
    assert RLConfig().for_run(3, sampling).off_policy_correction == "tis"
    assert RLConfig().for_run(0, sampling).off_policy_correction == "none"
    assert RLConfig().for_run(None, sampling).off_policy_correction == "none"
    assert RLConfig(off_policy_correction="none").for_run(1, sampling).off_policy_correction == "none"
    assert RLConfig(off_policy_correction="decoupled").for_run(2, sampling).off_policy_correction == "decoupled"
    with pytest.raises(ValueError, match=r"model.hosts.max_staleness=1 turns model.rl.off_policy_correction on "
                                         r"\('tis'.*top_p=0.9.*set top_p: 1.0, or model.rl.off_policy_correction: "
                                         r"none"):
        RLConfig().for_run(1, SamplingConfig(top_p=0.9))
    assert RLConfig().for_run(0, SamplingConfig(top_p=0.9)).off_policy_correction == "none"
    with pytest.raises(ValueError, match=r"greedy decoding is for evaluation only"):  # the sampling checks run too
        RLConfig().for_run(None, SamplingConfig(temperature=0.0))


def test_the_vllm_engine_group_takes_the_actors_adapter_rank_and_refuses_another():
    """``model.rollout.init_args.lora_rank`` is derived from ``model.base.lora.rank`` (``for_lora``): set on the vLLM
    group, which serves adapters of that rank; the transformers group takes any rank and stays as it is."""
    assert VLLMRollout().for_lora(8).lora_rank == 8
    assert VLLMRollout().for_lora(None).lora_rank is None
    assert VLLMRollout(lora_rank=8).for_lora(8) == VLLMRollout(lora_rank=8)
    assert HFRollout().for_lora(8) == HFRollout()
    with pytest.raises(ValueError, match=r"lora_rank=4 but model.base.lora.rank=8: .*drop model.rollout.init_args"):
        VLLMRollout(lora_rank=4).for_lora(8)
    with pytest.raises(ValueError, match=r"lora_rank=4 but model.base.lora is not set"):
        VLLMRollout(lora_rank=4).for_lora(None)
    with pytest.raises(ValueError, match=r"rollout.init_args.lora_rank=0"):
        VLLMRollout(lora_rank=0)


def test_sandbox_urls_that_no_tool_would_use_are_refused_where_the_group_is_built():
    """Servers named in ``model.tool.sandbox.urls`` with no python tool among the run's tools (a calculator-only run;
    the no-tool baseline has its own message) would never be called: an error naming the field, not a setting
    silently unused."""
    urls = SandboxConfig(urls=["http://127.0.0.1:9"])
    with pytest.raises(ValueError, match=r"model.tool.sandbox.urls=\['http://127.0.0.1:9'\] but the tools of "
                                         r"model.tool include no python tool.*drop model.tool.sandbox.urls"):
        ToolConfig(tools=[{"class_path": "calculator"}], format="hermes", sandbox=urls)
    with pytest.raises(ValueError, match=r"model.tool.sandbox.urls is set but model.tool.max_tool_calls=0"):
        ToolConfig(max_tool_calls=0, sandbox=urls)
    assert ToolConfig(sandbox=urls).sandbox.urls == ["http://127.0.0.1:9"]  # the default tools: python
